// CudaLoneRank: see lone_rank.h.
#include "engine/cuda/lone_rank.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"  // BATON_CUDA_CHECK

namespace baton {

namespace {

class CudaLoneRank final : public TpComm {
 public:
  CudaLoneRank(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_buffers() const override { return true; }
  bool on_stream() const override { return true; }
  void sum(float*, size_t) override { throw std::logic_error("the CUDA lone rank is called on its stage's stream"); }
  void gather(const float*, size_t, float*) override {
    throw std::logic_error("the CUDA lone rank is called on its stage's stream");
  }
  // As if every other rank had added zeros: nothing to do.
  void sum_on_stream(float*, size_t, void*) override {}
  void gather_on_stream(const float* mine, size_t n, float* all, void* stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    BATON_CUDA_CHECK(cudaMemsetAsync(all, 0, size_t(size_) * n * sizeof(float), s));
    BATON_CUDA_CHECK(cudaMemcpyAsync(all + size_t(rank_) * n, mine, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
  }

 private:
  int rank_, size_;
};

}  // namespace

std::unique_ptr<TpComm> make_cuda_lone_rank(int rank, int size) {
  if (size < 2 || rank < 0 || rank >= size) {
    throw std::invalid_argument("lone rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  return std::make_unique<CudaLoneRank>(rank, size);
}

}  // namespace baton
