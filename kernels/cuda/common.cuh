// Host-side helpers shared by the CUDA kernel families: error checks and the
// description of a weight matrix that lives in device memory.
//
// Conventions of every launcher in kernels/cuda/: pointers are device
// pointers unless a comment says otherwise, work is queued on the explicit
// stream argument, nothing is allocated (scratch comes from the caller as a
// workspace whose size a *_workspace_bytes() function gives), and bad
// arguments throw std::invalid_argument before anything is queued. A launch
// failure throws std::runtime_error naming the kernel.
//
// This header is plain C++ (no device code), so host .cpp files may include it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/quant.h"

namespace baton::cuda {

// Throws std::runtime_error "<what>: <CUDA error string> (<file>:<line>)".
void check(cudaError_t err, const char* what, const char* file, int line);
// After a kernel launch: throws if the launch itself failed (bad
// configuration, no device). Errors inside the kernel surface at the next
// synchronizing call.
void check_launch(const char* kernel);

#define BATON_CUDA_CHECK(expr) ::baton::cuda::check((expr), #expr, __FILE__, __LINE__)

// A GGUF weight matrix in device memory: `rows` rows (output features) of
// `cols` elements (input features, ggml ne[0]) in their stored block layout,
// row r at data + r * row_bytes.
struct MatrixView {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t row_bytes = 0;
};

// The dtypes the device dequantizers handle (matvec, matmul, get_rows).
bool device_dtype_supported(DType t);

// Validates a MatrixView for the device dequantizers: supported type, cols a
// multiple of the block size (and of 8 for the plain float types), row_bytes
// at least one row's bytes, and the alignment the loads rely on (data 16-byte
// aligned; row_bytes a multiple of 16 for F32/F16/BF16/Q4_K/Q5_K, of 4 for
// Q2_K, of 2 otherwise). Throws std::invalid_argument naming `who`.
void validate_matrix(const MatrixView& w, const char* who);

// Multiprocessor count of the current device (cached per device).
int sm_count();

}  // namespace baton::cuda
