// The one tokenizer of tessera's text forms: shard strategies "((2, 4), (4, 1))",
// tuples "(2, 4)", "(8,)", "(?, 32)" and layouts "[1.0, -] partial sum {1}" are all
// read through text_cursor, with overflow-safe numbers and errors that give the
// position. Standard library only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tessera/core/error.hpp>

namespace tessera {

/// A cursor over one text form. Spaces, tabs and line breaks between tokens are free.
/// Every error it raises reads `<fn>: <what> at character <i> in "<text>"`, i counting
/// bytes from 0:
///
///     parse_strategy: expected ',' or ')', found '4' at character 4 in "((2 4))"
///
/// The grammar's lists are bracketed and comma-separated, with an optional trailing
/// comma as Python prints one-element tuples: "()", "(8,)", "(2, 4)", "(2, 4,)".
///
///     text_cursor c("(2, 4)", "parse_mesh");
///     std::vector<std::int64_t> dims;
///     c.tuple([&](int) { dims.push_back(c.number("a mesh axis size", 1 << 30)); });
///     c.finish("tuple");
class text_cursor {
 public:
  text_cursor(std::string_view text, std::string_view fn) : s_(text), fn_(fn) {}

  std::string_view text() const { return s_; }
  /// Bytes read so far.
  std::size_t position() const { return pos_; }

  /// Throws `<fn>: <what> at character <position()> in "<text>"`.
  [[noreturn]] void fail(std::string_view what) const { fail_at(pos_, what); }
  /// As fail(), at character `pos`.
  [[noreturn]] void fail_at(std::size_t pos, std::string_view what) const {
    throw error(std::string(fn_) + ": " + std::string(what) + " at character " + std::to_string(pos) + " in \"" +
                std::string(s_) + "\"");
  }

  void skip_space() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  /// True when only spaces are left.
  bool done() {
    skip_space();
    return pos_ >= s_.size();
  }
  /// Skips spaces; true when the next character is c (not consumed).
  bool at(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  /// Skips spaces; true (and consumed) when the next character is c.
  bool accept(char c) {
    if (!at(c)) return false;
    ++pos_;
    return true;
  }
  /// Consumes c, or fails with "expected <what>, found <here()>".
  void expect(char c, std::string_view what) {
    if (!accept(c)) fail("expected " + std::string(what) + ", found " + here());
  }
  /// Skips spaces; true (and consumed) when the word `w` comes next, as a whole word
  /// (not followed by a letter, digit or '_').
  bool accept_word(std::string_view w) {
    skip_space();
    if (s_.substr(pos_, w.size()) != w) return false;
    const std::size_t end = pos_ + w.size();
    if (end < s_.size() && is_word(s_[end])) return false;
    pos_ = end;
    return true;
  }
  /// Skips spaces; true when a decimal digit comes next.
  bool at_digit() {
    skip_space();
    return pos_ < s_.size() && is_digit(s_[pos_]);
  }

  /// Reads a decimal integer in [0, limit] (limit >= 0), without ever overflowing:
  /// "expected <what>, found 'x'", "expected <what>, found the negative number -4",
  /// "expected <what> no larger than <limit>, found 3000000000" (at its first digit).
  std::int64_t number(std::string_view what, std::int64_t limit) {
    skip_space();
    const std::size_t start = pos_;
    if (pos_ + 1 < s_.size() && s_[pos_] == '-' && is_digit(s_[pos_ + 1])) {
      std::size_t end = pos_ + 1;
      while (end < s_.size() && is_digit(s_[end])) ++end;
      fail_at(start, "expected " + std::string(what) + ", found the negative number " +
                         std::string(s_.substr(start, end - start)));
    }
    if (!at_digit()) fail("expected " + std::string(what) + ", found " + here());
    std::int64_t v = 0;
    bool too_large = false;
    for (; pos_ < s_.size() && is_digit(s_[pos_]); ++pos_) {
      const int d = s_[pos_] - '0';
      if (too_large || v > limit / 10 || (v == limit / 10 && d > limit % 10)) too_large = true;
      else v = v * 10 + d;
    }
    if (too_large)
      fail_at(start, "expected " + std::string(what) + " no larger than " + std::to_string(limit) + ", found " +
                         std::string(s_.substr(start, pos_ - start)));
    return v;
  }

  /// Reads `open`, then entries separated by ',' (an optional trailing comma) up to
  /// `close`; entry(i) reads entry i. Returns the number of entries.
  template <class Entry>
  int list(char open, char close, Entry&& entry) {
    expect(open, quoted(open));
    int n = 0;
    if (accept(close)) return n;
    const std::string sep = "',' or " + quoted(close);
    while (true) {
      entry(n);
      ++n;
      if (accept(close)) return n;
      expect(',', sep);
      if (accept(close)) return n;  // a trailing comma, as in "(8,)"
    }
  }
  /// A tuple: list('(', ')', entry); with `square_too`, "[...]" as well (closed by
  /// the bracket that opened it).
  template <class Entry>
  int tuple(Entry&& entry, bool square_too = false) {
    if (square_too && at('[')) return list('[', ']', entry);
    if (square_too && !at('(')) fail("expected '(' or '[', found " + here());
    return list('(', ')', entry);
  }

  /// Fails with "unexpected <here()> after the <what>" unless only spaces are left.
  void finish(std::string_view what) {
    if (!done()) fail("unexpected " + here() + " after the " + std::string(what));
  }

  /// The next character for a message: "'x'", "the end", or "byte 0x0a" when it is
  /// not printable.
  std::string here() const {
    if (pos_ >= s_.size()) return "the end";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7f) return std::string("'") + char(c) + "'";
    static constexpr char hex[] = "0123456789abcdef";
    return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
  }

 private:
  static constexpr bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  static constexpr bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static constexpr bool is_word(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  static std::string quoted(char c) { return std::string("'") + c + "'"; }

  std::string_view s_;
  std::string_view fn_;
  std::size_t pos_ = 0;
};

}  // namespace tessera
