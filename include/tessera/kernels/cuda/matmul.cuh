// Matrix products on device arrays through cuBLAS, the GPU twins of
// kernels/cpu/matmul.hpp: the same row-major operands, transposes as flags (never
// copies), the same gradient formulas and error texts. fp32 products run in full fp32
// unless the user asks for TF32 or bf16 tensor-core math (set_matmul_precision).
// nvcc only; link CUDA::cublas (tessera::cuda does).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/runtime.hpp>
#include <tessera/kernels/cpu/matmul.hpp>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/tensor/cuda_storage.cuh>

namespace tessera::kernels::cuda {

/// The math of fp32 products: full fp32 (the default, matches the host to rounding),
/// TF32 tensor cores (10-bit mantissa inputs), or bf16 tensor cores (8-bit mantissa
/// inputs); accumulation is fp32 in every mode. fp64 products are always fp64.
enum class matmul_precision { fp32, tf32, bf16 };

inline matmul_precision& precision_setting() {
  static matmul_precision p = matmul_precision::fp32;
  return p;
}
inline void set_matmul_precision(matmul_precision p) { precision_setting() = p; }
inline matmul_precision get_matmul_precision() { return precision_setting(); }

namespace detail {

/// "cublasGemmEx failed: CUBLAS_STATUS_INVALID_VALUE (7)"
[[noreturn, gnu::cold, gnu::noinline]] inline void cublas_fail(cublasStatus_t s, const char* call) {
  throw error(std::string(call) + " failed: " + cublasGetStatusName(s) + " (" + std::to_string(int(s)) + "): " +
              cublasGetStatusString(s));
}
inline void cublas_check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    cublas_fail(s, call);
}

/// The cuBLAS handle of the current device, bound to tessera's stream.
inline cublasHandle_t cublas() {
  constexpr int max_devices = 64;
  static cublasHandle_t handles[max_devices] = {};
  const int d = tessera::cuda::current_device();
  if (!handles[d]) {
    cublas_check(cublasCreate(&handles[d]), "cublasCreate");
    cublas_check(cublasSetStream(handles[d], tessera::cuda::stream()), "cublasSetStream");
  }
  return handles[d];
}

/// Row-major C (m x n, ldc) = alpha op(A) op(B) + beta C, as kernels/cpu/blas.hpp's gemm.
/// cuBLAS is column-major: a row-major matrix is its transpose there, so this computes
/// C^T = op(B)^T op(A)^T with the operands swapped.
template <class T>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb,
          T beta, T* c, int ldc) {
  if (m == 0 || n == 0) return;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
  constexpr cudaDataType_t type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  if constexpr (std::is_same_v<T, float>) {
    switch (get_matmul_precision()) {
      case matmul_precision::fp32: compute = CUBLAS_COMPUTE_32F; break;
      case matmul_precision::tf32: compute = CUBLAS_COMPUTE_32F_FAST_TF32; break;
      case matmul_precision::bf16: compute = CUBLAS_COMPUTE_32F_FAST_16BF; break;
    }
  }
  cublas_check(cublasGemmEx(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                            m, k, &alpha, b, type, ldb, a, type, lda, &beta, c, type, ldc, compute,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

/// The same over `batch` entries, operand i at a + i * stride_a (a stride 0 shares the
/// operand), in one cublasGemmStridedBatchedEx.
template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
                          long long stride_a, const T* b, int ldb, long long stride_b, T beta, T* c, int ldc,
                          long long stride_c, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm_strided_batched: float or double");
  constexpr cudaDataType_t type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  if constexpr (std::is_same_v<T, float>) {
    switch (get_matmul_precision()) {
      case matmul_precision::fp32: compute = CUBLAS_COMPUTE_32F; break;
      case matmul_precision::tf32: compute = CUBLAS_COMPUTE_32F_FAST_TF32; break;
      case matmul_precision::bf16: compute = CUBLAS_COMPUTE_32F_FAST_16BF; break;
    }
  }
  // Row-major C_i^T = op(B_i)^T op(A_i)^T in cuBLAS's column-major view, as gemm does.
  cublas_check(cublasGemmStridedBatchedEx(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, type, ldb,
                                          stride_b, a, type, lda, stride_a, &beta, c, type, ldc, stride_c, batch,
                                          compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

namespace cm = kernels::cpu::detail;

template <class T>
void require_2d(const char* fn, const char* name, const device_array<T>& x) {
  if (x.dimension() != 2)
    throw error(std::string(fn) + ": " + name + " must be 2-D, " + name + " is " + cm::shape_text(x.shape()));
}
template <class T>
void require_shape(const char* fn, const char* name, const device_array<T>& x, int rows, int cols) {
  if (x.dimension() != 2 || x.shape()[0] != std::size_t(rows) || x.shape()[1] != std::size_t(cols))
    throw error(std::string(fn) + ": " + name + " is " + cm::shape_text(x.shape()) + ", expected (" +
                std::to_string(rows) + ", " + std::to_string(cols) + ")");
}
template <class T>
cm::gemm_dims dims(const char* fn, const device_array<T>& a, const device_array<T>& b, bool ta, bool tb) {
  require_2d(fn, "a", a);
  require_2d(fn, "b", b);
  return cm::product_dims(fn, a.shape(), ta, b.shape(), tb);
}

/// kernels/cpu/matmul.hpp's batch_geometry for device arrays (same checks and texts).
struct batch_geometry {
  cm::gemm_dims d;
  std::size_t batch = 0;
  bool a_batched = false, b_batched = false;
  long long a_step = 0, b_step = 0, c_step = 0;  // elements between batch entries
  bool folds(bool trans_a) const { return a_batched && !b_batched && !trans_a; }
};

template <class T>
void require_ndim(const char* fn, const char* name, const device_array<T>& x) {
  if (x.dimension() < 2 || x.dimension() > 3)
    throw error(std::string(fn) + ": " + name + " must be 2-D or 3-D, " + name + " is " + cm::shape_text(x.shape()));
}

template <class T>
batch_geometry batch_dims(const char* fn, const device_array<T>& a, bool trans_a, const device_array<T>& b,
                          bool trans_b) {
  require_ndim(fn, "a", a);
  require_ndim(fn, "b", b);
  batch_geometry g;
  g.a_batched = a.dimension() == 3;
  g.b_batched = b.dimension() == 3;
  if (!g.a_batched && !g.b_batched)
    throw error(std::string(fn) + ": a or b must be 3-D (batch, rows, cols): a is " + cm::shape_text(a.shape()) +
                ", b is " + cm::shape_text(b.shape()));
  if (g.a_batched && g.b_batched && a.shape()[0] != b.shape()[0])
    throw error(std::string(fn) + ": batch dims differ: a is " + cm::shape_text(a.shape()) + ", b is " +
                cm::shape_text(b.shape()));
  g.batch = g.a_batched ? a.shape()[0] : b.shape()[0];
  if (g.batch > std::size_t(INT_MAX))
    throw error(std::string(fn) + ": the batch exceeds the cuBLAS int range: " + std::to_string(g.batch));
  g.d = cm::product_dims(fn, a.shape(), trans_a, b.shape(), trans_b);
  g.a_step = g.a_batched ? (long long)g.d.m * g.d.k : 0;
  g.b_step = g.b_batched ? (long long)g.d.k * g.d.n : 0;
  g.c_step = (long long)g.d.m * g.d.n;
  return g;
}

template <class T>
void require_dc(const char* fn, const device_array<T>& dc, const batch_geometry& g) {
  const std::vector<std::size_t> want{g.batch, std::size_t(g.d.m), std::size_t(g.d.n)};
  if (dc.shape() != want)
    throw error(std::string(fn) + ": dc is " + cm::shape_text(dc.shape()) + ", expected " + cm::shape_text(want));
}

}  // namespace detail

/// C = op(A) op(B) for 2-D a and b (kernels/cpu/matmul.hpp's matmul on the GPU).
template <class T>
device_array<T> matmul(const device_array<T>& a, const device_array<T>& b, bool trans_a = false,
                       bool trans_b = false) {
  const auto d = detail::dims("matmul", a, b, trans_a, trans_b);
  device_array<T> c(std::vector<std::size_t>{std::size_t(d.m), std::size_t(d.n)});
  detail::gemm(trans_a, trans_b, d.m, d.n, d.k, T(1), a.data(), std::max(1, trans_a ? d.m : d.k), b.data(),
               std::max(1, trans_b ? d.k : d.n), T(0), c.data(), std::max(1, d.n));
  if (d.k == 0) tessera::storage<T, cuda_device>::fill(c, T(0));
  return c;
}

/// dL/dA of C = op(A) op(B) given dc, shaped like a: dC op(B)^T (or its transpose).
template <class T>
device_array<T> matmul_grad_a(const device_array<T>& dc, const device_array<T>& a, const device_array<T>& b,
                              bool trans_a = false, bool trans_b = false) {
  const auto d = detail::dims("matmul_grad_a", a, b, trans_a, trans_b);
  detail::require_shape("matmul_grad_a", "dc", dc, d.m, d.n);
  device_array<T> da(a.shape());
  const int ldc = std::max(1, d.n), ldb = std::max(1, trans_b ? d.k : d.n);
  if (!trans_a)
    detail::gemm(false, !trans_b, d.m, d.k, d.n, T(1), dc.data(), ldc, b.data(), ldb, T(0), da.data(), std::max(1, d.k));
  else
    detail::gemm(trans_b, true, d.k, d.m, d.n, T(1), b.data(), ldb, dc.data(), ldc, T(0), da.data(), std::max(1, d.m));
  if (d.n == 0) tessera::storage<T, cuda_device>::fill(da, T(0));
  return da;
}

/// dL/dB of C = op(A) op(B) given dc, shaped like b: op(A)^T dC (or its transpose).
template <class T>
device_array<T> matmul_grad_b(const device_array<T>& dc, const device_array<T>& a, const device_array<T>& b,
                              bool trans_a = false, bool trans_b = false) {
  const auto d = detail::dims("matmul_grad_b", a, b, trans_a, trans_b);
  detail::require_shape("matmul_grad_b", "dc", dc, d.m, d.n);
  device_array<T> db(b.shape());
  const int ldc = std::max(1, d.n), lda = std::max(1, trans_a ? d.m : d.k);
  if (!trans_b)
    detail::gemm(!trans_a, false, d.k, d.n, d.m, T(1), a.data(), lda, dc.data(), ldc, T(0), db.data(), std::max(1, d.n));
  else
    detail::gemm(true, trans_a, d.n, d.k, d.m, T(1), dc.data(), ldc, a.data(), lda, T(0), db.data(), std::max(1, d.k));
  if (d.m == 0) tessera::storage<T, cuda_device>::fill(db, T(0));
  return db;
}

/// C[i] = op(A[i]) op(B[i]) for a (batch, m, k) and b (batch, k, n), either of them
/// possibly 2-D and shared (kernels/cpu/matmul.hpp's batch_matmul on the GPU): one
/// strided batched gemm (stride 0 for a shared operand).
template <class T>
device_array<T> batch_matmul(const device_array<T>& a, const device_array<T>& b, bool trans_a = false,
                             bool trans_b = false) {
  const auto g = detail::batch_dims("batch_matmul", a, trans_a, b, trans_b);
  const auto& d = g.d;
  device_array<T> c(std::vector<std::size_t>{g.batch, std::size_t(d.m), std::size_t(d.n)});
  if (d.k == 0 || g.batch == 0) {
    tessera::storage<T, cuda_device>::fill(c, T(0));
    return c;
  }
  detail::gemm_strided_batched(trans_a, trans_b, d.m, d.n, d.k, T(1), a.data(), std::max(1, trans_a ? d.m : d.k),
                               g.a_step, b.data(), std::max(1, trans_b ? d.k : d.n), g.b_step, T(0), c.data(),
                               std::max(1, d.n), g.c_step, int(g.batch));
  return c;
}

/// dL/dA of C = batch_matmul(a, b) given dc (batch, m, n), shaped like a; a 2-D (shared)
/// a gets the sum over the batch (kernels/cpu/matmul.hpp's batch_matmul_grad_a).
template <class T>
device_array<T> batch_matmul_grad_a(const device_array<T>& dc, const device_array<T>& a, const device_array<T>& b,
                                    bool trans_a = false, bool trans_b = false) {
  const auto g = detail::batch_dims("batch_matmul_grad_a", a, trans_a, b, trans_b);
  detail::require_dc("batch_matmul_grad_a", dc, g);
  const auto& d = g.d;
  device_array<T> da(a.shape());
  if (d.n == 0 || g.batch == 0) {
    tessera::storage<T, cuda_device>::fill(da, T(0));
    return da;
  }
  const int ldc = std::max(1, d.n), ldb = std::max(1, trans_b ? d.k : d.n);
  // Entry i (kernels/cpu/matmul.hpp's grad_a_gemm):
  //   trans_a false: dA_i (m x k) = dC_i op(B_i)^T;  trans_a true: dA_i (k x m) = op(B_i) dC_i^T.
  auto entries = [&](const T* dc0, const T* b0, T beta, T* da0, long long sa, int count) {
    if (!trans_a)
      detail::gemm_strided_batched(false, !trans_b, d.m, d.k, d.n, T(1), dc0, ldc, g.c_step, b0, ldb, g.b_step, beta,
                                   da0, std::max(1, d.k), sa, count);
    else
      detail::gemm_strided_batched(trans_b, true, d.k, d.m, d.n, T(1), b0, ldb, g.b_step, dc0, ldc, g.c_step, beta,
                                   da0, std::max(1, d.m), sa, count);
  };
  if (g.a_batched) {
    entries(dc.data(), b.data(), T(0), da.data(), g.a_step, int(g.batch));
  } else {
    // A shared a accumulates: the first entry overwrites, the others add.
    for (std::size_t i = 0; i < g.batch; ++i)
      entries(dc.data() + (long long)i * g.c_step, b.data() + (long long)i * g.b_step, i == 0 ? T(0) : T(1),
              da.data(), 0, 1);
  }
  return da;
}

/// dL/dB of C = batch_matmul(a, b) given dc (batch, m, n), shaped like b; a 2-D (shared)
/// b gets the sum over the batch, in one gemm when the batch folds into m
/// (kernels/cpu/matmul.hpp's batch_matmul_grad_b).
template <class T>
device_array<T> batch_matmul_grad_b(const device_array<T>& dc, const device_array<T>& a, const device_array<T>& b,
                                    bool trans_a = false, bool trans_b = false) {
  const auto g = detail::batch_dims("batch_matmul_grad_b", a, trans_a, b, trans_b);
  detail::require_dc("batch_matmul_grad_b", dc, g);
  const auto& d = g.d;
  device_array<T> db(b.shape());
  if (d.m == 0 || g.batch == 0) {
    tessera::storage<T, cuda_device>::fill(db, T(0));
    return db;
  }
  const int ldc = std::max(1, d.n), lda = std::max(1, trans_a ? d.m : d.k);
  if (g.folds(trans_a)) {
    // (batch*m, k)^T (batch*m, n): the sum over the batch in one gemm.
    const std::size_t rows = g.batch * std::size_t(d.m);
    if (rows > std::size_t(INT_MAX))
      throw error("batch_matmul_grad_b: a matrix dim exceeds the cuBLAS int range: " + std::to_string(rows));
    const int mm = int(rows);
    if (!trans_b)
      detail::gemm(true, false, d.k, d.n, mm, T(1), a.data(), lda, dc.data(), ldc, T(0), db.data(), std::max(1, d.n));
    else
      detail::gemm(true, false, d.n, d.k, mm, T(1), dc.data(), ldc, a.data(), lda, T(0), db.data(), std::max(1, d.k));
    return db;
  }
  // Entry i (kernels/cpu/matmul.hpp's grad_b_gemm):
  //   trans_b false: dB_i (k x n) = op(A_i)^T dC_i;  trans_b true: dB_i (n x k) = dC_i^T op(A_i).
  auto entries = [&](const T* a0, const T* dc0, T beta, T* db0, long long sb, int count) {
    if (!trans_b)
      detail::gemm_strided_batched(!trans_a, false, d.k, d.n, d.m, T(1), a0, lda, g.a_step, dc0, ldc, g.c_step, beta,
                                   db0, std::max(1, d.n), sb, count);
    else
      detail::gemm_strided_batched(true, trans_a, d.n, d.k, d.m, T(1), dc0, ldc, g.c_step, a0, lda, g.a_step, beta,
                                   db0, std::max(1, d.k), sb, count);
  };
  if (g.b_batched) {
    entries(a.data(), dc.data(), T(0), db.data(), g.b_step, int(g.batch));
  } else {
    for (std::size_t i = 0; i < g.batch; ++i)
      entries(a.data() + (long long)i * g.a_step, dc.data() + (long long)i * g.c_step, i == 0 ? T(0) : T(1),
              db.data(), 0, 1);
  }
  return db;
}

}  // namespace tessera::kernels::cuda
