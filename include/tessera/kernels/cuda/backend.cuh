// The GPU's kernels under backend<cuda_device>'s names (kernels/backend.hpp): thin
// forwards to kernels/cuda/, which does the math on cuda::device_array shards on
// tessera's stream. nvcc only.
#pragma once

#include <vector>
#include <tessera/core/extents.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/cuda/elementwise.cuh>
#include <tessera/kernels/cuda/matmul.cuh>
#include <tessera/kernels/cuda/optim.cuh>
#include <tessera/kernels/cuda/reduce.cuh>
#include <tessera/kernels/cuda/softmax.cuh>
#include <tessera/tensor/cuda_storage.cuh>

namespace tessera::kernels {

template <>
struct backend<cuda_device> {
  template <class T>
  using array = tessera::cuda::device_array<T>;

  // ---- element-wise ----
  template <class T> static array<T> add(const array<T>& a, const array<T>& b) { return cuda::add(a, b); }
  template <class T> static array<T> sub(const array<T>& a, const array<T>& b) { return cuda::sub(a, b); }
  template <class T> static array<T> mul(const array<T>& a, const array<T>& b) { return cuda::mul(a, b); }
  template <class T> static array<T> div(const array<T>& a, const array<T>& b) { return cuda::div(a, b); }
  template <class T> static array<T> relu(const array<T>& x) { return cuda::relu(x); }
  template <class T> static array<T> exp(const array<T>& x) { return cuda::exp(x); }
  template <class T> static array<T> log(const array<T>& x) { return cuda::log(x); }
  template <class T> static array<T> neg(const array<T>& x) { return cuda::neg(x); }
  template <class T> static array<T> relu_grad(const array<T>& dy, const array<T>& x) { return cuda::relu_grad(dy, x); }
  template <class T> static array<T> bias_add(const array<T>& x, const array<T>& b) { return cuda::bias_add(x, b); }
  template <class T>
  static array<T> reduce_to_shape(const array<T>& g, const extents& shape) {
    return cuda::reduce_to_shape(g, detail::shape_vector(shape));
  }
  template <class T> static void scale(array<T>& x, T s) { cuda::scale(x, s); }
  template <class T> static void add_to(array<T>& dst, const array<T>& src) { cuda::add_to(dst, src); }

  // ---- matrix products ----
  template <class T>
  static array<T> matmul(const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::matmul(a, b, ta, tb);
  }
  template <class T>
  static array<T> matmul_grad_a(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::matmul_grad_a(dc, a, b, ta, tb);
  }
  template <class T>
  static array<T> matmul_grad_b(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::matmul_grad_b(dc, a, b, ta, tb);
  }

  // ---- reductions ----
  template <class T>
  static array<T> reduce_sum(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cuda::reduce_sum(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_max(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cuda::reduce_max(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_sum_grad(const array<T>& dy, const extents& x_shape, const std::vector<int>& axes,
                                  bool keep) {
    return cuda::reduce_sum_grad(dy, detail::shape_vector(x_shape), axes, keep);
  }
  template <class T>
  static array<T> reduce_max_tie_counts(const array<T>& x, const array<T>& y, const std::vector<int>& axes,
                                        bool keep) {
    return cuda::reduce_max_tie_counts(x, y, axes, keep);
  }
  template <class T>
  static array<T> reduce_max_spread(const array<T>& dy, const array<T>& x, const array<T>& y,
                                    const array<T>& ties, const std::vector<int>& axes, bool keep) {
    return cuda::reduce_max_spread(dy, x, y, ties, axes, keep);
  }

  // ---- cross entropy pieces ----
  template <class T> static array<T> ce_row_max(const array<T>& x) { return cuda::ce_row_max(x); }
  template <class T>
  static array<T> ce_row_terms(const array<T>& x, const array<T>& t, const array<T>& m) {
    return cuda::ce_row_terms(x, t, m);
  }
  template <class T> static array<T> ce_loss(const array<T>& s) { return cuda::ce_loss(s); }
  template <class T>
  static array<T> ce_grad(const array<T>& dloss, const array<T>& x, const array<T>& t, const array<T>& m,
                          const array<T>& s) {
    return cuda::ce_grad(dloss, x, t, m, s);
  }

  // ---- optimizer updates ----
  template <class T>
  static void momentum_update(array<T>& param, array<T>& accum, const array<T>& grad, T lr, T momentum) {
    cuda::momentum_update(param, accum, grad, lr, momentum);
  }
};

}  // namespace tessera::kernels
