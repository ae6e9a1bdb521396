// What the CUDA kernels share: the grid-stride element kernels every element-wise,
// broadcast and spread operation is an instance of (contiguous, with 16-byte vector
// loads where the data allows, or through a strided index map), one kernel over many
// arrays at once (multi_map: an optimizer's step over a network), and shape helpers
// that reuse the CPU kernels' shape rules and error texts. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <array>
#include <span>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/cuda/runtime.hpp>
#include <tessera/kernels/cpu/common.hpp>

namespace tessera::kernels::cuda {

using tessera::cuda::device_array;

namespace detail {

using shape_vec = std::vector<std::size_t>;
namespace cd = tessera::kernels::cpu::detail;

inline std::int64_t count_of(const shape_vec& s) {
  std::int64_t n = 1;
  for (std::size_t e : s) n *= std::int64_t(e);
  return n;
}

#define TESSERA_GRID_STRIDE(i, n)                                                        \
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += std::int64_t(gridDim.x) * blockDim.x)

// ---- contiguous element kernels: out[i] = f(in0[i], ...) ------------------------------

/// 16 bytes of T, loaded and stored in one instruction.
template <class T>
struct alignas(16) vec16 {
  static constexpr int n = int(16 / sizeof(T));
  T v[n];
};

template <class T, class F, class... In>
__global__ void map_kernel(T* out, std::int64_t n, F f, const In*... in) {
  TESSERA_GRID_STRIDE(i, n) out[i] = f(in[i]...);
}

// The same over 16-byte vectors (n counts vectors); every pointer 16-byte aligned.
template <class T, class F, class... In>
__global__ void map_vec_kernel(vec16<T>* out, std::int64_t n, F f, const vec16<In>*... in) {
  TESSERA_GRID_STRIDE(i, n) {
    vec16<T> o;
#pragma unroll
    for (int k = 0; k < vec16<T>::n; ++k) o.v[k] = f(in[i].v[k]...);
    out[i] = o;
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// out[i] = f(in[i]...) over n contiguous elements of same-size arrays, on tessera's
/// stream: vector loads for the bulk, a scalar kernel for the tail.
template <class T, class F, class... In>
void map_contiguous(const char* name, T* out, std::int64_t n, F f, const In*... in) {
  if (n <= 0) return;
  static_assert(((sizeof(In) == sizeof(T)) && ...), "map_contiguous: operands of one element size");
  constexpr int V = vec16<T>::n;
  std::int64_t done = 0;
  if (V > 1 && aligned16(out) && (aligned16(in) && ...) && n >= V) {
    const std::int64_t nv = n / V;
    map_vec_kernel<<<tessera::cuda::grid_for(nv), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
        reinterpret_cast<vec16<T>*>(out), nv, f, reinterpret_cast<const vec16<In>*>(in)...);
    tessera::cuda::check_launch(name);
    done = nv * V;
  }
  if (done < n) {
    map_kernel<<<tessera::cuda::grid_for(n - done), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
        out + done, n - done, f, (in + done)...);
    tessera::cuda::check_launch(name);
  }
}

// ---- element kernels over many arrays at once: f(a0[i], a1[i], ...) ----------------------

/// What one launch of multi_map_kernel covers: `groups` groups of K arrays (group j: K
/// arrays at ptr[0..K)[j]), the launch's elements numbered group after group (group j's
/// are [start[j], start[j + 1])). Passed by value as the kernel's parameter, under the
/// 4 KB every CUDA version takes.
template <class T, int K>
struct multi_batch {
  static constexpr int max_groups = 3600 / int(sizeof(void*) * (K + 1));
  T* ptr[K][max_groups];
  std::int64_t start[max_groups + 1];
  int groups;
};

template <class T, int K, class F, std::size_t... I>
__device__ __forceinline__ void call_at(const F& f, T* const (&q)[K], std::int64_t e, std::index_sequence<I...>) {
  f(q[I][e]...);
}

// The batch is read where it lies, in the kernel's parameter space (no reference to it
// is taken, which would copy it to each thread's local memory); a thread keeps its
// current group's K pointers in registers.
template <class T, int K, class F>
__global__ void multi_map_kernel(multi_batch<T, K> b, F f) {
  int j = -1;
  std::int64_t first = 0, next = 0;  // group j's elements are [first, next)
  T* q[K];
  TESSERA_GRID_STRIDE(i, b.start[b.groups]) {
    if (i >= next) {  // a thread's i only grows: its group only moves on
      do ++j;
      while (i >= b.start[j + 1]);
      first = b.start[j];
      next = b.start[j + 1];
#pragma unroll
      for (int k = 0; k < K; ++k) q[k] = b.ptr[k][j];
    }
    call_at<T, K>(f, q, i - first, std::make_index_sequence<std::size_t(K)>{});
  }
}

/// f(arrays[j][0][i], ..., arrays[j][K-1][i]) (references to the elements) for every
/// group j and every i < sizes[j], a grid-stride loop over all the groups' elements in
/// as few launches as multi_batch holds groups (K = 3: 112 a launch): the per-array
/// kernels of many small arrays (a network's parameters in an optimizer's step) become
/// one or two. f may write any operand; the groups' arrays must not overlap.
template <class T, int K, class F>
void multi_map(const char* name, std::span<const std::array<T*, K>> arrays, std::span<const std::int64_t> sizes, F f) {
  using batch = multi_batch<T, K>;
  static_assert(sizeof(batch) + sizeof(F) <= 4000, "multi_map: the batch must fit the 4 KB of a kernel's parameters");
  batch b;
  b.groups = 0;
  b.start[0] = 0;
  const auto launch = [&] {
    if (b.groups > 0) {
      multi_map_kernel<T, K><<<tessera::cuda::grid_for(b.start[b.groups]), tessera::cuda::block_threads, 0,
                               tessera::cuda::stream()>>>(b, f);
      tessera::cuda::check_launch(name);
    }
    b.groups = 0;
  };
  for (std::size_t j = 0; j < arrays.size(); ++j) {
    if (sizes[j] <= 0) continue;
    if (b.groups == batch::max_groups) launch();
    for (int k = 0; k < K; ++k) b.ptr[k][b.groups] = arrays[j][std::size_t(k)];
    b.start[b.groups + 1] = b.start[b.groups] + sizes[j];
    ++b.groups;
  }
  launch();
}

// ---- strided element kernels: out[i] = f(in_k[offset_k(i)]...) --------------------------

template <class T, int K, class F, std::size_t... I, class... In>
__device__ T apply_at(const std::int64_t (&off)[K], const F& f, std::index_sequence<I...>, const In*... in) {
  return f(in[off[I]]...);
}

template <class T, int K, class F, class... In>
__global__ void map_strided_kernel(T* out, std::int64_t n, tessera::cuda::strided_map<K> m, F f,
                                   const In*... in) {
  TESSERA_GRID_STRIDE(i, n) {
    std::int64_t off[K];
    m.offsets(i, off);
    out[i] = apply_at<T, K>(off, f, std::make_index_sequence<sizeof...(In)>{}, in...);
  }
}

/// A strided map over `shape` with one operand per entry of `strides` (element strides
/// over shape's dims; 0 = broadcast).
template <int K>
tessera::cuda::strided_map<K> make_map(const shape_vec& shape, const std::array<cd::stride_type, K>& strides) {
  tessera::cuda::strided_map<K> m;
  m.ndim = int(shape.size());
  for (int d = 0; d < m.ndim; ++d) {
    m.shape[d] = std::int64_t(shape[std::size_t(d)]);
    for (int k = 0; k < K; ++k) m.stride[k][d] = strides[std::size_t(k)][std::size_t(d)];
  }
  return m;
}

/// out (contiguous, `shape`) [i] = f(in_k at its strided offset) for each operand.
template <class T, int K, class F, class... In>
void map_strided(const char* name, T* out, const shape_vec& shape, const tessera::cuda::strided_map<K>& m, F f,
                 const In*... in) {
  const std::int64_t n = count_of(shape);
  if (n <= 0) return;
  map_strided_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      out, n, m, f, in...);
  tessera::cuda::check_launch(name);
}

}  // namespace detail

}  // namespace tessera::kernels::cuda
