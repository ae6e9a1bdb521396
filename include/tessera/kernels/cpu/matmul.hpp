// Matrix products of row-major xt::xarray operands and their gradients, each one
// gemm call (or one per batch entry) with transposes passed as flags, never copied.
//
// Notation: C = op(A) op(B) with op(X) = X^T when X's flag is set; op(A) is m x k,
// op(B) is k x n, C is m x n. A is stored m x k (k x m when trans_a), B k x n (n x k
// when trans_b).
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <string>
#include <string_view>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/blas.hpp>
#include <tessera/kernels/cpu/common.hpp>

namespace tessera::kernels::cpu {

namespace detail {

struct gemm_dims {
  int m = 0, n = 0, k = 0;
};

inline int blas_int(std::size_t v, std::string_view fn) {
  if (v > std::size_t(INT_MAX))
    throw error(std::string(fn) + ": a matrix dim exceeds the BLAS int range: " +
                std::to_string(v));
  return int(v);
}

/// m, n, k of op(A) op(B) for the matrices in the last two dims of `a` and `b`
/// (whose ranks the caller has checked). Throws with both shapes:
/// "matmul: contraction dims differ: a is (8, 8) with trans_a false, b is (4, 16) with
/// trans_b false".
inline gemm_dims product_dims(std::string_view fn, shape_arg a, bool trans_a, shape_arg b,
                              bool trans_b) {
  const std::size_t ar = a.size(), br = b.size();
  const std::size_t a_rows = a[ar - 2], a_cols = a[ar - 1];
  const std::size_t b_rows = b[br - 2], b_cols = b[br - 1];
  const std::size_t ka = trans_a ? a_rows : a_cols, kb = trans_b ? b_cols : b_rows;
  if (ka != kb)
    throw error(std::string(fn) + ": contraction dims differ: a is " + shape_text(a) +
                " with trans_a " + bool_text(trans_a) + ", b is " + shape_text(b) +
                " with trans_b " + bool_text(trans_b));
  return {blas_int(trans_a ? a_cols : a_rows, fn), blas_int(trans_b ? b_rows : b_cols, fn),
          blas_int(ka, fn)};
}

template <class T>
void require_ndim(std::string_view fn, const char* name, const xt::xarray<T>& x, std::size_t lo,
                  std::size_t hi) {
  if (x.dimension() < lo || x.dimension() > hi)
    throw error(std::string(fn) + ": " + name + " must be " + std::to_string(lo) + "-D" +
                (lo == hi ? "" : " or " + std::to_string(hi) + "-D") + ", " + name + " is " +
                shape_text(x));
}

// Leading dims of the stored operands (at least 1, as BLAS requires).
inline int ld_a(const gemm_dims& d, bool trans_a) { return std::max(1, trans_a ? d.m : d.k); }
inline int ld_b(const gemm_dims& d, bool trans_b) { return std::max(1, trans_b ? d.k : d.n); }

/// C (m x n) = op(A) op(B) + beta C.
template <class T>
void product_gemm(const gemm_dims& d, bool trans_a, bool trans_b, const T* a, const T* b, T beta,
                  T* c) {
  gemm(trans_a, trans_b, d.m, d.n, d.k, T(1), a, ld_a(d, trans_a), b, ld_b(d, trans_b), beta, c,
       std::max(1, d.n));
}

/// dA (stored shape of A) = d(op(A))/dA applied to dop(A) = dC op(B)^T, plus beta dA:
///   trans_a false: dA (m x k) = dC op(B)^T  -> gemm(false, !trans_b, dC, B)
///   trans_a true:  dA (k x m) = op(B) dC^T  -> gemm(trans_b, true, B, dC)
template <class T>
void grad_a_gemm(const gemm_dims& d, bool trans_a, bool trans_b, const T* dc, const T* b, T beta,
                 T* da) {
  const int ldc = std::max(1, d.n), ldb = ld_b(d, trans_b);
  if (!trans_a)
    gemm(false, !trans_b, d.m, d.k, d.n, T(1), dc, ldc, b, ldb, beta, da, std::max(1, d.k));
  else
    gemm(trans_b, true, d.k, d.m, d.n, T(1), b, ldb, dc, ldc, beta, da, std::max(1, d.m));
}

/// dB (stored shape of B) from dop(B) = op(A)^T dC, plus beta dB:
///   trans_b false: dB (k x n) = op(A)^T dC  -> gemm(!trans_a, false, A, dC)
///   trans_b true:  dB (n x k) = dC^T op(A)  -> gemm(true, trans_a, dC, A)
template <class T>
void grad_b_gemm(const gemm_dims& d, bool trans_a, bool trans_b, const T* a, const T* dc, T beta,
                 T* db) {
  const int ldc = std::max(1, d.n), lda = ld_a(d, trans_a);
  if (!trans_b)
    gemm(!trans_a, false, d.k, d.n, d.m, T(1), a, lda, dc, ldc, beta, db, std::max(1, d.n));
  else
    gemm(true, trans_a, d.n, d.k, d.m, T(1), dc, ldc, a, lda, beta, db, std::max(1, d.k));
}

template <class T>
void require_shape(std::string_view fn, const char* name, const xt::xarray<T>& x,
                   const shape_type& expected) {
  if (!same_shape(x.shape(), expected))
    throw error(std::string(fn) + ": " + name + " is " + shape_text(x) + ", expected " +
                shape_text(expected));
}

}  // namespace detail

/// C = op(A) op(B) for 2-D a and b. Throws tessera::error when a or b is not 2-D or
/// the contraction dims differ.
/// Example: a (3, 5), b (4, 5): matmul(a, b, false, true) is (3, 4).
template <blas_scalar T>
xt::xarray<T> matmul(const xt::xarray<T>& a, const xt::xarray<T>& b, bool trans_a = false,
                     bool trans_b = false) {
  detail::require_ndim("matmul", "a", a, 2, 2);
  detail::require_ndim("matmul", "b", b, 2, 2);
  const auto d = detail::product_dims("matmul", a.shape(), trans_a, b.shape(), trans_b);
  auto c = detail::empty_array<T>(detail::shape_type{std::size_t(d.m), std::size_t(d.n)});
  detail::product_gemm(d, trans_a, trans_b, a.data(), b.data(), T(0), c.data());
  return c;
}

/// c = op(A) op(B) + beta * c (default beta = 1: accumulate). c must already have
/// shape (m, n) and must not be a or b. beta = 0 overwrites c (NaN included).
template <blas_scalar T>
void matmul_into(xt::xarray<T>& c, const xt::xarray<T>& a, const xt::xarray<T>& b,
                 bool trans_a = false, bool trans_b = false, T beta = T(1)) {
  detail::require_ndim("matmul_into", "a", a, 2, 2);
  detail::require_ndim("matmul_into", "b", b, 2, 2);
  const auto d = detail::product_dims("matmul_into", a.shape(), trans_a, b.shape(), trans_b);
  detail::require_shape("matmul_into", "c", c,
                        detail::shape_type{std::size_t(d.m), std::size_t(d.n)});
  if (&c == &a || &c == &b) throw error("matmul_into: c must not be a or b");
  detail::product_gemm(d, trans_a, trans_b, a.data(), b.data(), beta, c.data());
}

/// For C = op(A) op(B) and dc = dL/dC: dL/dA, shaped like a. One gemm.
template <blas_scalar T>
xt::xarray<T> matmul_grad_a(const xt::xarray<T>& dc, const xt::xarray<T>& a, const xt::xarray<T>& b,
                            bool trans_a = false, bool trans_b = false) {
  detail::require_ndim("matmul_grad_a", "a", a, 2, 2);
  detail::require_ndim("matmul_grad_a", "b", b, 2, 2);
  const auto d = detail::product_dims("matmul_grad_a", a.shape(), trans_a, b.shape(), trans_b);
  detail::require_shape("matmul_grad_a", "dc", dc,
                        detail::shape_type{std::size_t(d.m), std::size_t(d.n)});
  auto da = detail::empty_array<T>(a.shape());
  detail::grad_a_gemm(d, trans_a, trans_b, dc.data(), b.data(), T(0), da.data());
  return da;
}

/// For C = op(A) op(B) and dc = dL/dC: dL/dB, shaped like b. One gemm.
template <blas_scalar T>
xt::xarray<T> matmul_grad_b(const xt::xarray<T>& dc, const xt::xarray<T>& a, const xt::xarray<T>& b,
                            bool trans_a = false, bool trans_b = false) {
  detail::require_ndim("matmul_grad_b", "a", a, 2, 2);
  detail::require_ndim("matmul_grad_b", "b", b, 2, 2);
  const auto d = detail::product_dims("matmul_grad_b", a.shape(), trans_a, b.shape(), trans_b);
  detail::require_shape("matmul_grad_b", "dc", dc,
                        detail::shape_type{std::size_t(d.m), std::size_t(d.n)});
  auto db = detail::empty_array<T>(b.shape());
  detail::grad_b_gemm(d, trans_a, trans_b, a.data(), dc.data(), T(0), db.data());
  return db;
}

namespace detail {

/// The batch geometry of batch_matmul: which operand is batched, the batch size and
/// the per-entry product dims. Throws on ranks or batch sizes that do not fit.
struct batch_geometry {
  gemm_dims d;
  std::size_t batch = 0;
  bool a_batched = false, b_batched = false;
  std::size_t a_step = 0, b_step = 0, c_step = 0;  // elements between batch entries
  /// A batched and not transposed, B shared: the batch folds into m, and the
  /// product (or a gradient) is one (batch*m, k) x (k, n) gemm.
  bool folds(bool trans_a) const { return a_batched && !b_batched && !trans_a; }
};

template <class T>
batch_geometry batch_dims(std::string_view fn, const xt::xarray<T>& a, bool trans_a,
                          const xt::xarray<T>& b, bool trans_b) {
  require_ndim(fn, "a", a, 2, 3);
  require_ndim(fn, "b", b, 2, 3);
  batch_geometry g;
  g.a_batched = a.dimension() == 3;
  g.b_batched = b.dimension() == 3;
  if (!g.a_batched && !g.b_batched)
    throw error(std::string(fn) + ": a or b must be 3-D (batch, rows, cols): a is " +
                shape_text(a) + ", b is " + shape_text(b));
  if (g.a_batched && g.b_batched && a.shape()[0] != b.shape()[0])
    throw error(std::string(fn) + ": batch dims differ: a is " + shape_text(a) + ", b is " +
                shape_text(b));
  g.batch = g.a_batched ? a.shape()[0] : b.shape()[0];
  g.d = product_dims(fn, a.shape(), trans_a, b.shape(), trans_b);
  g.a_step = g.a_batched ? std::size_t(g.d.m) * std::size_t(g.d.k) : 0;
  g.b_step = g.b_batched ? std::size_t(g.d.k) * std::size_t(g.d.n) : 0;
  g.c_step = std::size_t(g.d.m) * std::size_t(g.d.n);
  return g;
}

/// The dims of the single gemm that covers the whole batch when it folds into m.
inline gemm_dims folded(const batch_geometry& g, std::string_view fn) {
  return {blas_int(g.batch * std::size_t(g.d.m), fn), g.d.n, g.d.k};
}

}  // namespace detail

/// C[i] = op(A[i]) op(B[i]) for a (batch, m, k) and b (batch, k, n) (the flags
/// transpose the last two dims of each entry). Either operand may instead be 2-D,
/// shared by every batch entry. Result: (batch, m, n). With a 3-D, trans_a false
/// and b 2-D the batch folds into one (batch*m, k) x (k, n) gemm.
/// Throws on ranks other than 2 or 3 (and not both 2), differing batch sizes or
/// contraction dims: "batch_matmul: batch dims differ: a is (2, 3, 4), b is (3, 4, 5)".
template <blas_scalar T>
xt::xarray<T> batch_matmul(const xt::xarray<T>& a, const xt::xarray<T>& b, bool trans_a = false,
                           bool trans_b = false) {
  const auto g = detail::batch_dims("batch_matmul", a, trans_a, b, trans_b);
  auto c = detail::empty_array<T>(
      detail::shape_type{g.batch, std::size_t(g.d.m), std::size_t(g.d.n)});
  if (g.folds(trans_a)) {
    detail::product_gemm(detail::folded(g, "batch_matmul"), false, trans_b, a.data(), b.data(),
                         T(0), c.data());
    return c;
  }
  for (std::size_t i = 0; i < g.batch; ++i)
    detail::product_gemm(g.d, trans_a, trans_b, a.data() + i * g.a_step, b.data() + i * g.b_step,
                         T(0), c.data() + i * g.c_step);
  return c;
}

/// For C = batch_matmul(a, b, trans_a, trans_b) and dc = dL/dC (batch, m, n): dL/dA,
/// shaped like a. A 2-D (shared) a gets the sum over the batch.
template <blas_scalar T>
xt::xarray<T> batch_matmul_grad_a(const xt::xarray<T>& dc, const xt::xarray<T>& a,
                                  const xt::xarray<T>& b, bool trans_a = false,
                                  bool trans_b = false) {
  const auto g = detail::batch_dims("batch_matmul_grad_a", a, trans_a, b, trans_b);
  detail::require_shape("batch_matmul_grad_a", "dc", dc,
                        detail::shape_type{g.batch, std::size_t(g.d.m), std::size_t(g.d.n)});
  auto da = detail::empty_array<T>(a.shape());
  if (g.folds(trans_a)) {
    detail::grad_a_gemm(detail::folded(g, "batch_matmul_grad_a"), false, trans_b, dc.data(),
                        b.data(), T(0), da.data());
    return da;
  }
  if (g.batch == 0) std::fill(da.data(), da.data() + da.size(), T(0));
  for (std::size_t i = 0; i < g.batch; ++i) {
    // A shared a accumulates: the first entry overwrites, the others add.
    const T beta = g.a_batched || i == 0 ? T(0) : T(1);
    detail::grad_a_gemm(g.d, trans_a, trans_b, dc.data() + i * g.c_step, b.data() + i * g.b_step,
                        beta, da.data() + i * g.a_step);
  }
  return da;
}

/// For C = batch_matmul(a, b, trans_a, trans_b) and dc = dL/dC (batch, m, n): dL/dB,
/// shaped like b. A 2-D (shared) b gets the sum over the batch (one gemm when the
/// batch folds).
template <blas_scalar T>
xt::xarray<T> batch_matmul_grad_b(const xt::xarray<T>& dc, const xt::xarray<T>& a,
                                  const xt::xarray<T>& b, bool trans_a = false,
                                  bool trans_b = false) {
  const auto g = detail::batch_dims("batch_matmul_grad_b", a, trans_a, b, trans_b);
  detail::require_shape("batch_matmul_grad_b", "dc", dc,
                        detail::shape_type{g.batch, std::size_t(g.d.m), std::size_t(g.d.n)});
  auto db = detail::empty_array<T>(b.shape());
  if (g.folds(trans_a)) {
    detail::grad_b_gemm(detail::folded(g, "batch_matmul_grad_b"), false, trans_b, a.data(),
                        dc.data(), T(0), db.data());
    return db;
  }
  if (g.batch == 0) std::fill(db.data(), db.data() + db.size(), T(0));
  for (std::size_t i = 0; i < g.batch; ++i) {
    const T beta = g.b_batched || i == 0 ? T(0) : T(1);
    detail::grad_b_gemm(g.d, trans_a, trans_b, a.data() + i * g.a_step, dc.data() + i * g.c_step,
                        beta, db.data() + i * g.b_step);
  }
  return db;
}

}  // namespace tessera::kernels::cpu
