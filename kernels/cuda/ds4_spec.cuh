// Speculative decoding's device copies for the deepseek4 stage
// (docs/SPECULATIVE.md; engine/cuda/stages/ds4_spec.cpp): the checkpoint of
// the ring slots a verify forward overwrites, and the hidden-state capture
// a drafter reads.
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, an explicit
// stream, nothing allocated, std::invalid_argument before anything is
// queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baton::cuda {

// One ring of the checkpoint (Deepseek4Arch::RollbackRing, placed in the
// KV line): position p's row of `width` floats of sequence seq is at
// kv + offset + seq * seq_stride + (p % slots) * width * 4 bytes; its saved
// row t of a forward of n tokens at saved + saved_at * n + t * width floats.
struct RingRows {
  uint64_t offset = 0, seq_stride = 0;  // bytes
  int64_t slots = 0, width = 0, saved_at = 0;
};

// restore false: copies the rows of positions pos0 .. pos0 + n - 1 of every
// ring of the table (device memory, n_rings entries) to `saved`; true: puts
// back those of positions pos0 + keep and later. One launch for all rings.
void ring_rows_copy(const RingRows* rings, int64_t n_rings, uint8_t* kv, int seq, int64_t pos0, int64_t n,
                    int64_t keep, float* saved, bool restore, cudaStream_t stream);

// out[t * out_stride + d] = (sum over s < n_hc of x[t * n_hc * E + s * E + d]) * (1 / n_hc), the sum in stream order
// in float32 as the CPU arch's capture forms it, for t < n_tokens, d < E.
void hc_stream_mean(const float* x, int64_t n_tokens, int n_hc, int64_t E, float* out, int64_t out_stride,
                    cudaStream_t stream);

}  // namespace baton::cuda
