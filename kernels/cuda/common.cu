#include "kernels/cuda/common.cuh"

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton::cuda {

void check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err) + " (" + file + ":" +
                           std::to_string(line) + ")");
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("launching ") + kernel + ": " + cudaGetErrorString(err));
  }
}

bool device_dtype_supported(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q2_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ2_XXS:
      return true;
    default:
      return false;
  }
}

namespace {

// The widest load the device dequantizer of each type issues into a block,
// which the row stride must preserve (see dequant.cuh).
uint64_t row_alignment(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_K:
    case DType::Q5_K:
      return 16;
    case DType::Q2_K:
      return 4;
    default:
      return 2;
  }
}

}  // namespace

void validate_matrix(const MatrixView& w, const char* who) {
  const std::string name = who;
  if (!device_dtype_supported(w.type)) {
    throw std::invalid_argument(name + ": dtype " + dtype_name(w.type) + " has no CUDA kernel");
  }
  if (w.data == nullptr || w.rows <= 0 || w.cols <= 0) {
    throw std::invalid_argument(name + ": empty matrix");
  }
  const DTypeInfo& info = dtype_info(w.type);
  const uint64_t grain = info.block_elems == 1 ? 8 : info.block_elems;
  if (uint64_t(w.cols) % grain != 0) {
    throw std::invalid_argument(name + ": " + std::to_string(w.cols) + " columns of " + info.name +
                                " are not a multiple of " + std::to_string(grain));
  }
  const uint64_t natural = *dtype_bytes(w.type, uint64_t(w.cols));
  if (w.row_bytes < natural) {
    throw std::invalid_argument(name + ": row_bytes " + std::to_string(w.row_bytes) + " below the " +
                                std::to_string(natural) + " bytes of a row");
  }
  const uint64_t align = row_alignment(w.type);
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0 || w.row_bytes % align != 0) {
    throw std::invalid_argument(name + ": " + info.name + " rows need 16-byte aligned data and a row stride that is a multiple of " +
                                std::to_string(align));
  }
}

int sm_count() {
  static std::mutex mu;
  static std::vector<int> counts;
  int dev = 0;
  BATON_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(dev) >= counts.size()) counts.resize(size_t(dev) + 1, 0);
  if (counts[size_t(dev)] == 0) {
    BATON_CUDA_CHECK(cudaDeviceGetAttribute(&counts[size_t(dev)], cudaDevAttrMultiProcessorCount, dev));
  }
  return counts[size_t(dev)];
}

}  // namespace baton::cuda
