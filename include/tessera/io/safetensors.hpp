// The safetensors file format: an 8-byte little-endian header length N, N bytes of
// JSON header (name -> dtype, shape, data_offsets; "__metadata__" -> strings), then
// the raw little-endian data. Written atomically, read with every field validated.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/io/atomic_file.hpp>
#include <tessera/io/json.hpp>

namespace tessera::io {

// ---- element types ----------------------------------------------------------------

/// The element types of the safetensors format. BOOL, F16 and BF16 are read and
/// written as raw bytes only (tessera has no C++ element type for them); the others
/// map to float, double and the fixed-width integers (dtype_of<T>).
enum class dtype : std::uint8_t { boolean, u8, i8, u16, i16, u32, i32, u64, i64, f16, bf16, f32, f64 };

inline constexpr dtype all_dtypes[] = {dtype::boolean, dtype::u8,  dtype::i8,   dtype::u16, dtype::i16,
                                       dtype::u32,     dtype::i32, dtype::u64,  dtype::i64, dtype::f16,
                                       dtype::bf16,    dtype::f32, dtype::f64};

/// The format's name of a dtype: "F32", "I64", "BF16", ...
constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::boolean: return "BOOL";
    case dtype::u8: return "U8";
    case dtype::i8: return "I8";
    case dtype::u16: return "U16";
    case dtype::i16: return "I16";
    case dtype::u32: return "U32";
    case dtype::i32: return "I32";
    case dtype::u64: return "U64";
    case dtype::i64: return "I64";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
  }
  return "?";
}

/// Bytes per element.
constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::boolean:
    case dtype::u8:
    case dtype::i8: return 1;
    case dtype::u16:
    case dtype::i16:
    case dtype::f16:
    case dtype::bf16: return 2;
    case dtype::u32:
    case dtype::i32:
    case dtype::f32: return 4;
    case dtype::u64:
    case dtype::i64:
    case dtype::f64: return 8;
  }
  return 0;
}

/// The dtype named `name` ("F32"), or false.
constexpr bool parse_dtype(std::string_view name, dtype& out) {
  for (dtype t : all_dtypes)
    if (dtype_name(t) == name) {
      out = t;
      return true;
    }
  return false;
}

/// "BOOL, U8, I8, ..., F64": the dtype names, for error messages.
inline std::string dtype_names() {
  std::string s;
  for (dtype t : all_dtypes) {
    s += s.empty() ? "" : ", ";
    s += dtype_name(t);
  }
  return s;
}

namespace detail {
template <class T>
constexpr bool dependent_false = false;
}

/// The dtype of a C++ element type: float -> F32, double -> F64, std::int32_t -> I32, ...
template <class T>
constexpr dtype dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return dtype::f32;
  else if constexpr (std::is_same_v<U, double>) return dtype::f64;
  else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && std::is_signed_v<U>) {
    if constexpr (sizeof(U) == 1) return dtype::i8;
    else if constexpr (sizeof(U) == 2) return dtype::i16;
    else if constexpr (sizeof(U) == 4) return dtype::i32;
    else if constexpr (sizeof(U) == 8) return dtype::i64;
    else static_assert(detail::dependent_false<T>, "dtype_of: no safetensors dtype for this integer size");
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool>) {
    if constexpr (sizeof(U) == 1) return dtype::u8;
    else if constexpr (sizeof(U) == 2) return dtype::u16;
    else if constexpr (sizeof(U) == 4) return dtype::u32;
    else if constexpr (sizeof(U) == 8) return dtype::u64;
    else static_assert(detail::dependent_false<T>, "dtype_of: no safetensors dtype for this integer size");
  } else {
    static_assert(detail::dependent_false<T>,
                  "dtype_of: tessera stores float, double and 8- to 64-bit integers in safetensors files");
  }
}

/// Calls f(std::type_identity<T>{}) with the C++ element type of `t`; throws for BOOL,
/// F16 and BF16, which have none: "`context`: dtype BF16 has no C++ element type in tessera".
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f, std::string_view context = "visit_dtype") {
  switch (t) {
    case dtype::u8: return f(std::type_identity<std::uint8_t>{});
    case dtype::i8: return f(std::type_identity<std::int8_t>{});
    case dtype::u16: return f(std::type_identity<std::uint16_t>{});
    case dtype::i16: return f(std::type_identity<std::int16_t>{});
    case dtype::u32: return f(std::type_identity<std::uint32_t>{});
    case dtype::i32: return f(std::type_identity<std::int32_t>{});
    case dtype::u64: return f(std::type_identity<std::uint64_t>{});
    case dtype::i64: return f(std::type_identity<std::int64_t>{});
    case dtype::f32: return f(std::type_identity<float>{});
    case dtype::f64: return f(std::type_identity<double>{});
    default: break;
  }
  throw error(std::string(context) + ": dtype " + std::string(dtype_name(t)) +
              " has no C++ element type in tessera");
}

// ---- shapes -----------------------------------------------------------------------

/// "(2, 3)" for a shape given as a list of extents (any rank).
inline std::string shape_string(std::span<const index_t> shape) {
  std::string s = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    s += d ? ", " : "";
    s += std::to_string(shape[d]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

namespace detail {

/// Number of elements of `shape`, or -1 when it overflows 2^62 (or an extent is negative).
inline index_t checked_numel(std::span<const index_t> shape) {
  index_t n = 1;
  for (index_t e : shape) {
    if (e < 0) return -1;
    if (e != 0 && n > (index_t(1) << 62) / e) return -1;
    n *= e;
  }
  return n;
}

/// Converts elements of `elem` bytes between host order and little-endian, in place
/// (the same swap both ways; nothing to do on a little-endian host).
inline void swap_to_little_endian(std::span<std::byte> bytes, std::size_t elem) {
  if constexpr (std::endian::native == std::endian::little) {
    (void)bytes;
    (void)elem;
  } else {
    for (std::size_t i = 0; i + elem <= bytes.size(); i += elem) std::reverse(bytes.data() + i, bytes.data() + i + elem);
  }
}

}  // namespace detail

// ---- writing ----------------------------------------------------------------------

/// A tensor's entry in a file to be written: name, dtype and shape (any rank).
struct tensor_spec {
  std::string name;
  dtype type = dtype::f32;
  std::vector<index_t> shape;

  /// Bytes of data: elements x dtype_size (throws on overflow).
  std::uint64_t nbytes() const {
    const index_t n = detail::checked_numel(shape);
    if (n < 0) throw error("safetensors: tensor '" + name + "': shape " + shape_string(shape) + " is invalid or too large");
    return std::uint64_t(n) * dtype_size(type);
  }
};

namespace detail {

inline constexpr std::uint64_t max_header_bytes = 100'000'000;  // the format's own limit

/// The JSON header of `specs` with contiguous data offsets in the given order, padded
/// with spaces so that the data starts at a multiple of 8 bytes.
inline std::string make_header(std::span<const tensor_spec> specs, const std::map<std::string, std::string>& metadata,
                               const std::filesystem::path& file) {
  // A name or metadata string that is not valid UTF-8 cannot be written as JSON.
  auto text_of = [&](const json::ordered_value& v) {
    try {
      return json::dump(v);
    } catch (const error& e) {
      throw error("write_safetensors: " + file.string() + ": " + e.what());
    }
  };
  std::string text = "{";
  if (!metadata.empty()) text += "\"__metadata__\":" + text_of(json::ordered_value(metadata));
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const tensor_spec& s = specs[i];
    const std::string where = "write_safetensors: " + file.string() + ": tensor '" + s.name + "'";
    if (s.name.empty()) throw error("write_safetensors: " + file.string() + ": tensor " + std::to_string(i) + " has an empty name");
    if (s.name == "__metadata__") throw error(where + ": the name is reserved for the metadata");
    if (!names.insert(s.name).second) throw error(where + ": the name is used twice");
    json::ordered_value shape = json::ordered_value::array();
    for (index_t e : s.shape) {
      if (e < 0) throw error(where + ": shape " + shape_string(s.shape) + " has a negative extent");
      shape.push_back(std::int64_t(e));
    }
    const std::uint64_t n = s.nbytes();
    json::ordered_value entry = json::ordered_value::object();
    json::append_new(entry, "dtype", std::string(dtype_name(s.type)));
    json::append_new(entry, "shape", std::move(shape));
    json::append_new(entry, "data_offsets", json::ordered_value::array({offset, offset + n}));
    if (text.size() > 1) text += ',';
    text += text_of(json::ordered_value(s.name)) + ":" + text_of(entry);
    offset += n;
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > max_header_bytes)
    throw error("write_safetensors: " + file.string() + ": the header has " + std::to_string(text.size()) +
                " bytes, the format allows " + std::to_string(max_header_bytes));
  return text;
}

}  // namespace detail

/// Writes a safetensors file tensor by tensor: the constructor writes the header of
/// `specs` (contiguous data offsets, in their order) and `metadata`; the write calls
/// then append each tensor's data in order, and commit() makes the file appear under
/// its name (atomic_file). Holding one tensor at a time, it streams checkpoints
/// larger than memory. Each write belongs to one tensor: it must not run past the end
/// of the current one. Destroyed without commit(), it leaves no file.
///
///     safetensors_stream out("w.safetensors", {{"w", dtype::f32, {2, 3}}}, {{"note", "hello"}});
///     out.write(std::span<const float>(w));   // 6 floats
///     out.commit();
class safetensors_stream {
 public:
  safetensors_stream(const std::filesystem::path& file, std::vector<tensor_spec> specs,
                     const std::map<std::string, std::string>& metadata)
      : specs_(std::move(specs)), file_(file) {
    const std::string header = detail::make_header(specs_, metadata, file);
    unsigned char len[8];
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    file_.write(len, 8);
    file_.write(header.data(), header.size());
    for (const tensor_spec& sp : specs_) need_.push_back(sp.nbytes());
    advance();
  }

  /// Index of the tensor whose data comes next (specs().size() once all are complete).
  std::size_t current() const { return cur_; }
  const std::vector<tensor_spec>& specs() const { return specs_; }

  /// Appends elements of the current tensor, in host byte order (converted to
  /// little-endian). T must be its element type.
  template <class T>
  void write(std::span<const T> values) {
    if (cur_ < specs_.size() && dtype_of<T>() != specs_[cur_].type)
      fail("tensor '" + specs_[cur_].name + "' is " + std::string(dtype_name(specs_[cur_].type)) + ", written as " +
           std::string(dtype_name(dtype_of<T>())));
    write_host(std::as_bytes(values));
  }
  template <class T>
  void write(std::span<T> values) {
    write(std::span<const T>(values));
  }
  /// Appends elements of the current tensor given as host-order bytes of its dtype.
  void write_host(std::span<const std::byte> bytes) {
    if constexpr (std::endian::native == std::endian::little) {
      put(bytes);
    } else {
      if (bytes.empty()) return;
      check_room(bytes.size());
      std::vector<std::byte> tmp(bytes.begin(), bytes.end());
      detail::swap_to_little_endian(tmp, dtype_size(specs_[cur_].type));
      put(tmp);
    }
  }
  /// Appends bytes already in little-endian order.
  void write_little_endian(std::span<const std::byte> bytes) { put(bytes); }

  /// Checks that every tensor is complete, then renames the file into place.
  void commit() {
    if (cur_ < specs_.size())
      fail("tensor '" + specs_[cur_].name + "' (" + std::string(dtype_name(specs_[cur_].type)) + " " +
           shape_string(specs_[cur_].shape) + ") needs " + std::to_string(need_[cur_]) + " bytes, " +
           std::to_string(got_) + " were written");
    file_.commit();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw error("write_safetensors: " + file_.path().string() + ": " + what);
  }
  void advance() {
    while (cur_ < specs_.size() && got_ == need_[cur_]) {
      ++cur_;
      got_ = 0;
    }
  }
  void check_room(std::size_t n) const {
    if (cur_ >= specs_.size()) fail("data written after the last tensor was complete");
    if (got_ + n > need_[cur_])
      fail("tensor '" + specs_[cur_].name + "' (" + std::string(dtype_name(specs_[cur_].type)) + " " +
           shape_string(specs_[cur_].shape) + ") needs " + std::to_string(need_[cur_]) + " bytes, a write of " +
           std::to_string(n) + " after " + std::to_string(got_) + " runs past its end");
  }
  void put(std::span<const std::byte> bytes) {
    if (bytes.empty()) return;
    check_room(bytes.size());
    file_.write(bytes.data(), bytes.size());
    got_ += bytes.size();
    advance();
  }

  std::vector<tensor_spec> specs_;
  std::vector<std::uint64_t> need_;
  atomic_file file_;
  std::size_t cur_ = 0;
  std::uint64_t got_ = 0;
};

/// Writes a safetensors file atomically in one call: `fill(i, out)` supplies tensor
/// i's data through `out.write(span)` (out is the safetensors_stream), exactly
/// specs[i].nbytes() bytes.
///
///     std::vector<tensor_spec> specs{{"w", dtype::f32, {2, 3}}};
///     write_safetensors("w.safetensors", specs, {{"note", "hello"}},
///                       [&](std::size_t, safetensors_stream& out) { out.write(std::span<const float>(w)); });
template <class Fill>
void write_safetensors(const std::filesystem::path& file, std::span<const tensor_spec> specs,
                       const std::map<std::string, std::string>& metadata, Fill&& fill) {
  safetensors_stream out(file, std::vector<tensor_spec>(specs.begin(), specs.end()), metadata);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    fill(i, out);
    if (out.current() <= i && specs[i].nbytes() > 0) out.commit();  // reports the incomplete tensor
  }
  out.commit();
}

/// Collects tensors (views of the caller's data, which must stay alive until write())
/// and metadata, then writes them as one safetensors file.
///
///     safetensors_writer w;
///     w.add("fc1.weight", {16, 32}, std::span<const float>(weights));
///     w.set_metadata("epoch", "3");
///     w.write("model.safetensors");
class safetensors_writer {
 public:
  /// Adds a tensor of element type T and the given shape; data.size() must be its
  /// number of elements.
  template <class T>
  void add(std::string name, std::vector<index_t> shape, std::span<const T> data) {
    add_host_bytes(std::move(name), dtype_of<T>(), std::move(shape), std::as_bytes(data));
  }
  template <class T>
  void add(std::string name, std::vector<index_t> shape, std::span<T> data) {
    add(std::move(name), std::move(shape), std::span<const T>(data));
  }
  /// Adds a tensor of any dtype (BOOL, F16, BF16 included) from host-order bytes.
  void add_host_bytes(std::string name, dtype type, std::vector<index_t> shape, std::span<const std::byte> bytes) {
    tensor_spec s{std::move(name), type, std::move(shape)};
    if (detail::checked_numel(s.shape) < 0)
      throw error("safetensors_writer::add: tensor '" + s.name + "': shape " + shape_string(s.shape) +
                  " is invalid or too large");
    if (bytes.size() != s.nbytes())
      throw error("safetensors_writer::add: tensor '" + s.name + "': " + std::string(dtype_name(type)) + " " +
                  shape_string(s.shape) + " needs " + std::to_string(s.nbytes()) + " bytes, " +
                  std::to_string(bytes.size()) + " given");
    specs_.push_back(std::move(s));
    data_.push_back(bytes);
  }
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<tensor_spec>& specs() const { return specs_; }

  /// Writes the file atomically; throws tessera::error (and leaves no file) on failure.
  void write(const std::filesystem::path& file) const {
    write_safetensors(file, std::span<const tensor_spec>(specs_), metadata_,
                      [&](std::size_t i, safetensors_stream& out) { out.write_host(data_[i]); });
  }

 private:
  std::vector<tensor_spec> specs_;
  std::vector<std::span<const std::byte>> data_;
  std::map<std::string, std::string> metadata_;
};

// ---- reading ----------------------------------------------------------------------

/// A tensor's entry in a file's header: name, dtype, shape (any rank) and where its
/// bytes lie in the data section, [begin, end).
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<index_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  index_t numel() const { return detail::checked_numel(shape); }
  std::uint64_t nbytes() const { return end - begin; }
  /// The shape as tessera extents (at most max_tensor_ndim dims; throws otherwise).
  extents shape_extents() const {
    if (shape.size() > std::size_t(max_tensor_ndim))
      throw error("safetensors: tensor '" + name + "' has rank " + std::to_string(shape.size()) +
                  ", tessera tensors have at most " + std::to_string(max_tensor_ndim) + " dims");
    extents e;
    e.ndim = int(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) e.v[d] = shape[d];
    return e;
  }
};

/// Reads a safetensors file. Opening it reads and validates the header; a problem is
/// a tessera::error that names the file and the numbers:
///
/// - fewer than 8 bytes, or a header length past the end of the file or above the
///   format's 100 MB limit;
/// - a header that is not strict JSON, not an object, or whose entries are not
///   {"dtype", "shape", "data_offsets"} exactly (unknown dtypes, negative or
///   non-integer extents, offsets that end before they begin);
/// - "__metadata__" that is not an object of strings;
/// - data_offsets whose size differs from shape x dtype size, tensors that overlap,
///   bytes of the data section that belong to no tensor, and data sections shorter
///   (truncated) or longer than the tensors.
///
/// Reads then take whole tensors or boxes of them; a file that shrank after opening
/// is reported, never read past. Not thread-safe (one stream per reader).
class safetensors_reader {
 public:
  explicit safetensors_reader(std::filesystem::path file) : path_(std::move(file)) {
    in_.open(path_, std::ios::binary);
    if (!in_) throw error("safetensors: " + path_.string() + ": cannot open the file");
    in_.seekg(0, std::ios::end);
    const std::streamoff size = in_.tellg();
    if (size < 0) throw error("safetensors: " + path_.string() + ": cannot determine the file size");
    file_size_ = std::uint64_t(size);
    in_.seekg(0);
    if (file_size_ < 8)
      fail("the file has " + std::to_string(file_size_) + " bytes, fewer than the 8-byte header length");
    unsigned char len[8];
    read_exact(0, reinterpret_cast<char*>(len), 8, "the header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | len[i];
    if (n > detail::max_header_bytes)
      fail("header length " + std::to_string(n) + " exceeds the format's limit of " +
           std::to_string(detail::max_header_bytes) + " bytes");
    if (n > file_size_ - 8)
      fail("header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(file_size_) +
           " bytes, " + std::to_string(file_size_ - 8) + " after the length field)");
    std::string header(std::size_t(n), '\0');
    read_exact(8, header.data(), n, "the header");
    data_start_ = 8 + n;
    parse_header(header);
  }

  const std::filesystem::path& path() const { return path_; }
  std::uint64_t file_size() const { return file_size_; }
  /// Offset of the data section in the file (8 + header length).
  std::uint64_t data_start() const { return data_start_; }
  /// The tensors, in the order of their data.
  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  const tensor_info* find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const tensor_info& at(std::string_view name) const {
    if (const tensor_info* t = find(name)) return *t;
    fail("no tensor named '" + std::string(name) + "' (the file has " + std::to_string(tensors_.size()) +
         " tensors)");
  }

  /// The tensor's data as host-order bytes.
  std::vector<std::byte> read_host_bytes(const tensor_info& t) const {
    std::vector<std::byte> out(t.nbytes());
    read_exact(data_start_ + t.begin, reinterpret_cast<char*>(out.data()), out.size(), "tensor '" + t.name + "'");
    detail::swap_to_little_endian(out, dtype_size(t.type));
    return out;
  }

  /// Reads tensor `name` of element type T into `out` (its number of elements).
  template <class T>
  void read_into(std::string_view name, std::span<T> out) const {
    const tensor_info& t = typed(name, dtype_of<T>());
    if (out.size() != std::size_t(t.numel()))
      fail("tensor '" + t.name + "': " + std::to_string(t.numel()) + " elements, the buffer holds " +
           std::to_string(out.size()));
    read_exact(data_start_ + t.begin, reinterpret_cast<char*>(out.data()), t.nbytes(), "tensor '" + t.name + "'");
    detail::swap_to_little_endian(std::as_writable_bytes(out), sizeof(T));
  }
  template <class T>
  std::vector<T> read(std::string_view name) const {
    const tensor_info& t = typed(name, dtype_of<T>());
    std::vector<T> out(std::size_t(t.numel()));
    read_into(name, std::span<T>(out));
    return out;
  }

  /// Reads the box `b` of tensor `name` (row-major, into `out`, b.shape.size()
  /// elements) and nothing much else: contiguous runs are read directly, short gaps
  /// between runs are read through, long ones are skipped.
  template <class T>
  void read_box(std::string_view name, const box& b, std::span<T> out) const {
    const tensor_info& t = typed(name, dtype_of<T>());
    read_box_host_bytes(t, b, std::as_writable_bytes(out));
  }

  /// As read_box, for any dtype, into host-order bytes.
  void read_box_host_bytes(const tensor_info& t, const box& b, std::span<std::byte> out) const {
    const extents shape = t.shape_extents();
    const std::string what = "tensor '" + t.name + "'";
    if (b.offset.ndim != shape.ndim || b.shape.ndim != shape.ndim)
      fail(what + ": a box of rank " + std::to_string(b.shape.ndim) + " for a tensor of rank " +
           std::to_string(shape.ndim));
    for (int d = 0; d < shape.ndim; ++d)
      if (b.offset.v[d] < 0 || b.shape.v[d] < 0 || b.offset.v[d] + b.shape.v[d] > shape.v[d])
        fail(what + ": box dim " + std::to_string(d) + " [" + std::to_string(b.offset.v[d]) + ", " +
             std::to_string(b.offset.v[d] + b.shape.v[d]) + ") lies outside the extent " + std::to_string(shape.v[d]));
    const std::size_t es = dtype_size(t.type);
    const index_t count = b.shape.size();
    if (out.size() != std::size_t(count) * es)
      fail(what + ": the box has " + std::to_string(count) + " elements, the buffer holds " +
           std::to_string(out.size() / es));
    if (count == 0) return;
    const int n = shape.ndim;
    std::array<index_t, max_tensor_ndim> stride{};
    if (n > 0) stride[n - 1] = 1;
    for (int d = n - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape.v[d + 1];
    // Trailing dims the box covers whole merge into one contiguous run.
    int inner = n - 1;
    index_t run = n > 0 ? b.shape.v[n - 1] : 1;
    while (inner > 0 && b.shape.v[inner] == shape.v[inner]) {
      --inner;
      run *= b.shape.v[inner];
    }
    index_t base = 0;
    for (int d = 0; d < n; ++d) base += b.offset.v[d] * stride[d];
    run_reader rr{this, t, out.data()};
    const std::uint64_t run_bytes = std::uint64_t(run) * es;
    std::array<index_t, max_tensor_ndim> idx{};
    std::uint64_t out_pos = 0;
    while (true) {
      index_t e = base;
      for (int d = 0; d < inner; ++d) e += idx[d] * stride[d];
      rr.add(std::uint64_t(e) * es, out_pos, run_bytes);
      out_pos += run_bytes;
      int d = inner - 1;
      for (; d >= 0; --d) {
        if (++idx[d] < b.shape.v[d]) break;
        idx[d] = 0;
      }
      if (d < 0) break;
    }
    rr.flush();
    detail::swap_to_little_endian(out, es);
  }

 private:
  // Reads runs (tensor-relative offset, length) in increasing order, coalescing those
  // separated by short gaps into one read of up to window_limit bytes.
  struct run_reader {
    static constexpr std::uint64_t gap_limit = 64 * 1024;
    static constexpr std::uint64_t window_limit = 1024 * 1024;
    struct pending {
      std::uint64_t src, dst, len;
    };
    const safetensors_reader* r;
    const tensor_info& t;
    std::byte* out;
    std::vector<pending> runs{};
    std::vector<char> scratch{};

    void add(std::uint64_t src, std::uint64_t dst, std::uint64_t len) {
      if (!runs.empty()) {
        const std::uint64_t wstart = runs.front().src, wend = runs.back().src + runs.back().len;
        if (src - wend > gap_limit || src + len - wstart > window_limit) flush();
      }
      if (runs.empty() && len >= window_limit) {  // large run: straight into the output
        r->read_exact(r->data_start_ + t.begin + src, reinterpret_cast<char*>(out + dst), len,
                      "tensor '" + t.name + "'");
        return;
      }
      runs.push_back({src, dst, len});
    }
    void flush() {
      if (runs.empty()) return;
      const std::uint64_t wstart = runs.front().src, wend = runs.back().src + runs.back().len;
      if (runs.size() == 1) {
        r->read_exact(r->data_start_ + t.begin + wstart, reinterpret_cast<char*>(out + runs[0].dst), runs[0].len,
                      "tensor '" + t.name + "'");
      } else {
        scratch.resize(wend - wstart);
        r->read_exact(r->data_start_ + t.begin + wstart, scratch.data(), wend - wstart, "tensor '" + t.name + "'");
        for (const pending& p : runs) std::memcpy(out + p.dst, scratch.data() + (p.src - wstart), p.len);
      }
      runs.clear();
    }
  };

  [[noreturn]] void fail(const std::string& what) const { throw error("safetensors: " + path_.string() + ": " + what); }

  const tensor_info& typed(std::string_view name, dtype want) const {
    const tensor_info& t = at(name);
    if (t.type != want)
      fail("tensor '" + t.name + "' is " + std::string(dtype_name(t.type)) + ", read as " +
           std::string(dtype_name(want)));
    return t;
  }

  void read_exact(std::uint64_t pos, char* dst, std::uint64_t n, const std::string& what) const {
    if (n == 0) return;
    if (pos > file_size_ || n > file_size_ - pos)
      fail(what + ": bytes [" + std::to_string(pos) + ", " + std::to_string(pos + n) + ") lie past the end of the file (" +
           std::to_string(file_size_) + " bytes)");
    in_.clear();
    in_.seekg(std::streamoff(pos));
    in_.read(dst, std::streamsize(n));
    if (!in_ || std::uint64_t(in_.gcount()) != n) {
      const std::uint64_t got = std::uint64_t(in_.gcount());
      in_.clear();
      fail(what + ": reading bytes [" + std::to_string(pos) + ", " + std::to_string(pos + n) + ") got " +
           std::to_string(got) + " bytes: the file is shorter than when it was opened");
    }
  }

  void parse_header(const std::string& text) {
    const json::value h = json::parse(text, "safetensors: " + path_.string() + ": header");
    if (!h.is_object()) fail("the header must be a JSON object, found " + std::string(json::kind_name(h)));
    for (const auto& [key, v] : h.get_ref<const json::value::object_t&>()) {
      if (key == "__metadata__") {
        if (!v.is_object()) fail("\"__metadata__\" must be an object of strings, found " + std::string(json::kind_name(v)));
        for (const auto& [k, x] : v.get_ref<const json::value::object_t&>()) {
          if (!x.is_string())
            fail("\"__metadata__\" must be an object of strings; \"" + k + "\" is " + std::string(json::kind_name(x)));
          metadata_[k] = x.get_ref<const std::string&>();
        }
        continue;
      }
      tensors_.push_back(parse_entry(key, v));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const tensor_info& a, const tensor_info& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
    const std::uint64_t data_len = file_size_ - data_start_;
    std::uint64_t covered = 0;
    const tensor_info* prev = nullptr;
    for (const tensor_info& t : tensors_) {
      if (t.end > data_len)
        fail("tensor '" + t.name + "': data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] run past the end of the data section, which has " + std::to_string(data_len) +
             " bytes: the file is truncated or the offsets are wrong");
      if (t.begin < covered)
        fail("tensors '" + prev->name + "' [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) +
             "] and '" + t.name + "' [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] overlap in the data section");
      if (t.begin > covered)
        fail("bytes [" + std::to_string(covered) + ", " + std::to_string(t.begin) +
             ") of the data section belong to no tensor");
      covered = t.end;
      prev = &t;
    }
    if (covered != data_len)
      fail("the data section has " + std::to_string(data_len) + " bytes, the tensors end at byte " +
           std::to_string(covered));
  }

  tensor_info parse_entry(const std::string& name, const json::value& v) const {
    const std::string what = "tensor '" + name + "'";
    if (!v.is_object()) fail(what + ": the entry must be an object, found " + std::string(json::kind_name(v)));
    for (const auto& [k, x] : v.get_ref<const json::value::object_t&>())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        fail(what + ": unknown key \"" + k + "\" (an entry has dtype, shape and data_offsets)");
    const auto dt = v.find("dtype");
    const auto sh = v.find("shape");
    const auto of = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || of == v.end())
      fail(what + ": the entry lacks \"" +
           std::string(dt == v.end() ? "dtype" : sh == v.end() ? "shape" : "data_offsets") + "\"");
    tensor_info t;
    t.name = name;
    if (!dt->is_string()) fail(what + ": dtype must be a string, found " + std::string(json::kind_name(*dt)));
    const std::string& dtype_text = dt->get_ref<const std::string&>();
    if (!parse_dtype(dtype_text, t.type))
      fail(what + ": unknown dtype \"" + dtype_text + "\" (known: " + dtype_names() + ")");
    if (!sh->is_array()) fail(what + ": shape must be an array, found " + std::string(json::kind_name(*sh)));
    for (std::size_t d = 0; d < sh->size(); ++d) {
      const std::int64_t e = json::to_int64((*sh)[d]).value_or(-1);
      if (e < 0) fail(what + ": shape entry " + std::to_string(d) + " must be a non-negative integer");
      t.shape.push_back(e);
    }
    std::int64_t offsets[2] = {-1, -1};
    if (of->is_array() && of->size() == 2)
      for (std::size_t i = 0; i < 2; ++i) offsets[i] = json::to_int64((*of)[i]).value_or(-1);
    if (offsets[0] < 0 || offsets[1] < 0) fail(what + ": data_offsets must be an array of two non-negative integers");
    t.begin = std::uint64_t(offsets[0]);
    t.end = std::uint64_t(offsets[1]);
    if (t.end < t.begin)
      fail(what + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
    const index_t numel = t.numel();
    if (numel < 0) fail(what + ": shape " + shape_string(t.shape) + " has too many elements");
    const std::uint64_t es = dtype_size(t.type);
    if (std::uint64_t(numel) > ~std::uint64_t(0) / es || std::uint64_t(numel) * es != t.nbytes())
      fail(what + ": shape " + shape_string(t.shape) + " of " + dtype_text + " needs " + std::to_string(numel) +
           " x " + std::to_string(es) + " = " + std::to_string(std::uint64_t(numel) * es) +
           " bytes, data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] hold " +
           std::to_string(t.nbytes()));
    return t;
  }

  std::filesystem::path path_;
  mutable std::ifstream in_;
  std::uint64_t file_size_ = 0;
  std::uint64_t data_start_ = 0;
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessera::io

