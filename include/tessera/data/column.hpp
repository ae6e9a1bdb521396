// Column values of dataset rows: a small typed array (uint8, int32 or float32 in an
// xt::xarray), rows of named columns, and stacking values into a batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>

namespace tessera::data {

/// The element types a column value may hold.
enum class dtype : std::uint8_t { uint8, int32, float32 };

/// "uint8", "int32", "float32"
constexpr std::string_view to_string(dtype t) {
  switch (t) {
    case dtype::uint8: return "uint8";
    case dtype::int32: return "int32";
    case dtype::float32: return "float32";
  }
  return "?";
}

namespace detail {
template <class T>
inline constexpr bool is_element = std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int32_t> ||
                                   std::is_same_v<T, float>;

/// Converts one element: floats to integers truncate toward zero and saturate
/// (NaN gives 0); integers to narrower integers saturate.
template <class To, class From>
constexpr To convert(From v) {
  if constexpr (std::is_same_v<To, From> || std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else if constexpr (std::is_floating_point_v<From>) {
    if (std::isnan(v)) return To{0};
    if (v <= static_cast<From>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (v >= static_cast<From>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else {
    const auto w = static_cast<std::int64_t>(v);
    return static_cast<To>(std::clamp<std::int64_t>(w, std::numeric_limits<To>::min(),
                                                    std::numeric_limits<To>::max()));
  }
}

/// "(28, 28, 1)"; "()" for a scalar.
template <class S>
std::string shape_string(const S& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}
}  // namespace detail

/// The dtype of element type T (uint8_t, int32_t or float).
template <class T>
  requires detail::is_element<T>
inline constexpr dtype dtype_of = std::is_same_v<T, std::uint8_t>   ? dtype::uint8
                                  : std::is_same_v<T, std::int32_t> ? dtype::int32
                                                                    : dtype::float32;

/// One column value of a row: an xt::xarray of uint8, int32 or float32 (row-major),
/// of any rank (a label is a rank-0 array). A plain value type: copying copies the
/// elements.
///
///     data::array img = xt::xarray<std::uint8_t>::from_shape({28, 28, 1});
///     img.type();                       // dtype::uint8
///     img.get<std::uint8_t>()(3, 4, 0); // the pixel at row 3, column 4
///     img.cast(dtype::float32);         // a converted copy
class array {
 public:
  using variant_type = std::variant<xt::xarray<std::uint8_t>, xt::xarray<std::int32_t>, xt::xarray<float>>;

  /// A float32 scalar 0.
  array() : v_(xt::xarray<float>(0.0f)) {}
  template <class T>
    requires detail::is_element<T>
  array(xt::xarray<T> a) : v_(std::move(a)) {}  // NOLINT: implicit by design

  /// A rank-0 array holding `v`.
  template <class T>
    requires detail::is_element<T>
  static array scalar(T v) {
    return array(xt::xarray<T>(v));
  }

  dtype type() const { return static_cast<dtype>(v_.index()); }
  std::vector<std::size_t> shape() const {
    return std::visit([](const auto& a) { return std::vector<std::size_t>(a.shape().begin(), a.shape().end()); }, v_);
  }
  std::size_t ndim() const { return std::visit([](const auto& a) { return a.dimension(); }, v_); }
  std::size_t size() const { return std::visit([](const auto& a) { return a.size(); }, v_); }

  /// The xt::xarray<T>; a tessera::error when the array holds another dtype.
  template <class T>
  const xt::xarray<T>& get() const {
    check_type<T>();
    return std::get<xt::xarray<T>>(v_);
  }
  template <class T>
  xt::xarray<T>& get() {
    check_type<T>();
    return std::get<xt::xarray<T>>(v_);
  }

  /// The one element of a one-element array (a label), converted to T as cast() does.
  template <class T>
    requires detail::is_element<T>
  T item() const {
    if (size() != 1)
      throw error("data::array: item() needs exactly one element: the array has shape " +
                  detail::shape_string(shape()));
    return std::visit([](const auto& a) { return detail::convert<T>(a.data()[0]); }, v_);
  }

  /// A copy converted to `t` (float to integer: truncate toward zero, saturate; NaN: 0).
  array cast(dtype t) const {
    switch (t) {
      case dtype::uint8: return array(to<std::uint8_t>());
      case dtype::int32: return array(to<std::int32_t>());
      case dtype::float32: return array(to<float>());
    }
    return *this;
  }
  /// The elements converted to T, as cast() converts them.
  template <class T>
    requires detail::is_element<T>
  xt::xarray<T> to() const {
    return std::visit(
        [](const auto& a) {
          using from = typename std::decay_t<decltype(a)>::value_type;
          if constexpr (std::is_same_v<from, T>) return a;
          else {
            xt::xarray<T> out = xt::xarray<T>::from_shape(a.shape());
            std::transform(a.data(), a.data() + a.size(), out.data(), [](from v) { return detail::convert<T>(v); });
            return out;
          }
        },
        v_);
  }

  /// Calls f with the xt::xarray<T> held.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), v_);
  }
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), v_);
  }

  /// Same dtype, same shape, equal elements.
  friend bool operator==(const array& x, const array& y) {
    if (x.type() != y.type() || x.shape() != y.shape()) return false;
    return std::visit(
        [&](const auto& a) {
          const auto& b = std::get<std::decay_t<decltype(a)>>(y.v_);
          return std::equal(a.data(), a.data() + a.size(), b.data());
        },
        x.v_);
  }

 private:
  template <class T>
  void check_type() const {
    static_assert(detail::is_element<T>, "data::array: the element type must be uint8_t, int32_t or float");
    if (type() != dtype_of<T>)
      throw error("data::array: the array holds " + std::string(to_string(type())) + ", asked for " +
                  std::string(to_string(dtype_of<T>)));
  }

  variant_type v_;
};

/// One row of a dataset: named column values, and the index of the sample in its
/// source (for a batch: the batch's position in its pass). Sources give each row its
/// index; transforms use it, with the pass number, to seed their randomness.
struct row {
  std::vector<std::string> names;
  std::vector<array> values;
  std::int64_t index = -1;

  /// The position of column `name`; a tessera::error naming the columns when absent.
  std::size_t column(std::string_view name) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return i;
    throw error("row: no column '" + std::string(name) + "'; the columns are " + join(names));
  }
  const array& operator[](std::string_view name) const { return values[column(name)]; }
  array& operator[](std::string_view name) { return values[column(name)]; }

  /// "image, label"
  static std::string join(const std::vector<std::string>& names) {
    std::string s;
    for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
    return s;
  }
};

/// Stacks values of one dtype and shape along a new leading dim: n values of shape
/// (28, 28, 1) give one of shape (n, 28, 28, 1); n scalars give shape (n,).
/// `context` starts the error text (e.g. "batch: column 'image'").
inline array stack(const std::vector<array>& items, std::string_view context = "stack") {
  if (items.empty()) throw error(std::string(context) + ": nothing to stack");
  const dtype t = items[0].type();
  const std::vector<std::size_t> shape = items[0].shape();
  for (std::size_t i = 1; i < items.size(); ++i) {
    if (items[i].type() != t)
      throw error(std::string(context) + ": every value of a batch must have the same dtype: value " +
                  std::to_string(i) + " is " + std::string(to_string(items[i].type())) + ", value 0 is " +
                  std::string(to_string(t)));
    if (items[i].shape() != shape)
      throw error(std::string(context) + ": every value of a batch must have the same shape: value " +
                  std::to_string(i) + " has shape " + detail::shape_string(items[i].shape()) +
                  ", value 0 has " + detail::shape_string(shape));
  }
  return items[0].visit([&](const auto& first) -> array {
    using T = typename std::decay_t<decltype(first)>::value_type;
    std::vector<std::size_t> out_shape{items.size()};
    out_shape.insert(out_shape.end(), shape.begin(), shape.end());
    xt::xarray<T> out = xt::xarray<T>::from_shape(out_shape);
    const std::size_t n = first.size();
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& a = items[i].get<T>();
      std::copy(a.data(), a.data() + n, out.data() + i * n);
    }
    return array(std::move(out));
  });
}

}  // namespace tessera::data
