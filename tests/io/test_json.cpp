// Tests of io/json.hpp, the adapter over nlohmann/json: every kind of value parses and
// dumps back to an equal value (compact and indented, arrays of numbers on one line),
// strings keep their bytes through escapes, the strict parse rejects each kind of
// malformed input (duplicate keys, trailing garbage, truncation, nesting, NUL bytes)
// with a tessera::error naming the document, the position and the reason, and seeded
// random corruptions of valid documents either parse or throw tessera::error.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>
#include <tessera/io/json.hpp>

namespace io_test_json {  // the file's own scope in its test group's translation unit

using namespace tessera;
namespace json = tessera::io::json;

namespace {

std::string parse_error(std::string_view text, std::string_view context = "doc") {
  try {
    (void)json::parse(text, context);
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* const sample =
    R"({"a": [1, -2, 3.5, -0.25e-3, 1E+2, true, false, null], "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00y",)"
    R"( "nested": {"deep": [[[]], {}], "k": "v"}, "big": 18446744073709551615, "huge": 18446744073709551616,)"
    R"( "neg": -9223372036854775808, "top": 9223372036854775807})";

}  // namespace

TEST_CASE("json: values of every kind parse to what they say") {
  const json::value v = json::parse(sample);
  REQUIRE(v.is_object());
  CHECK(v.size() == 7);
  const json::value& a = v.at("a");
  REQUIRE(a.size() == 8);
  CHECK(json::to_int64(a[0]) == 1);
  CHECK(json::to_int64(a[1]) == -2);
  CHECK(a[2].get<double>() == 3.5);
  CHECK(json::kind_name(a[2]) == "a number");
  CHECK(json::to_int64(a[2]) == std::nullopt);
  CHECK(a[3].get<double>() == -0.25e-3);
  CHECK(a[4].get<double>() == 100.0);
  CHECK(json::kind_name(a[4]) == "a number");  // an exponent makes a number, not an integer
  CHECK(a[5].get<bool>());
  CHECK(!a[6].get<bool>());
  CHECK(a[7].is_null());
  CHECK(v.at("s").get<std::string>() == "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80y");
  CHECK(v.at("nested").at("deep")[0][0].empty());
  CHECK(v.at("nested").at("k").get<std::string>() == "v");
  // 64-bit limits: an unsigned integer up to 2^64 - 1, beyond that a double
  CHECK(json::kind_name(v.at("big")) == "an integer");
  CHECK(json::to_int64(v.at("big")) == std::nullopt);
  CHECK(v.at("big").get<std::uint64_t>() == 18446744073709551615ull);
  CHECK(json::kind_name(v.at("huge")) == "a number");
  CHECK(json::to_int64(v.at("neg")) == INT64_MIN);
  CHECK(json::to_int64(v.at("top")) == INT64_MAX);
  CHECK(v.find("missing") == v.end());
  CHECK(json::kind_name(v) == "an object");
  CHECK(json::kind_name(a) == "an array");
  CHECK(json::kind_name(v.at("s")) == "a string");
  CHECK(json::kind_name(a[5]) == "a boolean");
  CHECK(json::kind_name(a[7]) == "null");
  CHECK(json::to_int64(json::value("1")) == std::nullopt);
  CHECK(json::to_int64(json::value(true)) == std::nullopt);
  // a byte order mark before the value is skipped, as RFC 8259 allows
  CHECK(json::parse("\xef\xbb\xbf[1]") == json::value::array({1}));
}

TEST_CASE("json: dump then parse gives the same value, compact and indented") {
  const json::value v = json::parse(sample);
  CHECK(json::parse(json::dump(v)) == v);
  CHECK(json::parse(json::dump(v, 2)) == v);
  CHECK(json::parse(json::dump(v, 0)) == v);
  // canonical compact text is a fixed point
  CHECK(json::dump(json::parse(json::dump(v))) == json::dump(v));
  // ordered values keep their members in the order they were added
  json::ordered_value o = json::ordered_value::object();
  json::append_new(o, "dtype", "F32");
  json::append_new(o, "shape", json::ordered_value::array({2, 3}));
  CHECK(json::dump(o) == R"({"dtype":"F32","shape":[2,3]})");
  CHECK(json::dump(json::value(o)) == R"({"dtype":"F32","shape":[2,3]})");
  json::ordered_value p = json::ordered_value::object();
  json::append_new(p, "b", json::ordered_value::array({json::ordered_value::array({2, 4}), json::ordered_value::array({4, 1})}));
  json::append_new(p, "a", json::ordered_value::object());
  json::append_new(p, "c", json::ordered_value::array({1, json::ordered_value::object({{"k", "v"}})}));
  json::append_new(p, "d", json::ordered_value::array());
  // arrays holding no objects stay on one line; members one per line
  CHECK(json::dump(p, 2) ==
        "{\n  \"b\": [[2, 4], [4, 1]],\n  \"a\": {},\n  \"c\": [\n    1,\n    {\n      \"k\": \"v\"\n    }\n  ],\n"
        "  \"d\": []\n}");
  CHECK(json::dump(p) == R"({"b":[[2,4],[4,1]],"a":{},"c":[1,{"k":"v"}],"d":[]})");
  CHECK(json::dump(json::value(p)) == R"({"a":{},"b":[[2,4],[4,1]],"c":[1,{"k":"v"}],"d":[]})");  // sorted
  CHECK_THROWS_WITH_AS(json::append_new(o["shape"], "x", 1), "json: append_new needs an object, found an array", error);
  // doubles keep their kind and value
  for (double d : {0.1, -1e300, 5e-324, 1.0, 123456789.0, -0.0}) {
    const json::value back = json::parse(json::dump(json::value(d)));
    CHECK(json::kind_name(back) == "a number");
    CHECK(back.get<double>() == d);
  }
  CHECK_THROWS_WITH_AS(json::dump(json::value(1.0 / 0.0)), "json: cannot write a non-finite number (inf)", error);
  CHECK_THROWS_WITH_AS(json::dump(json::value::array({json::value("a\xff")})),
                       "json: cannot write the value: invalid UTF-8 byte at index 1: 0xFF", error);
}

TEST_CASE("json: every byte of a string survives dump and parse") {
  std::string all;
  for (int c = 1; c < 0x80; ++c) all += char(c);
  all += "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";  // é € 😀
  const std::string text = json::dump(json::value(all));
  CHECK(text.find('\n') == std::string::npos);
  CHECK(json::parse(text).get<std::string>() == all);
  CHECK(json::dump(json::value("\xc3\xa9/")) == "\"\xc3\xa9/\"");  // UTF-8 as it is, '/' unescaped
}

TEST_CASE("json: strict parsing rejects malformed input with the position and the reason") {
  const std::string value_expected = "syntax error while parsing value - ";
  CHECK(parse_error("{\"a\" 1}") ==
        "doc: invalid JSON at byte 5 (line 1, column 6): syntax error while parsing object separator - unexpected "
        "number literal; expected ':'");
  CHECK(parse_error("{\"a\": 1,}") ==
        "doc: invalid JSON at byte 8 (line 1, column 9): syntax error while parsing object key - unexpected '}'; "
        "expected string literal");
  CHECK(parse_error("[1, 2,]") == "doc: invalid JSON at byte 6 (line 1, column 7): " + value_expected +
                                      "unexpected ']'; expected '[', '{', or a literal");
  CHECK(parse_error("[1 2]") ==
        "doc: invalid JSON at byte 3 (line 1, column 4): syntax error while parsing array - unexpected number "
        "literal; expected ']'");
  CHECK(parse_error("01") == "doc: invalid JSON at byte 1 (line 1, column 2): " + value_expected +
                                 "unexpected number literal; expected end of input");
  CHECK(parse_error("1e999") == "doc: invalid JSON at byte 4 (line 1, column 5): number overflow parsing '1e999'");
  CHECK(parse_error("NaN") == "doc: invalid JSON at byte 0 (line 1, column 1): " + value_expected +
                                  "invalid literal; last read: 'N'");
  CHECK(parse_error("'a'") == "doc: invalid JSON at byte 0 (line 1, column 1): " + value_expected +
                                  "invalid literal; last read: '''");
  CHECK(parse_error("[1] // c") == "doc: invalid JSON at byte 4 (line 1, column 5): " + value_expected +
                                       "invalid literal; last read: '1] /'; expected end of input");
  CHECK(parse_error("\"a\nb\"") ==
        "doc: invalid JSON at byte 2 (line 1, column 3): " + value_expected +
            "invalid string: control character U+000A (LF) must be escaped to \\u000A or \\n; last read: '\"a<U+000A>'");
  CHECK(parse_error("\"\\x\"") == "doc: invalid JSON at byte 2 (line 1, column 3): " + value_expected +
                                       "invalid string: forbidden character after backslash; last read: '\"\\x'");
  CHECK(parse_error("\"\\udc00\"") ==
        "doc: invalid JSON at byte 6 (line 1, column 7): " + value_expected +
            "invalid string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF; last read: '\"\\udc00'");
  CHECK(parse_error("\"\xff\"").find("doc: invalid JSON at byte 1 (line 1, column 2): " + value_expected +
                                      "invalid string: ill-formed UTF-8 byte") == 0);
  for (const char* bad_utf8 : {"\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xe2\x82\""})  // overlong, surrogate, cut short
    CHECK(parse_error(bad_utf8).find("ill-formed UTF-8 byte") != std::string::npos);
  // lines and columns count from 1, bytes from 0
  CHECK(parse_error("{\n  \"a\": 1,\n  \"b\" 2\n}") ==
        "doc: invalid JSON at byte 18 (line 3, column 7): syntax error while parsing object separator - unexpected "
        "number literal; expected ':'");
  // without a context, messages start with "json"
  CHECK(parse_error("[", "") == "json: invalid JSON at byte 1 (line 1, column 2): " + value_expected +
                                     "unexpected end of input; expected '[', '{', or a literal");
}

TEST_CASE("json: duplicate keys, trailing garbage and truncated input are errors naming the document") {
  // duplicate keys, which nlohmann would accept (keeping the last), at any depth
  CHECK(parse_error("{\"a\": 1, \"a\": 2}", "f.json") ==
        "f.json: invalid JSON at byte 11 (line 1, column 12): duplicate object key \"a\"");
  CHECK(parse_error("{\"x\": [{\"k\": 1, \"j\": 2, \"k\": 3}]}", "f.json") ==
        "f.json: invalid JSON at byte 26 (line 1, column 27): duplicate object key \"k\"");
  CHECK(parse_error("{\"\\u0061\": 1, \"a\": 2}", "f.json") ==  // the same key, escaped once
        "f.json: invalid JSON at byte 16 (line 1, column 17): duplicate object key \"a\"");
  CHECK(parse_error("{\"a\": {\"a\": 1}, \"b\": {\"a\": 2}}") == "(no error)");  // one key per object
  // trailing garbage
  CHECK(parse_error("{} x", "f.json") == "f.json: invalid JSON at byte 3 (line 1, column 4): syntax error while "
                                           "parsing value - invalid literal; last read: '{} x'; expected end of input");
  CHECK(parse_error("{}{}", "f.json") == "f.json: invalid JSON at byte 2 (line 1, column 3): syntax error while "
                                          "parsing value - unexpected '{'; expected end of input");
  CHECK(parse_error("[1] \n ]", "f.json") == "f.json: invalid JSON at byte 6 (line 2, column 2): syntax error while "
                                               "parsing value - unexpected ']'; expected end of input");
  CHECK(parse_error("[1] \n ", "f.json") == "(no error)");
  // NUL bytes, which nlohmann's lexer reads as the end of the input
  CHECK(parse_error(std::string("[1]\0", 4), "f.json") ==
        "f.json: invalid JSON at byte 3 (line 1, column 4): unexpected NUL byte (JSON text holds none)");
  CHECK(parse_error(std::string("[1]\0garbage", 11), "f.json") ==
        "f.json: invalid JSON at byte 3 (line 1, column 4): unexpected NUL byte (JSON text holds none)");
  CHECK(parse_error(std::string("[\0]", 3), "f.json") ==
        "f.json: invalid JSON at byte 1 (line 1, column 2): unexpected NUL byte (JSON text holds none)");
  // truncated input: empty, and every proper prefix of a document
  CHECK(parse_error("", "f.json") == "f.json: invalid JSON at byte 0 (line 1, column 1): syntax error while parsing "
                                      "value - unexpected end of input; expected '[', '{', or a literal");
  CHECK(parse_error("{\"x\":", "the safetensors header of m.safetensors") ==
        "the safetensors header of m.safetensors: invalid JSON at byte 5 (line 1, column 6): syntax error while "
        "parsing value - unexpected end of input; expected '[', '{', or a literal");
  CHECK(parse_error("\"abc", "f.json") == "f.json: invalid JSON at byte 4 (line 1, column 5): syntax error while "
                                          "parsing value - invalid string: missing closing quote; last read: '\"abc'");
  const std::string doc = R"({"a": [1, 2.5, "s\u00e9", true, null], "b": {"c": {}}})";
  for (std::size_t n = 0; n < doc.size(); ++n) {
    CAPTURE(n);
    const std::string e = parse_error(doc.substr(0, n), "f.json");
    CHECK(e.rfind("f.json: invalid JSON at byte ", 0) == 0);
  }
  CHECK(parse_error(doc, "f.json") == "(no error)");
}

TEST_CASE("json: nesting deeper than max_depth is an error, never a stack overflow") {
  CHECK_NOTHROW(json::parse(std::string(json::max_depth, '[') + std::string(json::max_depth, ']')));
  CHECK(parse_error(std::string(json::max_depth + 1, '[') + std::string(json::max_depth + 1, ']')) ==
        "doc: invalid JSON at byte 128 (line 1, column 129): nesting deeper than 128 levels");
  CHECK(parse_error(std::string(100000, '[')) ==
        "doc: invalid JSON at byte 128 (line 1, column 129): nesting deeper than 128 levels");
  std::string objects;
  for (int i = 0; i <= json::max_depth; ++i) objects += "{\"k\":";
  CHECK(parse_error(objects) == "doc: invalid JSON at byte 640 (line 1, column 641): nesting deeper than 128 levels");
}

TEST_CASE("json: seeded random corruptions either parse or throw tessera::error") {
  const std::string base = sample;
  std::mt19937 rng(20240611);
  const std::string alphabet = std::string("{}[]\",:\\0123456789.eE+-truefalsn \t\n\x01\x80\xc3\xff") + '\0';
  int parsed = 0, rejected = 0, other = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s = base;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % (s.size() + 1);
      switch (rng() % 5) {
        case 0: s.resize(pos); break;                                                      // truncate
        case 1: if (pos < s.size()) s[pos] = alphabet[rng() % alphabet.size()]; break;     // replace
        case 2: s.insert(s.begin() + std::ptrdiff_t(pos), alphabet[rng() % alphabet.size()]); break;  // insert
        case 3: if (pos < s.size()) s.erase(pos, 1 + rng() % 8); break;                   // delete
        case 4: s.insert(pos, s.substr(pos / 2, rng() % 16)); break;                      // duplicate a piece
      }
    }
    try {
      const json::value v = json::parse(s, "fuzz");
      ++parsed;
      CHECK(json::parse(json::dump(v)) == v);
      CHECK(json::parse(json::dump(v, 2)) == v);
    } catch (const error& e) {
      ++rejected;
      CHECK(std::string(e.what()).rfind("fuzz: invalid JSON at byte ", 0) == 0);
    } catch (...) {
      ++other;
    }
  }
  CHECK(other == 0);
  CHECK(parsed + rejected == 2000);
  CHECK(rejected > 1000);
  CHECK(parsed > 20);
}
}  // namespace io_test_json
