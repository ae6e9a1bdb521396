// gemm on raw row-major buffers: a thin wrapper over CBLAS sgemm/dgemm. Transposed
// operands are flags, never copies. Link tessera::blas.
#pragma once

#include <algorithm>
#include <cblas.h>
#include <string>
#include <tessera/core/error.hpp>

namespace tessera::kernels::cpu {

namespace detail {

// Throws unless the BLAS arguments describe valid row-major matrices:
// "gemm: lda must be at least max(1, k) = 4 (trans_a false): lda 3".
inline void check_gemm_args(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb,
                            int ldc) {
  if (m < 0 || n < 0 || k < 0)
    throw error("gemm: m, n and k must not be negative: m " + std::to_string(m) + ", n " +
                std::to_string(n) + ", k " + std::to_string(k));
  // flag: "trans_a" or "trans_b", named in the message with its value; null for C.
  auto check_ld = [](const char* name, int ld, const char* dim_name, int dim, const char* flag,
                     bool trans) {
    if (ld >= std::max(1, dim)) return;
    std::string msg = std::string("gemm: ") + name + " must be at least max(1, " + dim_name +
                      ") = " + std::to_string(std::max(1, dim));
    if (flag) msg += std::string(" (") + flag + (trans ? " true)" : " false)");
    throw error(msg + ": " + name + " " + std::to_string(ld));
  };
  // Row-major storage: A is m x k (k x m when transposed), B is k x n (n x k), C is m x n.
  check_ld("lda", lda, trans_a ? "m" : "k", trans_a ? m : k, "trans_a", trans_a);
  check_ld("ldb", ldb, trans_b ? "k" : "n", trans_b ? k : n, "trans_b", trans_b);
  check_ld("ldc", ldc, "n", n, nullptr, false);
}

// C = beta * C without BLAS (k == 0: the product adds nothing). beta == 0 writes
// zeros, whatever C held (NaN included), as BLAS does.
template <class T>
void scale_rows(int m, int n, T beta, T* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    T* row = c + std::ptrdiff_t(i) * ldc;
    if (beta == T(0)) std::fill(row, row + n, T(0));
    else if (beta != T(1)) std::transform(row, row + n, row, [beta](T v) { return beta * v; });
  }
}

inline CBLAS_TRANSPOSE cblas_trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

}  // namespace detail

/// C = alpha * op(A) op(B) + beta * C on row-major buffers, op(X) = X^T when its flag
/// is set. op(A) is m x k, op(B) is k x n, C is m x n; lda, ldb, ldc are the row
/// strides of the stored A (m x k, or k x m when trans_a), B (k x n, or n x k) and C.
/// With beta == 0, C is only written. C must not overlap A or B.
/// Throws tessera::error on a negative dim or a leading dim that is too small.
///
/// Example: A stored 3 x 2 (k = 3, m = 2), B 3 x 4 (k x n):
///   gemm(true, false, 2, 4, 3, 1.f, a, 2, b, 4, 0.f, c, 4);   // C = A^T B, 2 x 4
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  detail::check_gemm_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) return detail::scale_rows(m, n, beta, c, ldc);
  cblas_sgemm(CblasRowMajor, detail::cblas_trans(trans_a), detail::cblas_trans(trans_b), m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

/// The double-precision gemm (cblas_dgemm); see the float overload.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  detail::check_gemm_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) return detail::scale_rows(m, n, beta, c, ldc);
  cblas_dgemm(CblasRowMajor, detail::cblas_trans(trans_a), detail::cblas_trans(trans_b), m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace tessera::kernels::cpu
