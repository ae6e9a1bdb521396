// Element functors of fused element-wise chains, written once for the host and the GPU:
// each is callable in host code and, compiled by nvcc, in device code (TESSERA_HD), so
// backend<D>::map and bias_map run the same arithmetic on every device in one pass over
// memory. The activations of nn::dense (identity, ReLU, sigmoid, tanh) and the backward
// chains of the element-wise operators live here. Standard library only.
#pragma once

#include <cmath>
#include <string_view>

#if defined(__CUDACC__)
/// Callable from host and device code (nvcc); plain host functions otherwise.
#define TESSERA_HD __host__ __device__
#else
#define TESSERA_HD
#endif

namespace tessera::kernels::fused {

/// e^v with the device's own exp in device code and the C library's on the host.
TESSERA_HD inline float exp_of(float v) {
#if defined(__CUDA_ARCH__)
  return expf(v);
#else
  return std::exp(v);
#endif
}
TESSERA_HD inline double exp_of(double v) {
#if defined(__CUDA_ARCH__)
  return ::exp(v);
#else
  return std::exp(v);
#endif
}
TESSERA_HD inline float tanh_of(float v) {
#if defined(__CUDA_ARCH__)
  return tanhf(v);
#else
  return std::tanh(v);
#endif
}
TESSERA_HD inline double tanh_of(double v) {
#if defined(__CUDA_ARCH__)
  return ::tanh(v);
#else
  return std::tanh(v);
#endif
}

// ---- activations: value(x), and the derivative from the output, dy * f'(x) with y = f(x)

/// The activations nn::dense fuses into its epilogue. Each has `value(x)` and
/// `grad(dy, y)` = dy * f'(x) computed from the output y = f(x), so a backward pass
/// keeps only the output.
enum class activation { none, relu, sigmoid, tanh };

constexpr std::string_view name(activation a) {
  switch (a) {
    case activation::relu: return "relu";
    case activation::sigmoid: return "sigmoid";
    case activation::tanh: return "tanh";
    default: return "none";
  }
}

template <activation A>
struct act;

template <>
struct act<activation::none> {
  template <class T> TESSERA_HD T value(T x) const { return x; }
  template <class T> TESSERA_HD T grad(T dy, T) const { return dy; }
};
/// max(x, 0); the derivative is 1 where the output is positive (0 at x = 0, as
/// kernels' relu_grad).
template <>
struct act<activation::relu> {
  template <class T> TESSERA_HD T value(T x) const { return x > T(0) ? x : T(0); }
  template <class T> TESSERA_HD T grad(T dy, T y) const { return y > T(0) ? dy : T(0); }
};
/// 1 / (1 + e^-x); f' = y (1 - y).
template <>
struct act<activation::sigmoid> {
  template <class T> TESSERA_HD T value(T x) const { return T(1) / (T(1) + exp_of(-x)); }
  template <class T> TESSERA_HD T grad(T dy, T y) const { return dy * y * (T(1) - y); }
};
/// tanh x; f' = 1 - y^2.
template <>
struct act<activation::tanh> {
  template <class T> TESSERA_HD T value(T x) const { return tanh_of(x); }
  template <class T> TESSERA_HD T grad(T dy, T y) const { return dy * (T(1) - y * y); }
};

/// f(x + b): the bias add and the activation in one pass (bias_map's functor).
template <activation A>
struct bias_act {
  template <class T> TESSERA_HD T operator()(T x, T b) const { return act<A>{}.value(x + b); }
};
/// f(x) alone (map's functor).
template <activation A>
struct act_value {
  template <class T> TESSERA_HD T operator()(T x) const { return act<A>{}.value(x); }
};
/// dy * f'(x) from y = f(x) (map's functor over dy and y).
template <activation A>
struct act_grad {
  template <class T> TESSERA_HD T operator()(T dy, T y) const { return act<A>{}.grad(dy, y); }
};

// ---- backward chains of the element-wise operators -------------------------------------

/// Div's gradient for its divisor: -dy a / b^2, in one pass instead of four.
struct div_grad_divisor {
  template <class T> TESSERA_HD T operator()(T dy, T a, T b) const { return -(dy * a) / (b * b); }
};
/// Exp's gradient from its input: dy e^x, in one pass instead of two.
struct exp_grad {
  template <class T> TESSERA_HD T operator()(T dy, T x) const { return dy * exp_of(x); }
};
/// Log's gradient from its input: dy / x.
struct log_grad {
  template <class T> TESSERA_HD T operator()(T dy, T x) const { return dy / x; }
};
/// Neg's gradient: -dy.
struct neg_grad {
  template <class T> TESSERA_HD T operator()(T dy) const { return -dy; }
};

}  // namespace tessera::kernels::fused
