// Sampling helpers on the device, so that only a few numbers per token cross
// to the host instead of the whole vocabulary of logits.
//
// Greedy decoding needs only argmax(). For temperature sampling, top_k()
// returns the k most likely tokens (k <= 64), most likely first, with their
// logits divided by the temperature and the softmax over those k; the host
// sampler finishes (top-p, min-p, the random draw) from these k candidates,
// exactly as engine/sampling/sampler.cpp does after its own top-k cut.
// apply_penalties() adjusts a row of logits for the repetition, presence and
// frequency penalties and min_tokens' ban before either.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace baton::cuda {

constexpr int kTopKMax = 64;

// ids[r] = index of the largest of the n logits of row r (rows `stride`
// floats apart, n_rows <= 65535); ties go to the lowest index, as in the
// CPU sampler. With a workspace of argmax_workspace_bytes(n_rows) (16-byte
// aligned, zero before the first call; every call leaves it zero) a long
// row is spread over many blocks; without one, one block per row.
size_t argmax_workspace_bytes(int64_t n_rows);
void argmax(const float* logits, int64_t n_rows, int64_t n, int64_t stride, int32_t* ids, cudaStream_t stream,
            void* workspace = nullptr, size_t workspace_bytes = 0);

size_t top_k_workspace_bytes(int64_t n, int k);

// One row of n logits. Writes k ids, k logits / temperature and k
// probabilities (softmax over the k), ordered by logit descending and then
// by id ascending, like the CPU sampler's sort. Preconditions
// (std::invalid_argument): 1 <= k <= min(n, kTopKMax), temperature > 0,
// workspace of top_k_workspace_bytes(n, k), 16-byte aligned. Logits must not
// be NaN.
void top_k(const float* logits, int64_t n, int k, float temperature, int32_t* ids, float* scaled_logits,
           float* probs, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The penalties of engine/sampling/sampler.h's apply_penalties on one row of
// n device logits, in place, entry by entry (the same layout as the engine's
// PenaltyEntry: id, occurrences in the output, flags; each id once, so one
// thread per entry needs no atomics): in the window (flags & 1) a positive
// logit is divided by repeat_penalty and another multiplied, then
// presence_penalty * (generated > 0) + frequency_penalty * generated is
// subtracted, then a banned entry (flags & 2) becomes -inf. Rounded like
// the CPU's (no contracted multiply-add). Ids outside [0, n) are skipped.
struct PenaltyEntry {
  int32_t id;
  int32_t generated;
  uint8_t flags;
};
void apply_penalties(float* logits, int64_t n, const PenaltyEntry* entries, int64_t n_entries, float repeat_penalty,
                     float presence_penalty, float frequency_penalty, cudaStream_t stream);

}  // namespace baton::cuda
