// Reductions on device arrays, the GPU twins of kernels/cpu/reduce.hpp: sum and max
// over a list of axes (keep_dims or not), the sum's gradient, a broadcast's backward
// (reduce_to_shape), and the pieces of a sharded ReduceMax's gradient (tie counts and
// the spread over ties). Same shape rules and error texts as the CPU kernels.
//
// One reduction kernel serves every case. An output element o combines `count` input
// elements; its inputs are contiguous (the reduced dims are the last ones: a row),
// strided by the number of outputs (the reduced dims are the first ones: a column),
// or anywhere (a strided map). Long reductions give each output one or several blocks
// (split into chunks whose partial results a second pass combines, so that even one
// output keeps every SM busy); short ones, and columns, one thread per output (per
// chunk). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/kernels/cpu/reduce.hpp>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/kernels/cuda/elementwise.cuh>

namespace tessera::kernels::cuda {

namespace detail {

struct sum_r {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
// A NaN wins, as in the CPU kernels (v != v only for NaN).
struct max_r {
  template <class T> __device__ T operator()(T a, T b) const { return (b > a || b != b) ? b : a; }
};

enum class reduce_kind : int { row, column, general };

/// Where the `count` inputs of each of the `outputs` results lie.
struct reduce_geom {
  std::int64_t outputs = 1, count = 1;
  reduce_kind kind = reduce_kind::general;
  tessera::cuda::strided_map<1> kept;  // o -> offset of its first input (general)
  tessera::cuda::strided_map<1> red;   // r -> offset within the slice (general)

  __device__ std::int64_t base(std::int64_t o) const {
    if (kind == reduce_kind::row) return o * count;
    if (kind == reduce_kind::column) return o;
    std::int64_t off[1];
    kept.offsets(o, off);
    return off[0];
  }
  __device__ std::int64_t at(std::int64_t base, std::int64_t r) const {
    if (kind == reduce_kind::row) return base + r;
    if (kind == reduce_kind::column) return base + r * outputs;
    std::int64_t off[1];
    red.offsets(r, off);
    return base + off[0];
  }
};

inline reduce_geom make_geom(const shape_vec& in, const std::vector<bool>& mask) {
  reduce_geom g;
  const int n = int(in.size());
  std::vector<std::int64_t> st(std::size_t(n), 1);
  for (int d = n - 2; d >= 0; --d) st[std::size_t(d)] = st[std::size_t(d) + 1] * std::int64_t(in[std::size_t(d) + 1]);
  int first_red = n, last_kept = -1, first_kept = n, last_red = -1;
  for (int d = 0; d < n; ++d) {
    const std::int64_t e = std::int64_t(in[std::size_t(d)]);
    if (mask[std::size_t(d)]) {
      g.count *= e;
      g.red.shape[g.red.ndim] = e;
      g.red.stride[0][g.red.ndim++] = st[std::size_t(d)];
      first_red = std::min(first_red, d);
      last_red = d;
    } else {
      g.outputs *= e;
      g.kept.shape[g.kept.ndim] = e;
      g.kept.stride[0][g.kept.ndim++] = st[std::size_t(d)];
      last_kept = d;
      first_kept = std::min(first_kept, d);
    }
  }
  if (last_kept < first_red) g.kind = reduce_kind::row;          // kept dims, then reduced dims
  else if (last_red < first_kept) g.kind = reduce_kind::column;  // reduced dims, then kept dims
  return g;
}

// Combines v over the block; thread 0 gets the result.
template <class T, class C>
__device__ T block_combine(T v, C comb, T init, T* shared) {
  for (int o = 16; o > 0; o /= 2) v = comb(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  if (warp == 0) {
    v = lane < warps ? shared[lane] : init;
    for (int o = 16; o > 0; o /= 2) v = comb(v, __shfl_down_sync(0xffffffffu, v, o));
  }
  __syncthreads();
  return v;
}

// One block per (output, chunk): out[o * splits + s] combines chunk s of output o.
template <class T, class L, class C>
__global__ void reduce_blocks_kernel(T* out, reduce_geom g, std::int64_t splits, L load, C comb, T init) {
  __shared__ T shared[32];
  const std::int64_t chunk = (g.count + splits - 1) / splits;
  for (std::int64_t b = blockIdx.x; b < g.outputs * splits; b += gridDim.x) {
    const std::int64_t o = b / splits, s = b % splits;
    const std::int64_t r0 = s * chunk, r1 = r0 + chunk < g.count ? r0 + chunk : g.count;
    const std::int64_t base = g.base(o);
    T a0 = init, a1 = init, a2 = init, a3 = init;  // four loads in flight per thread
    const std::int64_t step = blockDim.x;
    std::int64_t r = r0 + threadIdx.x;
    for (; r + 3 * step < r1; r += 4 * step) {
      a0 = comb(a0, load(g.at(base, r), o));
      a1 = comb(a1, load(g.at(base, r + step), o));
      a2 = comb(a2, load(g.at(base, r + 2 * step), o));
      a3 = comb(a3, load(g.at(base, r + 3 * step), o));
    }
    for (; r < r1; r += step) a0 = comb(a0, load(g.at(base, r), o));
    const T v = block_combine(comb(comb(a0, a1), comb(a2, a3)), comb, init, shared);
    if (threadIdx.x == 0) out[b] = v;
  }
}

// The row case of plain loads with 16-byte vectors: one block per (output, chunk) of a
// contiguous row whose length and chunks are multiples of the vector width.
template <class T, class C>
__global__ void reduce_rows_vec_kernel(T* out, const T* x, std::int64_t outputs, std::int64_t count,
                                       std::int64_t splits, C comb, T init) {
  __shared__ T shared[32];
  constexpr int V = vec16<T>::n;
  const std::int64_t chunk = (count / V + splits - 1) / splits;  // in vectors
  for (std::int64_t b = blockIdx.x; b < outputs * splits; b += gridDim.x) {
    const std::int64_t o = b / splits, s = b % splits;
    const std::int64_t v0 = s * chunk, v1 = v0 + chunk < count / V ? v0 + chunk : count / V;
    const vec16<T>* row = reinterpret_cast<const vec16<T>*>(x + o * count);
    T a0 = init, a1 = init;
    std::int64_t v = v0 + threadIdx.x;
    for (; v + blockDim.x < v1; v += 2 * blockDim.x) {
      const vec16<T> p = row[v], q = row[v + blockDim.x];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        a0 = comb(a0, p.v[k]);
        a1 = comb(a1, q.v[k]);
      }
    }
    if (v < v1) {
      const vec16<T> p = row[v];
#pragma unroll
      for (int k = 0; k < V; ++k) a0 = comb(a0, p.v[k]);
    }
    const T r = block_combine(comb(a0, a1), comb, init, shared);
    if (threadIdx.x == 0) out[b] = r;
  }
}

// The column case of plain loads: x is (count, outputs) row-major and each output a
// column. A block of 32 x 8 threads takes 32 vectors of columns (a 512-byte row
// segment per warp) over a chunk of rows, 8 rows at a time; the 8 row partials meet in
// shared memory. out[o * splits + s] as the other kernels.
template <class T, class C>
__global__ void reduce_columns_vec_kernel(T* out, const T* x, std::int64_t outputs, std::int64_t count,
                                          std::int64_t splits, C comb, T init) {
  constexpr int V = vec16<T>::n;
  __shared__ vec16<T> part[8][32];
  const std::int64_t width = outputs / V;  // row length in vectors
  const std::int64_t tiles = (width + 31) / 32;
  const std::int64_t chunk = (count + splits - 1) / splits;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  for (std::int64_t b = blockIdx.x; b < tiles * splits; b += gridDim.x) {
    const std::int64_t tile = b % tiles, s = b / tiles;
    const std::int64_t col = tile * 32 + tx;
    const std::int64_t r0 = s * chunk, r1 = r0 + chunk < count ? r0 + chunk : count;
    vec16<T> a0, a1;
#pragma unroll
    for (int k = 0; k < V; ++k) a0.v[k] = a1.v[k] = init;
    if (col < width) {
      const vec16<T>* p = reinterpret_cast<const vec16<T>*>(x) + col;
      std::int64_t r = r0 + ty;
      for (; r + 8 < r1; r += 16) {
        const vec16<T> u = p[r * width], w = p[(r + 8) * width];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          a0.v[k] = comb(a0.v[k], u.v[k]);
          a1.v[k] = comb(a1.v[k], w.v[k]);
        }
      }
      if (r < r1) {
        const vec16<T> u = p[r * width];
#pragma unroll
        for (int k = 0; k < V; ++k) a0.v[k] = comb(a0.v[k], u.v[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) a0.v[k] = comb(a0.v[k], a1.v[k]);
    part[ty][tx] = a0;
    __syncthreads();
    if (ty == 0 && col < width) {
      vec16<T> t = part[0][tx];
      for (int y = 1; y < 8; ++y)
#pragma unroll
        for (int k = 0; k < V; ++k) t.v[k] = comb(t.v[k], part[y][tx].v[k]);
#pragma unroll
      for (int k = 0; k < V; ++k) out[(col * V + k) * splits + s] = t.v[k];
    }
    __syncthreads();
  }
}

// One thread per (output, chunk): out[o * splits + s].
template <class T, class L, class C>
__global__ void reduce_threads_kernel(T* out, reduce_geom g, std::int64_t splits, L load, C comb, T init) {
  const std::int64_t chunk = (g.count + splits - 1) / splits;
  // Consecutive threads take consecutive outputs (coalesced for columns).
  TESSERA_GRID_STRIDE(t, g.outputs * splits) {
    const std::int64_t s = t / g.outputs, o = t % g.outputs;
    const std::int64_t r0 = s * chunk, r1 = r0 + chunk < g.count ? r0 + chunk : g.count;
    const std::int64_t base = g.base(o);
    T acc = init;
    for (std::int64_t r = r0; r < r1; ++r) acc = comb(acc, load(g.at(base, r), o));
    out[o * splits + s] = acc;
  }
}

template <class T>
struct load_plain {
  const T* x;
  __device__ T operator()(std::int64_t off, std::int64_t) const { return x[off]; }
};
// 1 where x equals its slice's result y[o], else 0.
template <class T>
struct load_tie {
  const T* x;
  const T* y;
  __device__ T operator()(std::int64_t off, std::int64_t o) const { return x[off] == y[o] ? T(1) : T(0); }
};

template <class T>
const T* load_pointer(const load_plain<T>& l) {
  return l.x;
}
template <class L>
const void* load_pointer(const L&) {
  return nullptr;
}

inline int sm_count() {
  static const int n = [] {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, tessera::cuda::current_device()) != cudaSuccess)
      v = 80;
    return v;
  }();
  return n;
}

/// Reduces into `out` (g.outputs elements) with `load` and `comb`, starting at `init`.
template <class T, class L, class C>
void run_reduce(const char* name, T* out, const reduce_geom& g, L load, C comb, T init) {
  if (g.outputs == 0) return;
  const cudaStream_t st = tessera::cuda::stream();
  const std::int64_t busy_threads = std::int64_t(sm_count()) * 2048;
  constexpr int V = vec16<T>::n;
  const bool columns_vec = std::is_same_v<L, load_plain<T>> && g.kind == reduce_kind::column && g.count > 32 &&
                           g.outputs % V == 0 && aligned16(load_pointer(load));
  const bool by_threads = !columns_vec && (g.count <= 32 || (g.kind == reduce_kind::column && g.outputs >= 32));
  std::int64_t splits = 1;
  if (columns_vec) {
    const std::int64_t tiles = (g.outputs / V + 31) / 32, busy_blocks = std::int64_t(sm_count()) * 8;
    if (tiles < busy_blocks) splits = std::min<std::int64_t>((busy_blocks + tiles - 1) / tiles, (g.count + 63) / 64);
  } else if (by_threads) {
    if (g.outputs < busy_threads) splits = std::min<std::int64_t>((busy_threads + g.outputs - 1) / g.outputs, (g.count + 31) / 32);
  } else {
    const std::int64_t busy_blocks = std::int64_t(sm_count()) * 8;
    if (g.outputs < busy_blocks) splits = std::min<std::int64_t>((busy_blocks + g.outputs - 1) / g.outputs, (g.count + 4095) / 4096);
  }
  if (splits < 1) splits = 1;
  device_array<T> partial;
  T* dst = out;
  if (splits > 1) {
    partial = device_array<T>(shape_vec{std::size_t(g.outputs), std::size_t(splits)});
    dst = partial.data();
  }
  if (columns_vec) {
    if constexpr (std::is_same_v<L, load_plain<T>>) {
      const std::int64_t blocks = (g.outputs / V + 31) / 32 * splits;
      reduce_columns_vec_kernel<<<unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16), tessera::cuda::block_threads,
                                  0, st>>>(dst, load.x, g.outputs, g.count, splits, comb, init);
    }
  } else if (by_threads) {
    reduce_threads_kernel<<<tessera::cuda::grid_for(g.outputs * splits), tessera::cuda::block_threads, 0, st>>>(
        dst, g, splits, load, comb, init);
  } else if constexpr (std::is_same_v<L, load_plain<T>>) {
    const std::int64_t blocks = g.outputs * splits;
    const unsigned grid = unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16);
    if (g.kind == reduce_kind::row && g.count % V == 0 && aligned16(load.x))
      reduce_rows_vec_kernel<<<grid, tessera::cuda::block_threads, 0, st>>>(dst, load.x, g.outputs, g.count, splits,
                                                                            comb, init);
    else
      reduce_blocks_kernel<<<grid, tessera::cuda::block_threads, 0, st>>>(dst, g, splits, load, comb, init);
  } else {
    const std::int64_t blocks = g.outputs * splits;
    reduce_blocks_kernel<<<unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16), tessera::cuda::block_threads, 0, st>>>(
        dst, g, splits, load, comb, init);
  }
  tessera::cuda::check_launch(name);
  if (splits > 1) {  // combine each output's partial results: rows of `splits`
    reduce_geom g2;
    g2.outputs = g.outputs;
    g2.count = splits;
    g2.kind = reduce_kind::row;
    run_reduce(name, out, g2, load_plain<T>{partial.data()}, comb, init);
  }
}

template <class T>
constexpr T lowest() {
  if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}

/// "reduce_max: cannot reduce over an empty dim: dim 1 of x (2, 0) has extent 0"
inline void require_nonempty(const char* fn, const shape_vec& s, const std::vector<bool>& mask) {
  for (std::size_t d = 0; d < s.size(); ++d)
    if (mask[d] && s[d] == 0)
      throw error(std::string(fn) + ": cannot reduce over an empty dim: dim " + std::to_string(d) + " of x " +
                  cd::shape_text(s) + " has extent 0");
}

/// The CPU kernels' check of dy against the reduction's result shape, and its text.
inline void require_dy_shape(const char* fn, const shape_vec& dy, const cd::reduction& r, const shape_vec& in,
                             const std::vector<int>& axes, bool keep_dims) {
  if (!cd::same_shape(dy, r.out_shape))
    throw error(std::string(fn) + ": dy is " + cd::shape_text(dy) + ", expected " + cd::shape_text(r.out_shape) +
                " (the reduction of " + cd::shape_text(in) + " over axes " + cd::list_text(axes) +
                " with keep_dims " + cd::bool_text(keep_dims) + ")");
}

template <class T, class L, class C>
device_array<T> reduce_over(const char* fn, const device_array<T>& x, const std::vector<int>& axes, bool keep,
                            L load, C comb, T init) {
  const cd::reduction r = cd::plan_reduction(fn, x.shape(), axes, keep);
  device_array<T> out(shape_vec(r.out_shape.begin(), r.out_shape.end()));
  run_reduce(fn, out.data(), make_geom(x.shape(), cd::axes_mask(axes, x.dimension(), fn)), load, comb, init);
  return out;
}

struct spread_f {
  template <class T> __device__ T operator()(T g) const { return g; }
};
template <class T>
struct spread_ties_f {
  __device__ T operator()(T x, T y, T g, T n) const { return x == y ? g / n : T(0); }
};

}  // namespace detail

/// The sum over `axes` (empty: every dim), keep_dims as in the CPU kernel.
template <class T>
device_array<T> reduce_sum(const device_array<T>& x, const std::vector<int>& axes = {}, bool keep_dims = false) {
  return detail::reduce_over("reduce_sum", x, axes, keep_dims, detail::load_plain<T>{x.data()}, detail::sum_r{}, T(0));
}

/// The maximum over `axes` (a NaN in a slice gives NaN); an empty reduced dim is an error.
template <class T>
device_array<T> reduce_max(const device_array<T>& x, const std::vector<int>& axes = {}, bool keep_dims = false) {
  (void)kernels::cpu::detail::plan_reduction("reduce_max", x.shape(), axes, keep_dims);  // axis checks first
  detail::require_nonempty("reduce_max", x.shape(), kernels::cpu::detail::axes_mask(axes, x.dimension(), "reduce_max"));
  return detail::reduce_over("reduce_max", x, axes, keep_dims, detail::load_plain<T>{x.data()}, detail::max_r{},
                             detail::lowest<T>());
}

/// The gradient of reduce_sum: dy broadcast back to `input_shape`.
template <class T>
device_array<T> reduce_sum_grad(const device_array<T>& dy, const std::vector<std::size_t>& input_shape,
                                const std::vector<int>& axes = {}, bool keep_dims = false) {
  namespace cd = kernels::cpu::detail;
  const cd::reduction r = cd::plan_reduction("reduce_sum_grad", input_shape, axes, keep_dims);
  detail::require_dy_shape("reduce_sum_grad", dy.shape(), r, input_shape, axes, keep_dims);
  device_array<T> dx(input_shape);
  detail::map_strided("reduce_sum_grad", dx.data(), input_shape, detail::make_map<1>(input_shape, {r.strides}),
                      detail::spread_f{}, dy.data());
  return dx;
}

/// Sums `grad` back to `shape`, the shape of an operand that was broadcast to grad's.
template <class T>
device_array<T> reduce_to_shape(const device_array<T>& grad, const std::vector<std::size_t>& shape) {
  namespace cd = kernels::cpu::detail;
  if (!cd::broadcasts_to(shape, grad.shape()))
    throw error("reduce_to_shape: shape " + cd::shape_text(shape) + " does not broadcast to the gradient's shape " +
                cd::shape_text(grad.shape()));
  if (cd::same_shape(shape, grad.shape())) return grad;
  const std::size_t lead = grad.dimension() - shape.size();
  std::vector<int> axes;
  for (std::size_t d = 0; d < grad.dimension(); ++d)
    if (d < lead || (shape[d - lead] == 1 && grad.shape()[d] != 1)) axes.push_back(int(d));
  device_array<T> out = axes.empty() ? grad : reduce_sum(grad, axes, false);
  out.reshape(shape);
  return out;
}

/// Per element of y (each slice's GLOBAL maximum), how many elements of this shard x
/// equal it (kernels/cpu/reduce.hpp's reduce_max_tie_counts).
template <class T>
device_array<T> reduce_max_tie_counts(const device_array<T>& x, const device_array<T>& y, const std::vector<int>& axes,
                                      bool keep_dims) {
  return detail::reduce_over("reduce_max_backward", x, axes, keep_dims, detail::load_tie<T>{x.data(), y.data()},
                             detail::sum_r{}, T(0));
}

/// dx = dy / ties where x equals its slice's maximum y, else 0.
template <class T>
device_array<T> reduce_max_spread(const device_array<T>& dy, const device_array<T>& x, const device_array<T>& y,
                                  const device_array<T>& ties, const std::vector<int>& axes, bool keep_dims) {
  namespace cd = kernels::cpu::detail;
  const cd::reduction r = cd::plan_reduction("reduce_max_backward", x.shape(), axes, keep_dims);
  device_array<T> dx(x.shape());
  const cd::stride_type own = cd::row_major_strides(x.shape());
  detail::map_strided("reduce_max_backward", dx.data(), x.shape(),
                      detail::make_map<4>(x.shape(), {own, r.strides, r.strides, r.strides}),
                      detail::spread_ties_f<T>{}, x.data(), y.data(), dy.data(), ties.data());
  return dx;
}

}  // namespace tessera::kernels::cuda
