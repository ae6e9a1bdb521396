// JSON through nlohmann/json: a strict parse for untrusted files (checkpoint headers,
// strategy files) whose every error is a tessera::error naming the document and the
// position, and a writer that keeps arrays of numbers on one line.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include <tessera/core/error.hpp>

namespace tessera::io::json {

/// What parse() returns: nlohmann::json (object members sorted by key).
using value = nlohmann::json;
/// What writers build: nlohmann::ordered_json, whose objects keep their members in the
/// order they were added (a file reads in the order its fields are documented).
using ordered_value = nlohmann::ordered_json;

/// Deepest nesting of arrays and objects parse() accepts (deeper input is an error).
inline constexpr int max_depth = 128;

namespace detail {

// A pointer into the text that records, in *read, how far nlohmann's lexer has read:
// the strict builder reports its own errors (duplicate keys, nesting) at that byte.
class counting_iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  counting_iterator() = default;
  counting_iterator(const char* p, const char** read) : p_(p), read_(read) {}
  reference operator*() const { return *p_; }
  counting_iterator& operator++() {
    *read_ = ++p_;
    return *this;
  }
  counting_iterator operator++(int) {
    counting_iterator old = *this;
    ++*this;
    return old;
  }
  friend bool operator==(const counting_iterator& a, const counting_iterator& b) { return a.p_ == b.p_; }

 private:
  const char* p_ = nullptr;
  const char** read_ = nullptr;
};

// nlohmann's SAX events built into a value, stopping at a duplicate object key or at
// nesting deeper than max_depth (nlohmann keeps the last of duplicate keys, and its
// parser has no depth limit).
class strict_builder : public nlohmann::json_sax<value> {
 public:
  strict_builder(const char* text, const char* const* read) : text_(text), read_(read) {}

  bool null() override { return put(value(nullptr)); }
  bool boolean(bool b) override { return put(value(b)); }
  bool number_integer(number_integer_t v) override { return put(value(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(value(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(value(v)); }
  bool string(string_t& s) override { return put(value(std::move(s))); }
  bool binary(binary_t& b) override { return put(value::binary(std::move(b))); }
  bool start_object(std::size_t) override { return open(value::object()); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(value::array()); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (stack_.back()->contains(k)) return stop("duplicate object key " + value(k).dump());
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const value::exception& ex) override {
    // nlohmann counts bytes read from 1: the last byte read is at offset position - 1.
    offset_ = position > 0 ? position - 1 : 0;
    reason_ = ex.what();
    if (reason_.rfind("[json.exception.", 0) == 0) reason_.erase(0, reason_.find("] ") + 2);
    if (reason_.rfind("parse error", 0) == 0 && reason_.find(": ") != std::string::npos)
      reason_.erase(0, reason_.find(": ") + 2);
    return false;
  }

  value& result() { return root_; }
  std::size_t offset() const { return offset_; }
  const std::string& reason() const { return reason_; }

 private:
  bool put(value v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return true;
    }
    value& top = *stack_.back();
    if (top.is_array()) top.push_back(std::move(v));
    else top[key_] = std::move(v);
    return true;
  }
  bool open(value container) {
    if (stack_.size() >= std::size_t(max_depth))
      return stop("nesting deeper than " + std::to_string(max_depth) + " levels");
    value* slot = &root_;
    if (!stack_.empty()) {
      value& top = *stack_.back();
      if (top.is_array()) {
        top.push_back(std::move(container));
        slot = &top.back();
      } else {
        slot = &(top[key_] = std::move(container));
      }
    } else {
      root_ = std::move(container);
    }
    stack_.push_back(slot);  // stays valid: its parent gains no member until it closes
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  bool stop(std::string why) {
    const std::ptrdiff_t read = *read_ - text_;
    offset_ = read > 0 ? std::size_t(read - 1) : 0;
    reason_ = std::move(why);
    return false;
  }

  const char* text_;
  const char* const* read_;
  value root_;
  std::vector<value*> stack_;
  std::string key_;
  std::size_t offset_ = 0;
  std::string reason_;
};

template <class Json>
void write(std::string& out, const Json& v, int indent, int level);

inline void newline(std::string& out, int indent, int level) {
  out += '\n';
  out.append(std::size_t(indent) * std::size_t(level), ' ');
}

// Arrays holding no objects (numbers, or arrays of them: [[2, 4], [4, 1]]) stay on one
// line when indenting.
template <class Json>
bool flat(const Json& v) {
  if (v.is_object()) return false;
  if (v.is_array())
    for (const Json& x : v)
      if (!flat(x)) return false;
  return true;
}

template <class Json>
void write(std::string& out, const Json& v, int indent, int level) {
  if (v.is_number_float() && !std::isfinite(v.template get<double>()))
    throw error("json: cannot write a non-finite number (" + std::to_string(v.template get<double>()) + ")");
  if (v.is_array()) {
    const bool one_line = indent < 0 || flat(v);
    out += '[';
    bool first = true;
    for (const Json& x : v) {
      if (!first) out += one_line && indent >= 0 ? ", " : ",";
      first = false;
      if (!one_line) newline(out, indent, level + 1);
      write(out, x, indent, level + 1);
    }
    if (!one_line && !v.empty()) newline(out, indent, level);
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, x] : v.template get_ref<const typename Json::object_t&>()) {
      if (!first) out += ',';
      first = false;
      if (indent >= 0) newline(out, indent, level + 1);
      out += Json(k).dump(-1, ' ', false, Json::error_handler_t::strict);
      out += indent >= 0 ? ": " : ":";
      write(out, x, indent, level + 1);
    }
    if (indent >= 0 && !v.empty()) newline(out, indent, level);
    out += '}';
  } else {
    out += v.dump(-1, ' ', false, Json::error_handler_t::strict);
  }
}

}  // namespace detail

/// Parses one JSON document strictly (RFC 8259 through nlohmann/json): comments,
/// trailing commas, NaN, invalid UTF-8 and anything after the value are rejected, and
/// beyond nlohmann's own rules so are duplicate object keys, nesting deeper than
/// max_depth and NUL bytes (which nlohmann's lexer reads as the end of the input). A
/// UTF-8 byte order mark before the value is skipped. Every error is a tessera::error
/// that starts with `context` (the file, say) and gives the byte offset (from 0), the
/// line and column (from 1) and the reason, nlohmann's where it found the error (a
/// duplicate key is reported at its closing quote, too deep a nesting at its bracket):
///
///     model.safetensors: header: invalid JSON at byte 5 (line 1, column 6): syntax error
///     while parsing value - unexpected end of input; expected '[', '{', or a literal
///
/// Integers become number_integer (negative) or number_unsigned; those beyond 64 bits,
/// and numbers with a fraction or exponent, number_float.
inline value parse(std::string_view text, std::string_view context = {}) {
  const char* read = text.data();
  detail::strict_builder sax(text.data(), &read);
  const bool ok = value::sax_parse(detail::counting_iterator(text.data(), &read),
                                   detail::counting_iterator(text.data() + text.size(), &read), &sax,
                                   value::input_format_t::json, /*strict=*/true, /*ignore_comments=*/false);
  // nlohmann's lexer takes a NUL byte for the end of the input, so a document with one
  // would be read only up to it.
  const std::size_t nul = text.find('\0');
  if (ok && nul == std::string_view::npos) return std::move(sax.result());
  std::size_t at = ok ? nul : std::min(sax.offset(), text.size());
  std::string reason = sax.reason();
  if (nul <= at) {
    at = nul;
    reason = "unexpected NUL byte (JSON text holds none)";
  }
  std::size_t line = 1, line_start = 0;
  for (std::size_t i = 0; i < at; ++i)
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  throw error((context.empty() ? std::string("json") : std::string(context)) + ": invalid JSON at byte " +
              std::to_string(at) + " (line " + std::to_string(line) + ", column " + std::to_string(at - line_start + 1) +
              "): " + reason);
}

/// Writes `v` (a value or an ordered_value) as JSON text: compact when `indent` < 0,
/// else one object member per line, indented by `indent` spaces per level, with
/// arrays that hold no objects on one line ("[[2, 4], [4, 1]]"). Strings are written
/// as UTF-8 with '"', '\\' and control characters escaped. A string that is not valid
/// UTF-8, or a non-finite number, is an error.
template <class Json>
std::string dump(const Json& v, int indent = -1) {
  std::string out;
  try {
    detail::write(out, v, indent, 0);
  } catch (const typename Json::exception& e) {
    std::string why = e.what();
    if (why.rfind("[json.exception.", 0) == 0) why.erase(0, why.find("] ") + 2);
    throw error("json: cannot write the value: " + why);
  }
  return out;
}

/// A value's kind for messages: "null", "a boolean", "an integer", "a number" (one
/// with a fraction or exponent, or beyond 64 bits), "a string", "an array", "an object".
template <class Json>
std::string_view kind_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "binary data";
}

/// The integer `v` holds when it is one that fits in 64 signed bits; nullopt for any
/// other value (2^63 and beyond, 1.0, "1", ...).
template <class Json>
std::optional<std::int64_t> to_int64(const Json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.template get<std::uint64_t>();
    if (u > std::uint64_t(INT64_MAX)) return std::nullopt;
    return std::int64_t(u);
  }
  if (v.is_number_integer()) return v.template get<std::int64_t>();
  return std::nullopt;
}

/// Appends member `key` to the ordered object `obj` without looking for it first: for
/// keys the caller knows are new (taken from a std::map, say), where obj[key] would
/// search every member.
inline void append_new(ordered_value& obj, std::string key, ordered_value v) {
  if (!obj.is_object()) throw error("json: append_new needs an object, found " + std::string(kind_name(obj)));
  obj.get_ref<ordered_value::object_t&>().emplace_back(std::move(key), std::move(v));
}

}  // namespace tessera::io::json
