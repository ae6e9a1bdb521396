// Tests of io/json.hpp: every kind of value parses and dumps back to an equal value,
// strings keep their bytes through escapes, the strict parser rejects each kind of
// malformed input with its message (and the byte offset), and seeded random
// corruptions of valid documents either parse or throw tessera::error.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>
#include <tessera/io/json.hpp>

using namespace tessera;
namespace json = tessera::io::json;

namespace {

std::string parse_error(std::string_view text) {
  try {
    (void)json::parse(text, "doc");
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* const sample =
    R"({"a": [1, -2, 3.5, -0.25e-3, 1E+2, true, false, null], "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00y",)"
    R"( "nested": {"deep": [[[]], {}], "k": "v"}, "big": 18446744073709551615, "neg": -9223372036854775808})";

}  // namespace

TEST_CASE("json: values of every kind parse to what they say") {
  const json::value v = json::parse(sample);
  REQUIRE(v.is_object());
  CHECK(v.size() == 5);
  CHECK(v.keys() == std::vector<std::string>{"a", "s", "nested", "big", "neg"});
  const json::value& a = v.at("a");
  REQUIRE(a.size() == 8);
  CHECK(a[0].as_integer() == 1);
  CHECK(a[1].as_integer() == -2);
  CHECK(a[2].as_number() == 3.5);
  CHECK(!a[2].is_integer());
  CHECK(a[3].as_number() == -0.25e-3);
  CHECK(a[4].as_number() == 100.0);
  CHECK(!a[4].is_integer());
  CHECK(a[5].as_bool());
  CHECK(!a[6].as_bool());
  CHECK(a[7].is_null());
  CHECK(v.at("s").as_string() == "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80y");
  CHECK(v.at("nested").at("deep")[0][0].size() == 0);
  CHECK(v.at("nested").at("k").as_string() == "v");
  // beyond 64 bits: kept as a double
  CHECK(!v.at("big").is_integer());
  CHECK(v.at("big").as_number() == 18446744073709551615.0);
  CHECK(v.at("neg").as_integer() == INT64_MIN);
  CHECK(v.find("missing") == nullptr);
  CHECK_THROWS_WITH_AS(v.at("missing"), "json: object has no member \"missing\"", error);
  CHECK_THROWS_WITH_AS(v.at("a").as_string(), "json: expected a string, found an array", error);
}

TEST_CASE("json: dump then parse gives the same value, compact and indented") {
  const json::value v = json::parse(sample);
  CHECK(json::parse(json::dump(v)) == v);
  CHECK(json::parse(json::dump(v, 2)) == v);
  CHECK(json::parse(json::dump(v, 0)) == v);
  // canonical compact text is a fixed point
  CHECK(json::dump(json::parse(json::dump(v))) == json::dump(v));
  CHECK(json::dump(json::value::object_of({{"dtype", "F32"}, {"shape", json::value::array_of({2, 3})}})) ==
        R"({"dtype":"F32","shape":[2,3]})");
  CHECK(json::dump(json::value::object_of({{"a", json::value::array_of({1, 2})}, {"b", json::value::object()}}), 2) ==
        "{\n  \"a\": [1, 2],\n  \"b\": {}\n}");
  // doubles keep their kind and value
  for (double d : {0.1, -1e300, 5e-324, 1.0, 123456789.0, -0.0}) {
    const json::value back = json::parse(json::dump(json::value(d)));
    CHECK(!back.is_integer());
    CHECK(back.as_number() == d);
  }
  CHECK_THROWS_WITH_AS(json::dump(json::value(1.0 / 0.0)), "json: cannot write a non-finite number (inf)", error);
  CHECK_THROWS_WITH_AS(json::value(~0ull), "json: integer 18446744073709551615 exceeds 2^63 - 1", error);
}

TEST_CASE("json: every byte of a string survives dump and parse") {
  std::string all;
  for (int c = 1; c < 0x80; ++c) all += char(c);
  all += "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";  // é € 😀
  const std::string text = json::dump(json::value(all));
  CHECK(text.find('\n') == std::string::npos);
  CHECK(json::parse(text).as_string() == all);
}

TEST_CASE("json: strict parsing rejects malformed input with the offset and the reason") {
  CHECK(parse_error("") == "doc: invalid JSON at byte 0: expected a value, found end of input");
  CHECK(parse_error("{\"a\" 1}") == "doc: invalid JSON at byte 5: expected ':' after an object key, found character '1'");
  CHECK(parse_error("{\"a\": 1,}") == "doc: invalid JSON at byte 8: expected '\"' to start an object key, found character '}'");
  CHECK(parse_error("[1, 2,]") == "doc: invalid JSON at byte 6: expected a value, found character ']'");
  CHECK(parse_error("[1 2]") == "doc: invalid JSON at byte 3: expected ',' or ']' in an array, found character '2'");
  CHECK(parse_error("{\"a\": 1, \"a\": 2}") == "doc: invalid JSON at byte 9: duplicate object key \"a\"");
  CHECK(parse_error("01") == "doc: invalid JSON at byte 1: a number must not have a leading zero");
  CHECK(parse_error("1.") == "doc: invalid JSON at byte 2: expected a digit after '.', found end of input");
  CHECK(parse_error("1e") == "doc: invalid JSON at byte 2: expected a digit in an exponent, found end of input");
  CHECK(parse_error("-") == "doc: invalid JSON at byte 1: expected a digit in a number, found end of input");
  CHECK(parse_error("1e999") == "doc: invalid JSON at byte 0: number 1e999 is out of range");
  CHECK(parse_error("NaN") == "doc: invalid JSON at byte 0: expected a value, found character 'N'");
  CHECK(parse_error("'a'") == "doc: invalid JSON at byte 0: expected a value, found character '''");
  CHECK(parse_error("tru") == "doc: invalid JSON at byte 0: expected a value, found character 't'");
  CHECK(parse_error("{} x") == "doc: invalid JSON at byte 3: unexpected character 'x' after the JSON value");
  CHECK(parse_error("[1] // c") == "doc: invalid JSON at byte 4: unexpected character '/' after the JSON value");
  CHECK(parse_error("\"abc") == "doc: invalid JSON at byte 4: unterminated string");
  CHECK(parse_error("\"a\nb\"") == "doc: invalid JSON at byte 2: control character byte 0x0a in a string (it must be escaped)");
  CHECK(parse_error("\"\\x\"") == "doc: invalid JSON at byte 2: invalid escape: backslash followed by character 'x'");
  CHECK(parse_error("\"\\u12zz\"") == "doc: invalid JSON at byte 5: expected a hex digit in a \\u escape, found character 'z'");
  CHECK(parse_error("\"\\u12") == "doc: invalid JSON at byte 3: a \\u escape needs four hex digits");
  CHECK(parse_error("\"\\udc00\"") == "doc: invalid JSON at byte 7: a \\u escape holds a lone low surrogate");
  CHECK(parse_error("\"\\ud800x\"") == "doc: invalid JSON at byte 7: a high surrogate must be followed by a \\u low surrogate");
  CHECK(parse_error("\"\xff\"") == "doc: invalid JSON at byte 1: invalid UTF-8 byte 0xff in a string");
  CHECK(parse_error("\"\xc0\xaf\"") == "doc: invalid JSON at byte 1: invalid UTF-8 byte 0xc0 in a string");      // overlong
  CHECK(parse_error("\"\xed\xa0\x80\"") == "doc: invalid JSON at byte 1: invalid UTF-8 byte 0xed in a string");  // surrogate
  CHECK(parse_error("\"\xe2\x82\"") == "doc: invalid JSON at byte 1: invalid UTF-8 byte 0xe2 in a string");      // cut short
  CHECK(parse_error(std::string("[\0]", 3)) == "doc: invalid JSON at byte 1: expected a value, found byte 0x00");
  // nesting: max_depth levels parse, one more is an error (no stack overflow)
  CHECK_NOTHROW(json::parse(std::string(json::max_depth, '[') + std::string(json::max_depth, ']')));
  CHECK(parse_error(std::string(json::max_depth + 1, '[') + std::string(json::max_depth + 1, ']')) ==
        "doc: invalid JSON at byte 128: nesting deeper than 128 levels");
  CHECK(parse_error(std::string(100000, '[')) == "doc: invalid JSON at byte 128: nesting deeper than 128 levels");
}

TEST_CASE("json: seeded random corruptions either parse or throw tessera::error") {
  const std::string base = sample;
  std::mt19937 rng(20240611);
  const std::string alphabet = "{}[]\",:\\0123456789.eE+-truefalsn \t\n\x01\x80\xc3\xff";
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s = base;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % (s.size() + 1);
      switch (rng() % 4) {
        case 0: s.resize(pos); break;                                                      // truncate
        case 1: if (pos < s.size()) s[pos] = alphabet[rng() % alphabet.size()]; break;     // replace
        case 2: s.insert(s.begin() + std::ptrdiff_t(pos), alphabet[rng() % alphabet.size()]); break;  // insert
        case 3: if (pos < s.size()) s.erase(pos, 1 + rng() % 8); break;                   // delete
      }
    }
    try {
      const json::value v = json::parse(s);
      ++parsed;
      CHECK(json::parse(json::dump(v)) == v);
    } catch (const error&) {
      ++rejected;
    }
  }
  CHECK(parsed + rejected == 2000);
  CHECK(rejected > 1000);
}
