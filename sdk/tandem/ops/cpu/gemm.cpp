// CPU GEMM: float32 dispatches to oneDNN's dnnl_sgemm (on AVX2, a B whose row stride is a large
// power of two copied to a padded stride first); float64 (and float32 when oneDNN was not
// built) runs a portable blocked, OpenMP-parallel loop.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/core/cpu_isa.h"
#include "tandem/core/error.h"
#include "tandem/core/threading.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/parallel.h"
#include "tandem/ops/cpu/widen.h"

#if TANDEM_WITH_ONEDNN
#include <dnnl.h>
#include <dnnl_debug.h>

#include "tandem/ops/cpu/onednn.h"
#endif

namespace tandem::ops::cpu {
namespace {

// Tile sizes of the portable loop: a packed [kBlockM, kBlockK] slice of op(A) (64 KiB in double)
// and a [kBlockK, kBlockN] slice of op(B) (256 KiB) stay in L2 while one C tile is updated.
constexpr int64_t kBlockM = 64;
constexpr int64_t kBlockN = 256;
constexpr int64_t kBlockK = 128;
// Below this many multiply-adds a parallel region costs more than it saves.
constexpr int64_t kParallelMinWork = int64_t{1} << 18;

std::string describe(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     int64_t lda, int64_t ldb, int64_t ldc) {
  return detail::str_cat("op(A) [", m, ", ", k, "]", transpose_a ? " (A transposed)" : "",
                         ", op(B) [", k, ", ", n, "]", transpose_b ? " (B transposed)" : "",
                         ", lda=", lda, ", ldb=", ldb, ", ldc=", ldc);
}

void check_arguments(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     int64_t lda, int64_t ldb, int64_t ldc) {
  TANDEM_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: negative size in ",
               describe(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
  // Row-major: a leading dimension is at least the number of stored columns. An empty matrix
  // is never read, so any leading dimension will do (a [3, 0] tensor passes 0).
  const int64_t a_columns = transpose_a ? m : k;
  const int64_t b_columns = transpose_b ? k : n;
  const bool a_ok = m == 0 || k == 0 || lda >= a_columns;
  const bool b_ok = k == 0 || n == 0 || ldb >= b_columns;
  const bool c_ok = m == 0 || n == 0 || ldc >= n;
  TANDEM_CHECK(a_ok && b_ok && c_ok, "gemm: leading dimension too small in ",
               describe(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
}

/// C[rows, columns] *= beta; beta == 0 writes zeros so NaN/Inf already in C do not survive
/// (the BLAS convention, which callers rely on to pass uninitialised outputs).
template <typename T>
void scale_rows(T beta, int64_t rows, int64_t columns, T* c, int64_t ldc) {
  if (beta == T(1)) return;
  for (int64_t i = 0; i < rows; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      std::fill(row, row + columns, T(0));
    } else {
      for (int64_t j = 0; j < columns; ++j) row[j] *= beta;
    }
  }
}

/// Portable GEMM. Each C tile belongs to one thread, so tiles run in parallel without races
/// and the summation order (and so the result) does not depend on the thread count.
template <typename T>
void blocked_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  // alpha == 0 must not read A or B (BLAS): they may hold NaN or be unset.
  if (alpha == T(0)) k = 0;
  const int64_t tiles_m = (m + kBlockM - 1) / kBlockM;
  const int64_t tiles_n = (n + kBlockN - 1) / kBlockN;
  const bool parallel = m * n * std::max<int64_t>(k, 1) >= kParallelMinWork;
  const uint32_t mode = float_mode();  // the team computes as the calling thread does
#pragma omp parallel if (parallel)
  {
    set_float_mode(mode);
    std::vector<T> a_pack(kBlockM * kBlockK);
    std::vector<T> b_pack(kBlockK * kBlockN);
#pragma omp for collapse(2) schedule(static)
    for (int64_t tile_i = 0; tile_i < tiles_m; ++tile_i) {
      for (int64_t tile_j = 0; tile_j < tiles_n; ++tile_j) {
        const int64_t i0 = tile_i * kBlockM, mb = std::min(kBlockM, m - i0);
        const int64_t j0 = tile_j * kBlockN, nb = std::min(kBlockN, n - j0);
        T* c_tile = c + i0 * ldc + j0;
        scale_rows(beta, mb, nb, c_tile, ldc);
        for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
          const int64_t kb = std::min(kBlockK, k - p0);
          // Pack alpha * op(A)[i0:, p0:] and op(B)[p0:, j0:] row-major and contiguous, so the
          // inner loop streams unit-stride whatever the transposes.
          for (int64_t i = 0; i < mb; ++i) {
            for (int64_t p = 0; p < kb; ++p) {
              const T value = transpose_a ? a[(p0 + p) * lda + i0 + i] : a[(i0 + i) * lda + p0 + p];
              a_pack[i * kb + p] = alpha * value;
            }
          }
          for (int64_t p = 0; p < kb; ++p) {
            for (int64_t j = 0; j < nb; ++j) {
              b_pack[p * nb + j] =
                  transpose_b ? b[(j0 + j) * ldb + p0 + p] : b[(p0 + p) * ldb + j0 + j];
            }
          }
          for (int64_t i = 0; i < mb; ++i) {
            T* c_row = c_tile + i * ldc;
            const T* a_row = a_pack.data() + i * kb;
            int64_t p = 0;
            // Four rank-1 updates per pass over the C row: a quarter of the C loads and stores.
            for (; p + 4 <= kb; p += 4) {
              const T a0 = a_row[p], a1 = a_row[p + 1], a2 = a_row[p + 2], a3 = a_row[p + 3];
              const T* b0 = b_pack.data() + p * nb;
              const T* b1 = b0 + nb;
              const T* b2 = b1 + nb;
              const T* b3 = b2 + nb;
#pragma omp simd
              for (int64_t j = 0; j < nb; ++j) {
                c_row[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
              }
            }
            for (; p < kb; ++p) {
              const T a0 = a_row[p];
              const T* b0 = b_pack.data() + p * nb;
#pragma omp simd
              for (int64_t j = 0; j < nb; ++j) c_row[j] += a0 * b0[j];
            }
          }
        }
      }
    }
  }
}

// A B row stride this many floats longer than a power of two leaves the rows in different cache
// sets (and keeps each row 64-byte aligned).
constexpr int64_t kStridePad = 16;

}  // namespace

int64_t gemm_b_copy_stride(bool transpose_b, int64_t m, int64_t ldb) {
#if TANDEM_WITH_ONEDNN
  const bool power_of_two = ldb >= 512 && (ldb & (ldb - 1)) == 0;
  if (!transpose_b && power_of_two && m >= 8 && cpu_isa() < CpuIsa::kAvx512Core)
    return ldb + kStridePad;
#else
  (void)transpose_b, (void)m, (void)ldb;
#endif
  return 0;
}

void copy_rows(int64_t rows, int64_t columns, const float* from, int64_t from_stride, float* to,
               int64_t to_stride) {
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(columns, 1));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(to + i * to_stride, from + i * from_stride,
                  static_cast<size_t>(columns) * sizeof(float));
  });
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  check_arguments(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // An empty sum: C = beta * C (oneDNN is not asked, so the convention is ours to keep).
    scale_rows(beta, m, n, c, ldc);
    return;
  }
#if TANDEM_WITH_ONEDNN
  // oneDNN (OpenMP runtime) uses omp_get_max_threads() of the calling thread, which
  // tandem::set_compute_threads sets; so each replica's GEMM keeps to its share of the cores
  // (and to OpenMP's thread limit: team_threads).
  onednn::apply_cpu_isa_cap();
  onednn::team_threads();
  if (const int64_t stride = gemm_b_copy_stride(transpose_b, m, ldb); stride > 0) {
    const FloatBuffer copy(k * stride);
    copy_rows(k, n, b, ldb, copy.data(), stride);
    // The padded stride is no power of two: the call below reads the copy in place.
    return gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, copy.data(), stride, beta, c,
                ldc);
  }
  const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k,
                                          alpha, a, lda, b, ldb, beta, c, ldc);
  TANDEM_CHECK(status == dnnl_success, "gemm: dnnl_sgemm failed (", dnnl_status2str(status),
               ") for ", describe(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
#else
  blocked_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  check_arguments(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  blocked_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace tandem::ops::cpu
