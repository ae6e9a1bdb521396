// The host's kernels under backend<cpu_device>'s names (kernels/backend.hpp): thin
// forwards to kernels/cpu/, which does the math on xt::xarray shards.
#pragma once

#include <cstddef>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/cpu/elementwise.hpp>
#include <tessera/kernels/cpu/matmul.hpp>
#include <tessera/kernels/cpu/reduce.hpp>
#include <tessera/kernels/cpu/softmax.hpp>
#include <tessera/tensor/host_storage.hpp>

namespace tessera::kernels {

template <>
struct backend<cpu_device> {
  template <class T>
  using array = xt::xarray<T>;

  // ---- element-wise ----
  template <class T> static array<T> add(const array<T>& a, const array<T>& b) { return cpu::add(a, b); }
  template <class T> static array<T> sub(const array<T>& a, const array<T>& b) { return cpu::sub(a, b); }
  template <class T> static array<T> mul(const array<T>& a, const array<T>& b) { return cpu::mul(a, b); }
  template <class T> static array<T> div(const array<T>& a, const array<T>& b) { return cpu::div(a, b); }
  template <class T> static array<T> relu(const array<T>& x) { return cpu::relu(x); }
  template <class T> static array<T> exp(const array<T>& x) { return cpu::exp(x); }
  template <class T> static array<T> log(const array<T>& x) { return cpu::log(x); }
  template <class T> static array<T> neg(const array<T>& x) { return cpu::neg(x); }
  template <class T> static array<T> relu_grad(const array<T>& dy, const array<T>& x) { return cpu::relu_grad(dy, x); }
  template <class T> static array<T> bias_add(const array<T>& x, const array<T>& b) { return cpu::bias_add(x, b); }
  template <class T>
  static array<T> reduce_to_shape(const array<T>& g, const extents& shape) {
    return cpu::reduce_to_shape(g, detail::shape_vector(shape));
  }
  template <class T>
  static void scale(array<T>& x, T s) {
    for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] *= s;
  }
  template <class T>
  static void add_to(array<T>& dst, const array<T>& src) {
    for (std::size_t i = 0; i < dst.size(); ++i) dst.data()[i] += src.data()[i];
  }

  // ---- matrix products ----
  template <class T>
  static array<T> matmul(const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::matmul(a, b, ta, tb);
  }
  template <class T>
  static array<T> matmul_grad_a(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::matmul_grad_a(dc, a, b, ta, tb);
  }
  template <class T>
  static array<T> matmul_grad_b(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::matmul_grad_b(dc, a, b, ta, tb);
  }

  // ---- reductions ----
  template <class T>
  static array<T> reduce_sum(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cpu::reduce_sum(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_max(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cpu::reduce_max(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_sum_grad(const array<T>& dy, const extents& x_shape, const std::vector<int>& axes,
                                  bool keep) {
    return cpu::reduce_sum_grad(dy, detail::shape_vector(x_shape), axes, keep);
  }
  template <class T>
  static array<T> reduce_max_tie_counts(const array<T>& x, const array<T>& y, const std::vector<int>& axes,
                                        bool keep) {
    return cpu::reduce_max_tie_counts(x, y, axes, keep);
  }
  template <class T>
  static array<T> reduce_max_spread(const array<T>& dy, const array<T>& x, const array<T>& y,
                                    const array<T>& ties, const std::vector<int>& axes, bool keep) {
    return cpu::reduce_max_spread(dy, x, y, ties, axes, keep);
  }

  // ---- cross entropy pieces ----
  template <class T> static array<T> ce_row_max(const array<T>& x) { return cpu::ce_row_max(x); }
  template <class T>
  static array<T> ce_row_terms(const array<T>& x, const array<T>& t, const array<T>& m) {
    return cpu::ce_row_terms(x, t, m);
  }
  template <class T> static array<T> ce_loss(const array<T>& s) { return cpu::ce_loss(s); }
  template <class T>
  static array<T> ce_grad(const array<T>& dloss, const array<T>& x, const array<T>& t, const array<T>& m,
                          const array<T>& s) {
    return cpu::ce_grad(dloss, x, t, m, s);
  }

  // ---- optimizer updates ----
  /// accum = momentum * accum + grad; param -= lr * accum (MindSpore's Momentum).
  template <class T>
  static void momentum_update(array<T>& param, array<T>& accum, const array<T>& grad, T lr, T momentum) {
    T* p = param.data();
    T* a = accum.data();
    const T* g = grad.data();
    for (std::size_t i = 0; i < param.size(); ++i) {
      a[i] = momentum * a[i] + g[i];
      p[i] -= lr * a[i];
    }
  }
};

}  // namespace tessera::kernels
