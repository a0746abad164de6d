// Check macros for the CUDA runtime, cuBLAS and cuRAND: a failing call throws tandem::Error
// with the library's error name and message, the failing expression and file:line.
// Internal header: included by CUDA sources and dispatch points only, never by a public header.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <curand.h>

#include "tandem/core/error.h"

namespace tandem::detail {

/// "CURAND_STATUS_..." for a cuRAND status (cuRAND has no string function of its own).
inline const char* curand_status_name(curandStatus_t status) {
  switch (status) {
    case CURAND_STATUS_SUCCESS:
      return "CURAND_STATUS_SUCCESS";
    case CURAND_STATUS_VERSION_MISMATCH:
      return "CURAND_STATUS_VERSION_MISMATCH";
    case CURAND_STATUS_NOT_INITIALIZED:
      return "CURAND_STATUS_NOT_INITIALIZED";
    case CURAND_STATUS_ALLOCATION_FAILED:
      return "CURAND_STATUS_ALLOCATION_FAILED";
    case CURAND_STATUS_TYPE_ERROR:
      return "CURAND_STATUS_TYPE_ERROR";
    case CURAND_STATUS_OUT_OF_RANGE:
      return "CURAND_STATUS_OUT_OF_RANGE";
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE:
      return "CURAND_STATUS_LENGTH_NOT_MULTIPLE";
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED:
      return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case CURAND_STATUS_LAUNCH_FAILURE:
      return "CURAND_STATUS_LAUNCH_FAILURE";
    case CURAND_STATUS_PREEXISTING_FAILURE:
      return "CURAND_STATUS_PREEXISTING_FAILURE";
    case CURAND_STATUS_INITIALIZATION_FAILED:
      return "CURAND_STATUS_INITIALIZATION_FAILED";
    case CURAND_STATUS_ARCH_MISMATCH:
      return "CURAND_STATUS_ARCH_MISMATCH";
    case CURAND_STATUS_INTERNAL_ERROR:
      return "CURAND_STATUS_INTERNAL_ERROR";
  }
  return "CURAND_STATUS_UNKNOWN";
}

}  // namespace tandem::detail

/// Throws tandem::Error when a CUDA runtime call does not return cudaSuccess. The error is
/// also cleared from the thread's last-error slot, so a later launch check does not report
/// it a second time (sticky errors such as an illegal address stay, as CUDA keeps them).
#define TANDEM_CUDA_CHECK(x)                                                                    \
  do {                                                                                          \
    const cudaError_t tandem_cuda_status_ = (x);                                                \
    if (tandem_cuda_status_ != cudaSuccess) [[unlikely]] {                                      \
      (void)cudaGetLastError();                                                                 \
      ::tandem::detail::throw_error(                                                            \
          __FILE__, __LINE__, #x,                                                               \
          ::tandem::detail::str_cat("CUDA error ", cudaGetErrorName(tandem_cuda_status_), ": ", \
                                    cudaGetErrorString(tandem_cuda_status_)));                  \
    }                                                                                           \
  } while (0)

/// Ends every kernel launcher: a bad configuration (grid, shared memory, no kernel image for
/// this GPU) is reported at the launch, not at the next unrelated synchronisation. Kernel
/// faults surface asynchronously at the next synchronising call on the stream.
#define TANDEM_CUDA_LAUNCH_CHECK() TANDEM_CUDA_CHECK(cudaGetLastError())

/// Throws tandem::Error when a cuBLAS call does not return CUBLAS_STATUS_SUCCESS.
#define TANDEM_CUBLAS_CHECK(x)                                                                   \
  do {                                                                                           \
    const cublasStatus_t tandem_cublas_status_ = (x);                                            \
    if (tandem_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                           \
      ::tandem::detail::throw_error(                                                             \
          __FILE__, __LINE__, #x,                                                                \
          ::tandem::detail::str_cat("cuBLAS error ", cublasGetStatusName(tandem_cublas_status_), \
                                    ": ", cublasGetStatusString(tandem_cublas_status_)));        \
    }                                                                                            \
  } while (0)

/// Throws tandem::Error when a cuRAND call does not return CURAND_STATUS_SUCCESS.
#define TANDEM_CURAND_CHECK(x)                                                                     \
  do {                                                                                             \
    const curandStatus_t tandem_curand_status_ = (x);                                              \
    if (tandem_curand_status_ != CURAND_STATUS_SUCCESS) [[unlikely]] {                             \
      ::tandem::detail::throw_error(                                                               \
          __FILE__, __LINE__, #x,                                                                  \
          ::tandem::detail::str_cat("cuRAND error ",                                               \
                                    ::tandem::detail::curand_status_name(tandem_curand_status_))); \
    }                                                                                              \
  } while (0)
