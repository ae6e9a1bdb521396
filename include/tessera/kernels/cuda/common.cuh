// What the CUDA kernels share: the grid-stride element kernels every element-wise,
// broadcast and spread operation is an instance of (contiguous, with 16-byte vector
// loads where the data allows, or through a strided index map), and shape helpers
// that reuse the CPU kernels' shape rules and error texts. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <array>
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
