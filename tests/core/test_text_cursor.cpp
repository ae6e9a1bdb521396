// Tests of core/text_cursor.hpp, the tokenizer of every text form: numbers up to their
// limit and never past it (INT64_MAX included), negative numbers named as such,
// bracketed lists with optional trailing commas and matching closers, whole words,
// and the error text with the position.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>
#include <tessera/core/text_cursor.hpp>

namespace core_test_text_cursor {  // the file's own scope in its test group's translation unit

using namespace tessera;

namespace {

template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

std::int64_t read_number(std::string_view text, std::int64_t limit) {
  text_cursor c(text, "f");
  const std::int64_t v = c.number("a number", limit);
  c.finish("number");
  return v;
}

std::vector<std::int64_t> read_tuple(std::string_view text, bool square_too = false) {
  text_cursor c(text, "f");
  std::vector<std::int64_t> out;
  const int n = c.tuple([&](int i) {
    CHECK(i == int(out.size()));
    out.push_back(c.number("a number", 100));
  }, square_too);
  CHECK(n == int(out.size()));
  c.finish("tuple");
  return out;
}

}  // namespace

TEST_CASE("text_cursor: numbers up to the limit, never past it") {
  CHECK(read_number("0", 0) == 0);
  CHECK(read_number(" 42 ", 100) == 42);
  CHECK(read_number("0000000000000000000000000000007", 7) == 7);
  CHECK(read_number("100", 100) == 100);
  CHECK(thrown([] { read_number("101", 100); }) ==
        "f: expected a number no larger than 100, found 101 at character 0 in \"101\"");
  CHECK(thrown([] { read_number("1", 0); }) == "f: expected a number no larger than 0, found 1 at character 0 in \"1\"");
  // every limit at 64 bits: the largest value reads, one more does not, nor anything longer
  CHECK(read_number("9223372036854775807", INT64_MAX) == INT64_MAX);
  CHECK(thrown([] { read_number("9223372036854775808", INT64_MAX); }) ==
        "f: expected a number no larger than 9223372036854775807, found 9223372036854775808 at character 0 in "
        "\"9223372036854775808\"");
  CHECK(thrown([] { read_number("18446744073709551617", INT64_MAX); }).find("no larger than") != std::string::npos);
  CHECK(thrown([] { read_number(std::string(1000, '9'), INT64_MAX); }).find("no larger than") != std::string::npos);
  for (std::int64_t limit : {std::int64_t(9), std::int64_t(10), std::int64_t(99), std::int64_t(1) << 30,
                             std::int64_t(1) << 62}) {
    CAPTURE(limit);
    CHECK(read_number(std::to_string(limit), limit) == limit);
    CHECK(read_number(std::to_string(limit - 1), limit) == limit - 1);
    CHECK(!thrown([&] { read_number(std::to_string(limit + 1), limit); }).empty());
    CHECK(!thrown([&] { read_number(std::to_string(limit) + "0", limit); }).empty());
  }
  CHECK(thrown([] { read_number("-4", 100); }) ==
        "f: expected a number, found the negative number -4 at character 0 in \"-4\"");
  CHECK(thrown([] { read_number("-", 100); }) == "f: expected a number, found '-' at character 0 in \"-\"");
  CHECK(thrown([] { read_number("+4", 100); }) == "f: expected a number, found '+' at character 0 in \"+4\"");
  CHECK(thrown([] { read_number("", 100); }) == "f: expected a number, found the end at character 0 in \"\"");
  CHECK(thrown([] { read_number("\t", 100); }) == "f: expected a number, found the end at character 1 in \"\t\"");
  CHECK(thrown([] { read_number("4x", 100); }) == "f: unexpected 'x' after the number at character 1 in \"4x\"");
  CHECK(thrown([] { read_number("\x7f", 100); }) == "f: expected a number, found byte 0x7f at character 0 in \"\x7f\"");
}

TEST_CASE("text_cursor: tuples and lists") {
  CHECK(read_tuple("()").empty());
  CHECK(read_tuple("( )").empty());
  CHECK(read_tuple("(8)") == std::vector<std::int64_t>{8});
  CHECK(read_tuple("(8,)") == std::vector<std::int64_t>{8});
  CHECK(read_tuple("(2, 4)") == std::vector<std::int64_t>{2, 4});
  CHECK(read_tuple("(2, 4, )") == std::vector<std::int64_t>{2, 4});
  CHECK(read_tuple("[2, 4]", true) == std::vector<std::int64_t>{2, 4});
  CHECK(thrown([] { read_tuple("(,)"); }) == "f: expected a number, found ',' at character 1 in \"(,)\"");
  CHECK(thrown([] { read_tuple("(2,,)"); }) == "f: expected a number, found ',' at character 3 in \"(2,,)\"");
  CHECK(thrown([] { read_tuple("(2 4)"); }) == "f: expected ',' or ')', found '4' at character 3 in \"(2 4)\"");
  CHECK(thrown([] { read_tuple("(2, 4"); }) == "f: expected ',' or ')', found the end at character 5 in \"(2, 4\"");
  CHECK(thrown([] { read_tuple("(2, 4]", true); }) == "f: expected ',' or ')', found ']' at character 5 in \"(2, 4]\"");
  CHECK(thrown([] { read_tuple("[2, 4)", true); }) == "f: expected ',' or ']', found ')' at character 5 in \"[2, 4)\"");
  CHECK(thrown([] { read_tuple("[2, 4]"); }) == "f: expected '(', found '[' at character 0 in \"[2, 4]\"");
  CHECK(thrown([] { read_tuple("{2}", true); }) == "f: expected '(' or '[', found '{' at character 0 in \"{2}\"");
  CHECK(thrown([] { read_tuple("(2) (3)"); }) == "f: unexpected '(' after the tuple at character 4 in \"(2) (3)\"");
  text_cursor c("{a; b}", "g");
  std::vector<char> seen;
  CHECK_THROWS_WITH_AS(c.list('{', '}', [&](int) { seen.push_back(c.here()[1]); c.fail("stop"); }),
                       "g: stop at character 1 in \"{a; b}\"", error);
  CHECK(seen == std::vector<char>{'a'});
}

TEST_CASE("text_cursor: whole words, positions and fail_at") {
  text_cursor c("partial  sumx sum", "h");
  CHECK(c.accept_word("partial"));
  CHECK(c.position() == 7);
  CHECK_FALSE(c.accept_word("sum"));  // "sumx" is another word
  CHECK(c.position() == 9);
  CHECK(c.accept_word("sumx"));
  CHECK(c.accept_word("sum"));
  CHECK(c.done());
  CHECK_THROWS_WITH_AS(c.fail_at(3, "here"), "h: here at character 3 in \"partial  sumx sum\"", error);
  text_cursor d("a", "h");
  CHECK_FALSE(d.accept('b'));
  CHECK(d.at('a'));
  CHECK(d.position() == 0);
  CHECK_THROWS_WITH_AS(d.expect('b', "'b'"), "h: expected 'b', found 'a' at character 0 in \"a\"", error);
  CHECK(d.accept('a'));
  CHECK(d.here() == "the end");
}
}  // namespace core_test_text_cursor
