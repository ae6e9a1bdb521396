// Element-wise kernels on device arrays, the GPU twins of kernels/cpu/elementwise.hpp
// (same broadcasting rules, same error texts): add, sub, mul, div with NumPy
// broadcasting, relu, exp, log, neg, relu_grad, bias_add, and the in-place scale and
// add_to. Same-shape operands run as one contiguous kernel with 16-byte loads;
// broadcasts through a strided index map. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/kernels/cpu/elementwise.hpp>
#include <tessera/kernels/cuda/common.cuh>

namespace tessera::kernels::cuda {

namespace detail {

struct add_f {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct sub_f {
  template <class T> __device__ T operator()(T a, T b) const { return a - b; }
};
struct mul_f {
  template <class T> __device__ T operator()(T a, T b) const { return a * b; }
};
struct div_f {
  template <class T> __device__ T operator()(T a, T b) const { return a / b; }
};
struct relu_f {
  template <class T> __device__ T operator()(T v) const { return v > T(0) ? v : T(0); }
};
struct exp_f {
  __device__ float operator()(float v) const { return expf(v); }
  __device__ double operator()(double v) const { return ::exp(v); }
};
struct log_f {
  __device__ float operator()(float v) const { return logf(v); }
  __device__ double operator()(double v) const { return ::log(v); }
};
struct neg_f {
  template <class T> __device__ T operator()(T v) const { return -v; }
};
struct relu_grad_f {
  template <class T> __device__ T operator()(T g, T x) const { return x > T(0) ? g : T(0); }
};
template <class T>
struct scale_f {
  T s;
  __device__ T operator()(T v) const { return v * s; }
};

// out[i] = f(full[i], row[i % c]) (or f(row[..], full[i]) when row_first): a row of c
// elements repeated along the leading dims, the bias-add pattern. 32-bit indices, and
// 16-byte vectors when c is a multiple of the vector width.
template <class T, class F, class I>
__global__ void row_broadcast_kernel(T* out, const T* full, const T* row, I n, I c, bool row_first, F f) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    const T r = row[i % c];
    out[i] = row_first ? f(r, full[i]) : f(full[i], r);
  }
}
template <class T, class F, class I>
__global__ void row_broadcast_vec_kernel(vec16<T>* out, const vec16<T>* full, const vec16<T>* row, I nv, I cv,
                                         bool row_first, F f) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < nv; i += I(gridDim.x) * blockDim.x) {
    const vec16<T> x = full[i], r = row[i % cv];
    vec16<T> o;
#pragma unroll
    for (int k = 0; k < vec16<T>::n; ++k) o.v[k] = row_first ? f(r.v[k], x.v[k]) : f(x.v[k], r.v[k]);
    out[i] = o;
  }
}

/// Whether `small` broadcast to `out` is one row repeated: its shape, leading 1s
/// dropped, is the tail of out's.
inline bool is_trailing_row(const shape_vec& small, const shape_vec& out) {
  std::size_t lead = 0;
  while (lead < small.size() && small[lead] == 1) ++lead;
  const std::size_t k = small.size() - lead;
  if (k > out.size()) return false;
  for (std::size_t i = 0; i < k; ++i)
    if (small[lead + i] != out[out.size() - k + i]) return false;
  return true;
}

template <class T, class F>
void row_broadcast(const char* fn, T* out, const T* full, const T* row, std::int64_t n, std::int64_t c, bool row_first,
                   F f) {
  constexpr int V = vec16<T>::n;
  const cudaStream_t st = tessera::cuda::stream();
  const bool vec = c % V == 0 && aligned16(out) && aligned16(full) && aligned16(row);
  const std::int64_t work = vec ? n / V : n;
  const unsigned grid = tessera::cuda::grid_for(work), block = tessera::cuda::block_threads;
  if (vec && n < (std::int64_t(1) << 31))
    row_broadcast_vec_kernel<<<grid, block, 0, st>>>(reinterpret_cast<vec16<T>*>(out), reinterpret_cast<const vec16<T>*>(full),
                                                     reinterpret_cast<const vec16<T>*>(row), unsigned(n / V),
                                                     unsigned(c / V), row_first, f);
  else if (vec)
    row_broadcast_vec_kernel<<<grid, block, 0, st>>>(reinterpret_cast<vec16<T>*>(out), reinterpret_cast<const vec16<T>*>(full),
                                                     reinterpret_cast<const vec16<T>*>(row), n / V, c / V, row_first, f);
  else if (n < (std::int64_t(1) << 31))
    row_broadcast_kernel<<<grid, block, 0, st>>>(out, full, row, unsigned(n), unsigned(c), row_first, f);
  else
    row_broadcast_kernel<<<grid, block, 0, st>>>(out, full, row, n, c, row_first, f);
  tessera::cuda::check_launch(fn);
}

/// out = f(a, b) with broadcasting; the shape check and its text are the CPU kernels'.
/// Same shapes run contiguous, a repeated row (bias add) a row kernel, anything else
/// through the strided map.
template <class T, class F>
device_array<T> broadcast_binary(const char* fn, const device_array<T>& a, const device_array<T>& b, F f) {
  const cd::shape_type out_shape = cd::broadcast_shape(fn, a.shape(), b.shape());
  device_array<T> out(shape_vec(out_shape.begin(), out_shape.end()));
  const bool a_full = cd::same_shape(a.shape(), out.shape()), b_full = cd::same_shape(b.shape(), out.shape());
  if (a_full && b_full) {
    map_contiguous(fn, out.data(), std::int64_t(out.size()), f, a.data(), b.data());
  } else if (out.size() > 0 && a_full && b.size() > 0 && is_trailing_row(b.shape(), out.shape())) {
    row_broadcast(fn, out.data(), a.data(), b.data(), std::int64_t(out.size()), std::int64_t(b.size()), false, f);
  } else if (out.size() > 0 && b_full && a.size() > 0 && is_trailing_row(a.shape(), out.shape())) {
    row_broadcast(fn, out.data(), b.data(), a.data(), std::int64_t(out.size()), std::int64_t(a.size()), true, f);
  } else {
    const auto m = make_map<2>(out.shape(), {cd::broadcast_strides(a.shape(), out.shape()),
                                              cd::broadcast_strides(b.shape(), out.shape())});
    map_strided(fn, out.data(), out.shape(), m, f, a.data(), b.data());
  }
  return out;
}

template <class T, class F>
device_array<T> unary(const char* fn, const device_array<T>& x, F f) {
  device_array<T> out(x.shape());
  map_contiguous(fn, out.data(), std::int64_t(out.size()), f, x.data());
  return out;
}

template <class T>
void require_same_size(const char* fn, const char* na, const device_array<T>& a, const char* nb,
                       const device_array<T>& b) {
  if (!cd::same_shape(a.shape(), b.shape()))
    throw error(std::string(fn) + ": shapes differ: " + na + " is " + cd::shape_text(a.shape()) + ", " + nb +
                " is " + cd::shape_text(b.shape()));
}

}  // namespace detail

template <class T> device_array<T> add(const device_array<T>& a, const device_array<T>& b) {
  return detail::broadcast_binary("add", a, b, detail::add_f{});
}
template <class T> device_array<T> sub(const device_array<T>& a, const device_array<T>& b) {
  return detail::broadcast_binary("sub", a, b, detail::sub_f{});
}
template <class T> device_array<T> mul(const device_array<T>& a, const device_array<T>& b) {
  return detail::broadcast_binary("mul", a, b, detail::mul_f{});
}
template <class T> device_array<T> div(const device_array<T>& a, const device_array<T>& b) {
  return detail::broadcast_binary("div", a, b, detail::div_f{});
}
template <class T> device_array<T> relu(const device_array<T>& x) { return detail::unary("relu", x, detail::relu_f{}); }
template <class T> device_array<T> exp(const device_array<T>& x) { return detail::unary("exp", x, detail::exp_f{}); }
template <class T> device_array<T> log(const device_array<T>& x) { return detail::unary("log", x, detail::log_f{}); }
template <class T> device_array<T> neg(const device_array<T>& x) { return detail::unary("neg", x, detail::neg_f{}); }

/// dy where x > 0, else 0; dy and x of one shape.
template <class T>
device_array<T> relu_grad(const device_array<T>& dy, const device_array<T>& x) {
  detail::require_same_size("relu_grad", "dy", dy, "x", x);
  device_array<T> dx(x.shape());
  detail::map_contiguous("relu_grad", dx.data(), std::int64_t(dx.size()), detail::relu_grad_f{}, dy.data(),
                         x.data());
  return dx;
}

namespace detail {

// out[i] = f(x0[i], xs[i]...) after checking that the operands share x0's shape; out
// holds x0.size() elements and may be x0's own storage (each thread reads its elements
// before it writes them).
template <class T, class F, class... X>
void fused_map_to(const char* fn, F f, T* out, const device_array<T>& x0, const X&... xs) {
  [[maybe_unused]] int k = 0;
  (require_same_size(fn, "operand 0", x0, ("operand " + std::to_string(++k)).c_str(), xs), ...);
  map_contiguous(fn, out, std::int64_t(x0.size()), f, x0.data(), xs.data()...);
}

}  // namespace detail

/// out[i] = f(x0[i], xs[i]...) over device arrays of one shape, in one kernel (16-byte
/// vector loads when aligned): kernels/cpu/elementwise.hpp's fused_map with a functor
/// callable in device code (kernels/fused.hpp's). Same error text as the host's.
template <class T, class F, class... X>
device_array<T> fused_map(const char* fn, F f, const device_array<T>& x0, const X&... xs) {
  device_array<T> out(x0.shape());
  detail::fused_map_to(fn, f, out.data(), x0, xs...);
  return out;
}
/// The same written over x0's own storage, given away (an rvalue), as the host's: an xs
/// may be x0 itself.
template <class T, class F, class... X>
device_array<T> fused_map(const char* fn, F f, device_array<T>&& x0, const X&... xs) {
  detail::fused_map_to(fn, f, x0.data(), x0, xs...);
  return std::move(x0);
}

namespace detail {

// out = f(x, bias) with the bias repeated along the rows (the row-broadcast kernel); out
// may be x. The checks and texts are the host's.
template <class T, class F>
void bias_map_to(const char* fn, const device_array<T>& x, const device_array<T>& bias, T* out, F f) {
  if (x.dimension() == 0) throw error(std::string(fn) + ": x must have at least one dim, x is ()");
  const std::size_t c = x.shape()[x.dimension() - 1];
  if (bias.dimension() != 1 || bias.shape()[0] != c)
    throw error(std::string(fn) + ": bias is " + cd::shape_text(bias.shape()) + ", expected (" + std::to_string(c) +
                ",) for x " + cd::shape_text(x.shape()));
  if (x.size() > 0 && c > 0)
    row_broadcast(fn, out, x.data(), bias.data(), std::int64_t(x.size()), std::int64_t(c), false, f);
}

}  // namespace detail

/// f(x, bias) with the bias (c,) repeated along x's leading dims, in one kernel over x's
/// own storage (pass an rvalue to reuse it): kernels/cpu/elementwise.hpp's
/// fused_bias_map.
template <class T, class F>
device_array<T> fused_bias_map(const char* fn, device_array<T> x, const device_array<T>& bias, F f) {
  detail::bias_map_to(fn, x, bias, x.data(), f);
  return x;
}

/// x + bias along x's last dim: x (..., c), bias (c,). Same errors as the CPU kernel.
template <class T>
device_array<T> bias_add(const device_array<T>& x, const device_array<T>& bias) {
  device_array<T> out(x.shape());
  detail::bias_map_to("bias_add", x, bias, out.data(), detail::add_f{});
  return out;
}

/// x *= s, in place.
template <class T>
void scale(device_array<T>& x, T s) {
  detail::map_contiguous("scale", x.data(), std::int64_t(x.size()), detail::scale_f<T>{s}, x.data());
}

/// dst += src, in place (same size).
template <class T>
void add_to(device_array<T>& dst, const device_array<T>& src) {
  if (dst.size() != src.size())
    throw error("add_to: dst has " + std::to_string(dst.size()) + " elements, src " + std::to_string(src.size()));
  detail::map_contiguous("add_to", dst.data(), std::int64_t(dst.size()), detail::add_f{}, dst.data(), src.data());
}

}  // namespace tessera::kernels::cuda
