// The local pieces of the operators that combine values across ranks, on device arrays:
// the GPU twins of kernels/cpu/sharded.hpp (softmax and log-softmax along an axis and
// their backward, sparse softmax cross entropy, argmax, one-hot on a piece of the
// depth, type conversion), with the same arithmetic per element. A row kernel gives one
// thread to each vector along the axis (consecutive threads read consecutive elements
// when the axis is not the last); when the axis is the last dim (contiguous rows), the
// row maxima and sums take a warp per row (sums then differ from the host's sequential
// ones by rounding; maxima are exact). Element kernels take one thread per element.
// Labels and floating-point indices are checked on the host (a copy of the small index
// array), so the errors are the CPU kernels' own. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/kernels/cpu/sharded.hpp>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/kernels/cuda/softmax.cuh>

namespace tessera::kernels::cuda {

namespace detail {

/// (outer, n, inner) around an axis, as kernels/cpu/softmax.hpp's view_around.
struct axis_geom {
  std::int64_t outer = 1, n = 1, inner = 1;
  std::int64_t rows() const { return outer * inner; }
  std::int64_t size() const { return outer * n * inner; }
};

inline axis_geom geom_around(const char* fn, const shape_vec& shape, int axis) {
  const cd::axis_view v = cd::view_around(fn, shape, axis);
  return {std::int64_t(v.outer), std::int64_t(v.n), std::int64_t(v.inner)};
}

template <class A>
void require_rows(const char* fn, const char* name, const A& a, std::int64_t rows) {
  if (std::int64_t(a.size()) != rows)
    throw error(std::string(fn) + ": " + name + " has " + std::to_string(a.size()) + " elements, expected " +
                std::to_string(rows) + " (one per vector along the axis)");
}

// The first element of row `row` (= o * inner + i) in an (outer, n, inner) array.
__device__ inline std::int64_t row_base(std::int64_t row, std::int64_t n, std::int64_t inner) {
  return (row / inner) * n * inner + row % inner;
}
// The row of element k.
__device__ inline std::int64_t row_of(std::int64_t k, std::int64_t n, std::int64_t inner) {
  return (k / (n * inner)) * inner + k % inner;
}

template <class T>
__global__ void axis_max_kernel(const T* x, T* max, std::int64_t rows, std::int64_t n, std::int64_t inner, T init) {
  TESSERA_GRID_STRIDE(row, rows) {
    const std::int64_t b = row_base(row, n, inner);
    T m = init;
    for (std::int64_t j = 0; j < n; ++j) {
      const T v = x[b + j * inner];
      m = m < v ? v : m;  // std::max(m, v)
    }
    max[row] = m;
  }
}

template <class T>
__global__ void axis_sum_kernel(const T* x, const T* max, T* sum, std::int64_t rows, std::int64_t n,
                                std::int64_t inner) {
  TESSERA_GRID_STRIDE(row, rows) {
    const std::int64_t b = row_base(row, n, inner);
    const T m = max[row];
    T s = T(0);
    for (std::int64_t j = 0; j < n; ++j) s += exp_of(x[b + j * inner] - m);
    sum[row] = s;
  }
}

template <class T>
__global__ void axis_out_kernel(const T* x, const T* max, const T* sum, T* y, std::int64_t size, std::int64_t n,
                                std::int64_t inner, bool log) {
  TESSERA_GRID_STRIDE(k, size) {
    const std::int64_t row = row_of(k, n, inner);
    if (log) {
      const T lse = max[row] + log_of(sum[row]);
      y[k] = x[k] - lse;
    } else {
      const T inv = T(1) / sum[row];
      y[k] = exp_of(x[k] - max[row]) * inv;
    }
  }
}

template <class T>
__global__ void axis_grad_sum_kernel(const T* g, const T* y, T* acc, std::int64_t rows, std::int64_t n,
                                     std::int64_t inner, bool log) {
  TESSERA_GRID_STRIDE(row, rows) {
    const std::int64_t b = row_base(row, n, inner);
    T a = T(0);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t at = b + j * inner;
      a += log ? g[at] : g[at] * y[at];
    }
    acc[row] = a;
  }
}

template <class T>
__global__ void axis_grad_kernel(const T* g, const T* y, const T* acc, T* dx, std::int64_t size, std::int64_t n,
                                 std::int64_t inner, bool log) {
  TESSERA_GRID_STRIDE(k, size) {
    const T a = acc[row_of(k, n, inner)];
    dx[k] = log ? g[k] - exp_of(y[k]) * a : y[k] * (g[k] - a);
  }
}

template <class T>
__global__ void sparse_ce_loss_kernel(const T* max, const T* terms, T* loss, std::int64_t rows) {
  TESSERA_GRID_STRIDE(i, rows) { loss[i] = max[i] + log_of(terms[i]) - terms[rows + i]; }
}

template <class T>
__global__ void sparse_ce_grad_kernel(const T* g, const T* x, const std::int64_t* column, const T* max, const T* terms,
                                      T* dx, std::int64_t rows, std::int64_t cols) {
  TESSERA_GRID_STRIDE(k, rows * cols) {
    const std::int64_t i = k / cols, j = k % cols;
    const T inv = T(1) / terms[i];
    const T hot = j == column[i] ? T(1) : T(0);
    dx[k] = g[i] * (exp_of(x[k] - max[i]) * inv - hot);
  }
}

template <class T>
__global__ void argmax_kernel(const T* x, T* best, std::int64_t* index, std::int64_t rows, std::int64_t n,
                              std::int64_t inner, std::int64_t first, T lowest) {
  TESSERA_GRID_STRIDE(row, rows) {
    const std::int64_t b = row_base(row, n, inner);
    T m = lowest;
    std::int64_t at = -1;
    for (std::int64_t j = 0; j < n; ++j) {
      const T e = x[b + j * inner];
      if (at < 0 || e > m) {
        m = e;
        at = first + j;
      }
    }
    best[row] = m;
    index[row] = at;
  }
}

template <class T>
__global__ void argmax_resolve_kernel(std::int64_t* index, const T* best, const T* top, std::int64_t n) {
  TESSERA_GRID_STRIDE(o, n) {
    if (!(best[o] == top[o])) index[o] = INT64_MAX;
  }
}

template <class T, class I>
__global__ void one_hot_kernel(const I* idx, T* out, std::int64_t count, std::int64_t depth, std::int64_t first,
                               std::int64_t local_depth, T on, T off) {
  TESSERA_GRID_STRIDE(k, count * local_depth) {
    const std::int64_t r = k / local_depth, c = k % local_depth;
    const auto v = std::int64_t(idx[r]);
    // Outside [0, depth) stays outside after the shift: a row of `off`.
    const std::int64_t shifted = v >= 0 && v < depth ? v - first : std::int64_t(-1);
    out[k] = shifted == c ? on : off;
  }
}

template <class To, class From>
__global__ void convert_kernel(const From* x, To* y, std::int64_t n) {
  TESSERA_GRID_STRIDE(i, n) { y[i] = To(x[i]); }
}

// ---- one warp per contiguous row (the axis is the last dim: inner == 1) ----

template <class T>
struct max_comb {
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }  // std::max(a, b)
};
template <class T>
struct sum_comb {
  __device__ T operator()(T a, T b) const { return a + b; }
};
// x[row n + j]
template <class T>
struct plain_load {
  const T* x;
  std::int64_t n;
  __device__ T operator()(std::int64_t row, std::int64_t j) const { return x[row * n + j]; }
};
// exp(x[row n + j] - max[row])
template <class T>
struct exp_load {
  const T* x;
  const T* max;
  std::int64_t n;
  __device__ T operator()(std::int64_t row, std::int64_t j) const { return exp_of(x[row * n + j] - max[row]); }
};
// dy (log-softmax) or dy * y (softmax) at [row n + j]
template <class T>
struct grad_load {
  const T* g;
  const T* y;
  std::int64_t n;
  bool log;
  __device__ T operator()(std::int64_t row, std::int64_t j) const {
    const std::int64_t k = row * n + j;
    return log ? g[k] : g[k] * y[k];
  }
};

// out[row] = comb over j < n of load(row, j), from init: each lane combines every 32nd
// element, then the warp combines the lanes. A whole warp takes one row at a time, so
// the full-mask shuffles see every lane.
template <class T, class Load, class Comb>
__global__ void warp_rows_kernel(T* out, std::int64_t rows, std::int64_t n, Load load, Comb comb, T init) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t row = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    T acc = init;
    for (std::int64_t j = lane; j < n; j += 32) acc = comb(acc, load(row, j));
    for (int o = 16; o > 0; o /= 2) acc = comb(acc, __shfl_down_sync(0xffffffffu, acc, o));
    if (lane == 0) out[row] = acc;
  }
}

template <class T, class Load, class Comb>
void warp_rows(const char* name, T* out, std::int64_t rows, std::int64_t n, Load load, Comb comb, T init) {
  if (rows <= 0) return;
  constexpr int warps_per_block = tessera::cuda::block_threads / 32;
  const std::int64_t blocks = (rows + warps_per_block - 1) / warps_per_block;
  warp_rows_kernel<<<unsigned(blocks < 65535 ? blocks : 65535), tessera::cuda::block_threads, 0,
                     tessera::cuda::stream()>>>(out, rows, n, load, comb, init);
  tessera::cuda::check_launch(name);
}

// The label's logit of each row (0 where another rank holds it).
template <class T>
__global__ void sparse_ce_picked_kernel(const T* x, const std::int64_t* column, T* picked, std::int64_t rows,
                                        std::int64_t cols) {
  TESSERA_GRID_STRIDE(i, rows) {
    const std::int64_t c = column[i];
    picked[i] = c >= 0 && c < cols ? x[i * cols + c] : T(0);
  }
}

/// kernel<<<...>>>(args...) over n items (grid-stride) on tessera's stream, launch
/// checked; nothing for n <= 0.
template <class... P, class... A>
void launch_over(const char* name, std::int64_t n, void (*kernel)(P...), A... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch_over: one argument per kernel parameter");
  if (n <= 0) return;
  kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(P(args)...);
  tessera::cuda::check_launch(name);
}

}  // namespace detail

// ---- softmax along an axis ----------------------------------------------------------

/// The max of every vector along `axis` (-inf for an empty one): (rows,).
template <class T>
device_array<T> softmax_axis_max(const device_array<T>& x, int axis) {
  const detail::axis_geom v = detail::geom_around("softmax", x.shape(), axis);
  device_array<T> max(std::vector<std::size_t>{std::size_t(v.rows())});
  if (v.inner == 1)  // contiguous rows: a warp each
    detail::warp_rows("softmax_axis_max", max.data(), v.rows(), v.n, detail::plain_load<T>{x.data(), v.n},
                      detail::max_comb<T>{}, -std::numeric_limits<T>::infinity());
  else
    detail::launch_over("softmax_axis_max", v.rows(), detail::axis_max_kernel<T>, x.data(), max.data(), v.rows(), v.n,
                        v.inner, -std::numeric_limits<T>::infinity());
  return max;
}

/// sum exp(x - max[row]) of every vector along `axis`: (rows,).
template <class T>
device_array<T> softmax_axis_sum(const device_array<T>& x, int axis, const device_array<T>& max) {
  const detail::axis_geom v = detail::geom_around("softmax", x.shape(), axis);
  detail::require_rows("softmax_axis_sum", "max", max, v.rows());
  device_array<T> sum(std::vector<std::size_t>{std::size_t(v.rows())});
  if (v.inner == 1)
    detail::warp_rows("softmax_axis_sum", sum.data(), v.rows(), v.n, detail::exp_load<T>{x.data(), max.data(), v.n},
                      detail::sum_comb<T>{}, T(0));
  else
    detail::launch_over("softmax_axis_sum", v.rows(), detail::axis_sum_kernel<T>, x.data(), max.data(), sum.data(),
                        v.rows(), v.n, v.inner);
  return sum;
}

/// softmax (or, with `log`, log-softmax) from the row max and sum: x's shape.
template <class T>
device_array<T> softmax_axis_out(const device_array<T>& x, int axis, const device_array<T>& max,
                                 const device_array<T>& sum, bool log) {
  const detail::axis_geom v = detail::geom_around("softmax", x.shape(), axis);
  detail::require_rows("softmax_axis_out", "max", max, v.rows());
  detail::require_rows("softmax_axis_out", "sum", sum, v.rows());
  device_array<T> y(x.shape());
  detail::launch_over("softmax_axis_out", v.size(), detail::axis_out_kernel<T>, x.data(), max.data(), sum.data(),
                      y.data(), v.size(), v.n, v.inner, log);
  return y;
}

/// The backward's row sum: sum(dy * y) (softmax) or sum(dy) (log-softmax): (rows,).
template <class T>
device_array<T> softmax_axis_grad_sum(const device_array<T>& dy, const device_array<T>& y, int axis, bool log) {
  const detail::axis_geom v = detail::geom_around("softmax_backward", y.shape(), axis);
  if (dy.shape() != y.shape())
    throw error("softmax_axis_grad_sum: dy is " + detail::cd::shape_text(dy.shape()) + ", y is " +
                detail::cd::shape_text(y.shape()));
  device_array<T> acc(std::vector<std::size_t>{std::size_t(v.rows())});
  if (v.inner == 1)
    detail::warp_rows("softmax_axis_grad_sum", acc.data(), v.rows(), v.n,
                      detail::grad_load<T>{dy.data(), y.data(), v.n, log}, detail::sum_comb<T>{}, T(0));
  else
    detail::launch_over("softmax_axis_grad_sum", v.rows(), detail::axis_grad_sum_kernel<T>, dy.data(), y.data(),
                        acc.data(), v.rows(), v.n, v.inner, log);
  return acc;
}

/// dx = y (dy - acc) (softmax) or dy - exp(y) acc (log-softmax): y's shape.
template <class T>
device_array<T> softmax_axis_grad(const device_array<T>& dy, const device_array<T>& y, int axis,
                                  const device_array<T>& acc, bool log) {
  const detail::axis_geom v = detail::geom_around("softmax_backward", y.shape(), axis);
  if (dy.shape() != y.shape())
    throw error("softmax_axis_grad: dy is " + detail::cd::shape_text(dy.shape()) + ", y is " +
                detail::cd::shape_text(y.shape()));
  detail::require_rows("softmax_axis_grad", "acc", acc, v.rows());
  device_array<T> dx(y.shape());
  detail::launch_over("softmax_axis_grad", v.size(), detail::axis_grad_kernel<T>, dy.data(), y.data(), acc.data(),
                      dx.data(), v.size(), v.n, v.inner, log);
  return dx;
}

// ---- sparse softmax cross entropy ---------------------------------------------------

/// Each row's label as a local column (-1 where another rank holds it): the labels are
/// copied to the host and checked there (kernels/cpu/sharded.hpp's errors): (rows,).
template <class L>
device_array<std::int64_t> sparse_ce_columns(const device_array<L>& labels, index_t classes, index_t first_row,
                                             index_t first_col, std::size_t cols) {
  const std::vector<L> host = labels.to_vector();
  std::vector<std::int64_t> column(host.size());
  detail::cd::sparse_ce_column_of(host.data(), host.size(), classes, first_row, first_col, cols, column.data());
  return device_array<std::int64_t>::from_host(column.data(), column.size(),
                                               std::vector<std::size_t>{column.size()});
}

/// (2, rows) for logits x (rows, cols): sum exp(x - max) per row, then the label's logit.
template <class T>
device_array<T> sparse_ce_terms(const device_array<T>& x, const device_array<std::int64_t>& column,
                                const device_array<T>& max) {
  if (x.dimension() != 2) throw error("sparse_ce_terms: x must be 2-D, x is " + detail::cd::shape_text(x.shape()));
  const std::int64_t rows = std::int64_t(x.shape()[0]), cols = std::int64_t(x.shape()[1]);
  detail::require_rows("sparse_ce_terms", "column", column, rows);
  detail::require_rows("sparse_ce_terms", "max", max, rows);
  device_array<T> terms(std::vector<std::size_t>{2, std::size_t(rows)});
  // terms[0, rows): a warp per row sums exp(x - max); terms[rows, 2 rows): the picked logits.
  detail::warp_rows("sparse_ce_terms", terms.data(), rows, cols, detail::exp_load<T>{x.data(), max.data(), cols},
                    detail::sum_comb<T>{}, T(0));
  detail::launch_over("sparse_ce_terms", rows, detail::sparse_ce_picked_kernel<T>, x.data(), column.data(),
                      terms.data() + rows, rows, cols);
  return terms;
}

/// The per-row loss max + log(sum) - picked: (rows,).
template <class T>
device_array<T> sparse_ce_loss(const device_array<T>& max, const device_array<T>& terms) {
  const std::int64_t rows = std::int64_t(max.size());
  detail::require_rows("sparse_ce_loss", "terms", terms, 2 * rows);
  device_array<T> loss(std::vector<std::size_t>{std::size_t(rows)});
  detail::launch_over("sparse_ce_loss", rows, detail::sparse_ce_loss_kernel<T>, max.data(), terms.data(), loss.data(),
                      rows);
  return loss;
}

/// dx = dloss (softmax(x) - [j == column]) on this rank's columns: x's shape.
template <class T>
device_array<T> sparse_ce_grad(const device_array<T>& dloss, const device_array<T>& x,
                               const device_array<std::int64_t>& column, const device_array<T>& max,
                               const device_array<T>& terms) {
  if (x.dimension() != 2) throw error("sparse_ce_grad: x must be 2-D, x is " + detail::cd::shape_text(x.shape()));
  const std::int64_t rows = std::int64_t(x.shape()[0]), cols = std::int64_t(x.shape()[1]);
  detail::require_rows("sparse_ce_grad", "dloss", dloss, rows);
  detail::require_rows("sparse_ce_grad", "column", column, rows);
  detail::require_rows("sparse_ce_grad", "max", max, rows);
  detail::require_rows("sparse_ce_grad", "terms", terms, 2 * rows);
  device_array<T> dx(x.shape());
  detail::launch_over("sparse_ce_grad", rows * cols, detail::sparse_ce_grad_kernel<T>, dloss.data(), x.data(),
                      column.data(), max.data(), terms.data(), dx.data(), rows, cols);
  return dx;
}

// ---- argmax ---------------------------------------------------------------------------

/// The local maximum of every vector along `axis` and the index of its first occurrence,
/// counted from `first`: ((rows,) values, (rows,) int64 indices).
template <class T>
std::pair<device_array<T>, device_array<std::int64_t>> argmax_local(const device_array<T>& x, int axis,
                                                                    std::int64_t first) {
  const detail::axis_geom v = detail::geom_around("argmax", x.shape(), axis);
  const std::vector<std::size_t> shape{std::size_t(v.rows())};
  device_array<T> best(shape);
  device_array<std::int64_t> index(shape);
  detail::launch_over("argmax_local", v.rows(), detail::argmax_kernel<T>, x.data(), best.data(), index.data(), v.rows(),
                      v.n, v.inner, first, std::numeric_limits<T>::lowest());
  return {std::move(best), std::move(index)};
}

/// In place: index = INT64_MAX where best is not the group's top.
template <class T>
void argmax_resolve(device_array<std::int64_t>& index, const device_array<T>& best, const device_array<T>& top) {
  const std::int64_t n = std::int64_t(index.size());
  detail::require_rows("argmax_resolve", "best", best, n);
  detail::require_rows("argmax_resolve", "top", top, n);
  detail::launch_over("argmax_resolve", n, detail::argmax_resolve_kernel<T>, index.data(), best.data(), top.data(), n);
}

// ---- one-hot, conversion --------------------------------------------------------------

/// indices.shape + (local_depth,) for this rank's piece [first, first + local_depth) of
/// a depth of `depth` (kernels/cpu/sharded.hpp's one_hot_piece). Floating-point
/// indices are checked on the host first.
template <class T, class I>
device_array<T> one_hot(const device_array<I>& indices, index_t depth, index_t first, index_t local_depth, T on,
                        T off) {
  if constexpr (std::floating_point<I>) {
    const std::vector<I> host = indices.to_vector();
    detail::cd::require_integer_indices(host.data(), host.size());
  }
  if (local_depth < 0) throw error("one_hot: depth must not be negative: depth " + std::to_string(local_depth));
  std::vector<std::size_t> shape = indices.shape();
  shape.push_back(std::size_t(local_depth));
  device_array<T> out(shape);
  const std::int64_t count = std::int64_t(indices.size());
  detail::launch_over("one_hot", count * local_depth, detail::one_hot_kernel<T, I>, indices.data(), out.data(), count,
                      depth, first, local_depth, on, off);
  return out;
}

/// x's elements converted to To (static_cast), same shape.
template <class To, class From>
device_array<To> convert(const device_array<From>& x) {
  device_array<To> y(x.shape());
  const std::int64_t n = std::int64_t(x.size());
  detail::launch_over("convert", n, detail::convert_kernel<To, From>, x.data(), y.data(), n);
  return y;
}

}  // namespace tessera::kernels::cuda
