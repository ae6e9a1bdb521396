// The reductions a partial layout or a collective can apply.
#pragma once

#include <limits>
#include <string_view>

namespace tessera {

/// How partial values are combined. `mean` exists only for collectives
/// (a sum followed by a scale); a layout's partial state is sum, max or min.
enum class reduce_op { sum, max, min, mean };

constexpr std::string_view to_string(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
    case reduce_op::mean: return "mean";
  }
  return "?";
}

/// The identity element of `op` for type T: x op identity == x.
template <class T>
constexpr T reduce_identity(reduce_op op) {
  switch (op) {
    case reduce_op::max: return std::numeric_limits<T>::lowest();
    case reduce_op::min: return std::numeric_limits<T>::max();
    default: return T(0);
  }
}

/// Combines two partial values.
template <class T>
constexpr T reduce_apply(reduce_op op, T a, T b) {
  switch (op) {
    case reduce_op::max: return a < b ? b : a;
    case reduce_op::min: return b < a ? b : a;
    default: return a + b;
  }
}

}  // namespace tessera
