// A small JSON value, a strict parser (RFC 8259) and a writer: what checkpoint
// headers and strategy files need, with the standard library only.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>

namespace tessera::io::json {

/// The kinds of JSON value. Numbers written without a fraction or exponent that fit
/// in 64 bits are `integer`; every other number is `number` (a double).
enum class kind { null, boolean, integer, number, string, array, object };

constexpr std::string_view to_string(kind k) {
  switch (k) {
    case kind::null: return "null";
    case kind::boolean: return "a boolean";
    case kind::integer: return "an integer";
    case kind::number: return "a number";
    case kind::string: return "a string";
    case kind::array: return "an array";
    case kind::object: return "an object";
  }
  return "?";
}

/// A JSON value. Objects keep their members in insertion order and have unique
/// keys (the parser rejects duplicates; set() replaces).
///
///     json::value v = json::value::object_of({{"dtype", "F32"}, {"shape", json::value::array_of({2, 3})}});
///     json::dump(v) == R"({"dtype":"F32","shape":[2,3]})"
class value {
 public:
  value() = default;
  value(std::nullptr_t) {}
  value(bool b) : kind_(kind::boolean), int_(b ? 1 : 0) {}
  value(int i) : kind_(kind::integer), int_(i) {}
  value(long i) : kind_(kind::integer), int_(std::int64_t(i)) {}
  value(long long i) : kind_(kind::integer), int_(std::int64_t(i)) {}
  value(unsigned u) : kind_(kind::integer), int_(u) {}
  value(unsigned long u) : value(static_cast<unsigned long long>(u)) {}
  value(unsigned long long u) : kind_(kind::integer), int_(std::int64_t(u)) {
    if (u > 0x7fffffffffffffffull) throw error("json: integer " + std::to_string(u) + " exceeds 2^63 - 1");
  }
  value(double d) : kind_(kind::number), num_(d) {}
  value(std::string s) : kind_(kind::string), str_(std::move(s)) {}
  value(std::string_view s) : kind_(kind::string), str_(s) {}
  value(const char* s) : kind_(kind::string), str_(s) {}

  /// An array of the given values.
  static value array_of(std::initializer_list<value> items = {}) {
    value v;
    v.kind_ = kind::array;
    v.items_.assign(items.begin(), items.end());
    return v;
  }
  /// An empty array.
  static value array() { return array_of({}); }
  /// An object with the given members (later duplicates replace earlier ones).
  static value object_of(std::initializer_list<std::pair<std::string_view, value>> members = {}) {
    value v;
    v.kind_ = kind::object;
    for (const auto& [k, x] : members) v.set(std::string(k), x);
    return v;
  }
  static value object() { return object_of({}); }

  kind type() const { return kind_; }
  bool is_null() const { return kind_ == kind::null; }
  bool is_bool() const { return kind_ == kind::boolean; }
  bool is_integer() const { return kind_ == kind::integer; }
  /// Integer or other number.
  bool is_number() const { return kind_ == kind::integer || kind_ == kind::number; }
  bool is_string() const { return kind_ == kind::string; }
  bool is_array() const { return kind_ == kind::array; }
  bool is_object() const { return kind_ == kind::object; }

  bool as_bool() const { return expect(kind::boolean), int_ != 0; }
  std::int64_t as_integer() const { return expect(kind::integer), int_; }
  double as_number() const {
    if (kind_ == kind::integer) return double(int_);
    return expect(kind::number), num_;
  }
  const std::string& as_string() const { return expect(kind::string), str_; }

  // ---- arrays and objects ----
  /// Number of array items or object members.
  std::size_t size() const {
    if (kind_ != kind::array && kind_ != kind::object) expect(kind::array);
    return items_.size();
  }
  /// Array item i.
  const value& operator[](std::size_t i) const {
    expect(kind::array);
    if (i >= items_.size())
      throw error("json: array index " + std::to_string(i) + " out of range, array has " +
                  std::to_string(items_.size()) + " items");
    return items_[i];
  }
  const std::vector<value>& items() const { return expect(kind::array), items_; }
  void push_back(value v) {
    expect(kind::array);
    items_.push_back(std::move(v));
  }

  /// Object member keys, in order (members(i) pairs keys()[i] with items()[i]).
  const std::vector<std::string>& keys() const { return expect(kind::object), keys_; }
  /// The value of object member i.
  const value& member(std::size_t i) const { return expect(kind::object), items_.at(i); }
  /// The member named `key`, or nullptr.
  const value* find(std::string_view key) const {
    expect(kind::object);
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] == key) return &items_[i];
    return nullptr;
  }
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  /// The member named `key`; throws when there is none.
  const value& at(std::string_view key) const {
    if (const value* v = find(key)) return *v;
    throw error("json: object has no member \"" + std::string(key) + "\"");
  }
  /// Appends member `key`, which the caller guarantees is not present yet (keys taken
  /// from a std::map, say): constant time, where set() searches the members.
  void append_new(std::string key, value v) {
    expect(kind::object);
    keys_.push_back(std::move(key));
    items_.push_back(std::move(v));
  }
  /// Sets member `key` (replacing an existing one, keeping its position).
  void set(std::string key, value v) {
    expect(kind::object);
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] == key) {
        items_[i] = std::move(v);
        return;
      }
    keys_.push_back(std::move(key));
    items_.push_back(std::move(v));
  }

  friend bool operator==(const value& a, const value& b) {
    if (a.kind_ != b.kind_) return false;
    switch (a.kind_) {
      case kind::null: return true;
      case kind::boolean:
      case kind::integer: return a.int_ == b.int_;
      case kind::number: return a.num_ == b.num_;
      case kind::string: return a.str_ == b.str_;
      case kind::array: return a.items_ == b.items_;
      case kind::object: return a.keys_ == b.keys_ && a.items_ == b.items_;
    }
    return false;
  }

 private:
  friend class parser;
  void expect(kind k) const {
    if (kind_ != k)
      throw error("json: expected " + std::string(to_string(k)) + ", found " + std::string(to_string(kind_)));
  }

  kind kind_ = kind::null;
  std::int64_t int_ = 0;
  double num_ = 0;
  std::string str_;
  std::vector<value> items_;       // array items, or object member values
  std::vector<std::string> keys_;  // object member keys
};

/// Deepest nesting of arrays and objects the parser accepts (deeper input is an error,
/// never a stack overflow).
inline constexpr int max_depth = 128;

/// The strict parser: RFC 8259 JSON, one value with optional whitespace around it.
/// Rejected, with the byte offset in the message: comments, trailing commas, single
/// quotes, leading zeros, NaN/Infinity, control characters and invalid UTF-8 in
/// strings, lone surrogates in \u escapes, duplicate object keys, nesting deeper than
/// max_depth, and anything after the value.
class parser {
 public:
  parser(std::string_view text, std::string_view context) : s_(text), ctx_(context) {}

  value parse_document() {
    skip_ws();
    value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected " + describe_here() + " after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw error((ctx_.empty() ? std::string("json") : std::string(ctx_)) + ": invalid JSON at byte " +
                std::to_string(pos_) + ": " + what);
  }
  std::string describe_here() const {
    if (pos_ >= s_.size()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7f) return std::string("character '") + char(c) + "'";
    static constexpr char hex[] = "0123456789abcdef";
    return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  value parse_value(int depth) {
    if (at_end()) fail("expected a value, found end of input");
    const char c = peek();
    if (c == '{') return parse_object(depth + 1);
    if (c == '[') return parse_array(depth + 1);
    if (c == '"') return value(parse_string());
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (literal("true")) return value(true);
    if (literal("false")) return value(false);
    if (literal("null")) return value(nullptr);
    fail("expected a value, found " + describe_here());
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  void check_depth(int depth) const {
    if (depth > max_depth) fail("nesting deeper than " + std::to_string(max_depth) + " levels");
  }

  value parse_object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    value obj = value::object();
    std::unordered_set<std::string> seen;
    skip_ws();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return obj;
    }
    while (true) {
      skip_ws();
      if (at_end() || peek() != '"') fail("expected '\"' to start an object key, found " + describe_here());
      const std::size_t key_pos = pos_;
      std::string key = parse_string();
      if (!seen.insert(key).second) {
        pos_ = key_pos;
        fail("duplicate object key \"" + key + "\"");
      }
      skip_ws();
      if (at_end() || peek() != ':') fail("expected ':' after an object key, found " + describe_here());
      ++pos_;
      skip_ws();
      value v = parse_value(depth);
      obj.keys_.push_back(std::move(key));
      obj.items_.push_back(std::move(v));
      skip_ws();
      if (at_end()) fail("expected ',' or '}' in an object, found end of input");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return obj;
      }
      fail("expected ',' or '}' in an object, found " + describe_here());
    }
  }

  value parse_array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    value arr = value::array();
    skip_ws();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return arr;
    }
    while (true) {
      skip_ws();
      arr.items_.push_back(parse_value(depth));
      skip_ws();
      if (at_end()) fail("expected ',' or ']' in an array, found end of input");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return arr;
      }
      fail("expected ',' or ']' in an array, found " + describe_here());
    }
  }

  value parse_number() {
    const std::size_t start = pos_;
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (at_end() || !(peek() >= '0' && peek() <= '9')) fail("expected a digit in a number, found " + describe_here());
    if (peek() == '0') {
      ++pos_;
      if (!at_end() && peek() >= '0' && peek() <= '9') fail("a number must not have a leading zero");
    } else {
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (!at_end() && peek() == '.') {
      integral = false;
      ++pos_;
      if (at_end() || !(peek() >= '0' && peek() <= '9')) fail("expected a digit after '.', found " + describe_here());
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (at_end() || !(peek() >= '0' && peek() <= '9'))
        fail("expected a digit in an exponent, found " + describe_here());
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral) {
      std::int64_t i = 0;
      const auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc() && r.ptr == last) return value(static_cast<long long>(i));
      // too large for 64 bits: kept as a double
    }
    double d = 0;
    const auto r = std::from_chars(first, last, d);
    if (r.ec != std::errc() || r.ptr != last || !std::isfinite(d)) {
      pos_ = start;
      fail("number " + std::string(first, last) + " is out of range");
    }
    return value(d);
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  std::uint32_t parse_hex4() {
    if (s_.size() - pos_ < 4) fail("a \\u escape needs four hex digits");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= std::uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= std::uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= std::uint32_t(c - 'A' + 10);
      else fail("expected a hex digit in a \\u escape, found " + describe_here());
      ++pos_;
    }
    return v;
  }

  // Length of the valid UTF-8 sequence starting at pos_ (a non-ASCII lead byte), or 0.
  std::size_t utf8_length() const {
    const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s_[pos_ + i]); };
    const std::size_t left = s_.size() - pos_;
    const unsigned char c = b(0);
    auto cont = [&](std::size_t i) { return i < left && (b(i) & 0xc0) == 0x80; };
    if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
      if (!cont(1) || !cont(2)) return 0;
      if (c == 0xe0 && b(1) < 0xa0) return 0;  // overlong
      if (c == 0xed && b(1) >= 0xa0) return 0;  // surrogate
      return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
      if (!cont(1) || !cont(2) || !cont(3)) return 0;
      if (c == 0xf0 && b(1) < 0x90) return 0;  // overlong
      if (c == 0xf4 && b(1) >= 0x90) return 0;  // above U+10FFFF
      return 4;
    }
    return 0;
  }

  std::string parse_string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("control character " + describe_here() + " in a string (it must be escaped)");
      if (c == '\\') {
        ++pos_;
        if (at_end()) fail("unterminated escape in a string");
        const char e = peek();
        ++pos_;
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            std::uint32_t cp = parse_hex4();
            if (cp >= 0xdc00 && cp <= 0xdfff) fail("a \\u escape holds a lone low surrogate");
            if (cp >= 0xd800 && cp <= 0xdbff) {
              if (s_.substr(pos_, 2) != "\\u") fail("a high surrogate must be followed by a \\u low surrogate");
              pos_ += 2;
              const std::uint32_t lo = parse_hex4();
              if (lo < 0xdc00 || lo > 0xdfff) fail("a high surrogate must be followed by a low surrogate");
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            append_utf8(out, cp);
            break;
          }
          default:
            --pos_;
            fail("invalid escape: backslash followed by " + describe_here());
        }
        continue;
      }
      if (c < 0x80) {
        out += char(c);
        ++pos_;
        continue;
      }
      const std::size_t n = utf8_length();
      if (n == 0) fail("invalid UTF-8 " + describe_here() + " in a string");
      out.append(s_.substr(pos_, n));
      pos_ += n;
    }
  }

  std::string_view s_;
  std::string_view ctx_;
  std::size_t pos_ = 0;
};

/// Parses one JSON document. `context` (a file name, say) starts every error message:
/// `model.safetensors: invalid JSON at byte 17: expected ':' after an object key, found character ','`.
inline value parse(std::string_view text, std::string_view context = {}) {
  return parser(text, context).parse_document();
}

namespace detail {

inline void dump_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

inline void newline(std::string& out, int indent, int level) {
  if (indent < 0) return;
  out += '\n';
  out.append(std::size_t(indent) * std::size_t(level), ' ');
}

// Arrays holding no objects (scalars, or arrays of them: [[2, 4], [4, 1]]) stay on one
// line even when indenting.
inline bool flat_array(const value& v) {
  for (const value& x : v.items())
    if (x.is_object() || (x.is_array() && !flat_array(x))) return false;
  return true;
}

inline void dump_value(std::string& out, const value& v, int indent, int level) {
  switch (v.type()) {
    case kind::null: out += "null"; return;
    case kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case kind::integer: out += std::to_string(v.as_integer()); return;
    case kind::number: {
      const double d = v.as_number();
      if (!std::isfinite(d)) throw error("json: cannot write a non-finite number (" + std::to_string(d) + ")");
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof buf, d);
      std::string s(buf, r.ptr);
      // keep it a number that reads back as a double, not an integer
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      out += s;
      return;
    }
    case kind::string: dump_string(out, v.as_string()); return;
    case kind::array: {
      out += '[';
      const bool flat = indent < 0 || flat_array(v);
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += flat && indent >= 0 ? ", " : ",";
        if (!flat) newline(out, indent, level + 1);
        dump_value(out, v[i], indent, level + 1);
      }
      if (!flat && v.size()) newline(out, indent, level);
      out += ']';
      return;
    }
    case kind::object: {
      out += '{';
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += ',';
        newline(out, indent, level + 1);
        dump_string(out, v.keys()[i]);
        out += indent >= 0 ? ": " : ":";
        dump_value(out, v.member(i), indent, level + 1);
      }
      if (v.size()) newline(out, indent, level);
      out += '}';
      return;
    }
  }
}

}  // namespace detail

/// Writes `v` as JSON: compact when `indent` < 0, else one member per line indented
/// by `indent` spaces per level (arrays without objects stay on one line). Strings are
/// written as UTF-8 with only '"', '\\' and control characters escaped. Throws for a
/// non-finite number.
inline std::string dump(const value& v, int indent = -1) {
  std::string out;
  detail::dump_value(out, v, indent, 0);
  return out;
}

}  // namespace tessera::io::json
