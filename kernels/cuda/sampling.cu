// argmax: blocks scan a part of a row each (eight loads in flight per
// thread) and reduce (value, index) pairs; with a workspace a row of more
// than 2048 logits is spread over blocks of 2048, which meet through an
// atomic maximum (a vocabulary of 128k: one round trip instead of 16).
//
// top_k: a tree of selection passes. Each pass cuts its input into tiles of
// 1024 candidates, bitonic-sorts every tile in shared memory (one block per
// tile) and keeps the tile's best k; 129280 logits become 127 * k, then
// 8 * k, then k candidates in three passes. The last pass, a single tile,
// also writes the scaled logits and the softmax.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sampling.cuh"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kTile = 1024;  // candidates per block and pass (one per thread)

// Is (va, ia) ranked before (vb, ib)? Higher logit first, then lower id.
__device__ __forceinline__ bool ranks_before(float va, int32_t ia, float vb, int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

// Per row of a split argmax: the best key so far and the blocks arrived.
// Zero between calls: the last block of a row resets both.
struct alignas(16) ArgmaxSlot {
  unsigned long long key;
  unsigned int arrived;
  unsigned int pad;
};

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxUnroll = 8;
// Logits per block of a split row: one round of eight loads per thread.
constexpr int64_t kArgmaxSpan = int64_t(kArgmaxThreads) * kArgmaxUnroll;

// (value, id) as one integer that orders like ranks_before: the float's bits
// made monotonic in the high word (-0 as +0, NaN below every number), the
// complement of the id in the low word.
__device__ __forceinline__ unsigned long long rank_key(float v, int32_t id) {
  const uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
  const uint32_t ord = v != v ? 0u : ((b & 0x80000000u) ? ~b : (b | 0x80000000u));
  return (static_cast<unsigned long long>(ord) << 32) | (0xffffffffu - uint32_t(id));
}

// Block (x, r) scans logits [x * span, (x + 1) * span) of row r. One block
// per row (slots == nullptr) writes
// ids[r] itself; a split row (gridDim.x > 1) meets in its slot: each block
// raises the key with atomicMax, and the last to arrive writes the id and
// resets the slot for the next call.
__global__ void __launch_bounds__(1024)
    argmax_kernel(const float* __restrict__ logits, int64_t n, int64_t stride, int64_t span, int32_t* ids,
                  ArgmaxSlot* slots) {
  const float* row = logits + int64_t(blockIdx.y) * stride;
  const int64_t begin = int64_t(blockIdx.x) * span, end = min(n, begin + span);
  pdl_trigger();
  pdl_wait();  // the logits come from the head's matvec
  float best = -INFINITY;
  int32_t best_id = INT_MAX;
  // Increasing indices per thread: a strict > keeps the first of equals.
  // Eight loads are issued before they are compared, so a row of 128k
  // logits costs 16 round trips to L2 in one block, one when split.
  const int64_t bd = blockDim.x;
  int64_t i = begin + threadIdx.x;
  for (; i + (kArgmaxUnroll - 1) * bd < end; i += kArgmaxUnroll * bd) {
    float v[kArgmaxUnroll];
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k) v[k] = row[i + k * bd];
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k) {
      if (v[k] > best || best_id == INT_MAX) {
        best = v[k];
        best_id = int32_t(i + k * bd);
      }
    }
  }
  for (; i < end; i += bd) {
    const float v = row[i];
    if (v > best || best_id == INT_MAX) {
      best = v;
      best_id = int32_t(i);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, best, o);
    const int32_t id = __shfl_xor_sync(kFullMask, best_id, o);
    if (ranks_before(v, id, best, best_id)) best = v, best_id = id;
  }
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = best, si[warp] = best_id;
  __syncthreads();
  if (warp != 0) return;
  const int n_warps = blockDim.x / 32;
  best = lane < n_warps ? sv[lane] : -INFINITY;
  best_id = lane < n_warps ? si[lane] : INT_MAX;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, best, o);
    const int32_t id = __shfl_xor_sync(kFullMask, best_id, o);
    if (ranks_before(v, id, best, best_id)) best = v, best_id = id;
  }
  if (lane != 0) return;
  if (gridDim.x == 1) {
    ids[blockIdx.y] = best_id;
    return;
  }
  ArgmaxSlot& slot = slots[blockIdx.y];
  atomicMax(&slot.key, rank_key(best, best_id));
  __threadfence();  // the key before the arrival
  if (atomicAdd(&slot.arrived, 1u) + 1 == gridDim.x) {
    __threadfence();  // every block's key is in before it is read
    const unsigned long long key = atomicExch(&slot.key, 0ull);
    ids[blockIdx.y] = int32_t(0xffffffffu - uint32_t(key & 0xffffffffull));
    slot.arrived = 0;
  }
}

// One block of kTile threads per tile of the n input candidates (values and
// ids; ids == nullptr means id = position). Writes the tile's best k to
// out_v/out_i[blockIdx.x * k ...]; tiles with fewer than k real candidates
// pad with (-inf, INT_MAX), which rank after every real candidate. When
// `final` (a single tile), writes ids, scaled logits and probabilities.
__global__ void __launch_bounds__(kTile)
    top_k_pass_kernel(const float* __restrict__ in_v, const int32_t* __restrict__ in_i, int64_t n, int k,
                      float* out_v, int32_t* out_i, bool final, float inv_temp, int32_t* ids, float* scaled,
                      float* probs) {
  __shared__ float sv[kTile];
  __shared__ int32_t si[kTile];
  const int t = threadIdx.x;
  const int64_t src = int64_t(blockIdx.x) * kTile + t;
  if (src < n) {
    sv[t] = in_v[src];
    si[t] = in_i ? in_i[src] : int32_t(src);
  } else {
    sv[t] = -INFINITY;
    si[t] = INT_MAX;
  }
  __syncthreads();
  // Bitonic sort into ranking order (best first).
  for (int size = 2; size <= kTile; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int partner = t ^ stride;
      if (partner > t) {
        const bool up = (t & size) == 0;  // this pair's run is sorted best-first
        const float va = sv[t], vb = sv[partner];
        const int32_t ia = si[t], ib = si[partner];
        const bool b_first = ranks_before(vb, ib, va, ia);
        if (b_first == up) {
          sv[t] = vb, si[t] = ib;
          sv[partner] = va, si[partner] = ia;
        }
      }
      __syncthreads();
    }
  }
  if (!final) {
    if (t < k) {
      out_v[int64_t(blockIdx.x) * k + t] = sv[t];
      out_i[int64_t(blockIdx.x) * k + t] = si[t];
    }
    return;
  }
  if (t == 0) {
    // k <= 64 values: a serial softmax is shorter than a parallel one.
    const float mx = sv[0] * inv_temp;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += expf(sv[j] * inv_temp - mx);
    for (int j = 0; j < k; ++j) {
      ids[j] = si[j];
      scaled[j] = sv[j] * inv_temp;
      probs[j] = expf(sv[j] * inv_temp - mx) / sum;
    }
  }
}

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

// One thread per entry; the entries name distinct ids.
__global__ void apply_penalties_kernel(float* logits, int64_t n, const PenaltyEntry* entries, int64_t n_entries,
                                       float repeat, float presence, float frequency) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_entries) return;
  const PenaltyEntry e = entries[i];
  if (e.id < 0 || e.id >= n) return;
  float x = logits[e.id];
  if ((e.flags & 1) && repeat != 1.0f) x = x > 0.0f ? __fdiv_rn(x, repeat) : __fmul_rn(x, repeat);
  if (e.generated > 0) x = __fsub_rn(x, __fadd_rn(presence, __fmul_rn(frequency, float(e.generated))));
  if (e.flags & 2) x = -INFINITY;
  logits[e.id] = x;
}

}  // namespace

void apply_penalties(float* logits, int64_t n, const PenaltyEntry* entries, int64_t n_entries, float repeat_penalty,
                     float presence_penalty, float frequency_penalty, cudaStream_t stream) {
  if (n <= 0 || n > INT32_MAX || n_entries < 0) throw std::invalid_argument("apply_penalties: bad row length or entry count");
  if (!(repeat_penalty > 0.0f)) throw std::invalid_argument("apply_penalties: the repetition penalty must be positive");
  if (n_entries == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n_entries + kThreads - 1) / kThreads;
  apply_penalties_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(logits, n, entries, n_entries, repeat_penalty,
                                                                   presence_penalty, frequency_penalty);
  check_launch("apply_penalties_kernel");
}

size_t argmax_workspace_bytes(int64_t n_rows) { return size_t(std::max<int64_t>(n_rows, 0)) * sizeof(ArgmaxSlot); }

void argmax(const float* logits, int64_t n_rows, int64_t n, int64_t stride, int32_t* ids, cudaStream_t stream,
            void* workspace, size_t workspace_bytes) {
  if (n <= 0 || n_rows < 0 || (n_rows > 1 && stride < n) || n > INT32_MAX || n_rows > 65535) {
    throw std::invalid_argument("argmax: bad row length, stride or row count");
  }
  if (n_rows == 0) return;
  auto* slots = static_cast<ArgmaxSlot*>(workspace);
  const bool split = slots && workspace_bytes >= argmax_workspace_bytes(n_rows) && n > kArgmaxSpan;
  if (slots && reinterpret_cast<uintptr_t>(slots) % alignof(ArgmaxSlot) != 0) {
    throw std::invalid_argument("argmax: workspace must be 16-byte aligned");
  }
  // Split: one round of loads per thread (a 128k vocabulary takes 63 blocks).
  const int64_t span = split ? kArgmaxSpan : n;
  const int64_t blocks = (n + span - 1) / span;
  launch_pdl("argmax_kernel", argmax_kernel, dim3(unsigned(blocks), unsigned(n_rows)),
             dim3(split ? kArgmaxThreads : 1024), 0, stream, logits, n, stride, span, ids, split ? slots : nullptr);
}

size_t top_k_workspace_bytes(int64_t n, int k) {
  // Two ping-pong candidate buffers sized for the first pass's output.
  const size_t cands = size_t(tiles(n)) * size_t(k);
  const size_t one = (cands * (sizeof(float) + sizeof(int32_t)) + 15) / 16 * 16;
  return 2 * one;
}

void top_k(const float* logits, int64_t n, int k, float temperature, int32_t* ids, float* scaled_logits,
           float* probs, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (k < 1 || k > kTopKMax || int64_t(k) > n || n > INT32_MAX) {
    throw std::invalid_argument("top_k: k " + std::to_string(k) + " must be in [1, min(n, " +
                                std::to_string(kTopKMax) + ")] for n " + std::to_string(n));
  }
  if (!(temperature > 0.0f)) throw std::invalid_argument("top_k: temperature must be positive");
  const size_t need = top_k_workspace_bytes(n, k);
  if (workspace_bytes < need || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    throw std::invalid_argument("top_k: workspace of " + std::to_string(workspace_bytes) + " bytes, need " +
                                std::to_string(need) + " (16-byte aligned)");
  }
  const size_t cands = size_t(tiles(n)) * size_t(k);
  const size_t one = need / 2;
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  float* buf_v[2] = {reinterpret_cast<float*>(ws), reinterpret_cast<float*>(ws + one)};
  int32_t* buf_i[2] = {reinterpret_cast<int32_t*>(ws + cands * sizeof(float)),
                       reinterpret_cast<int32_t*>(ws + one + cands * sizeof(float))};
  const float inv_temp = 1.0f / temperature;

  const float* in_v = logits;
  const int32_t* in_i = nullptr;
  int64_t count = n;
  for (int pass = 0;; ++pass) {
    const int64_t nt = tiles(count);
    const bool final = nt == 1;
    float* ov = buf_v[pass & 1];
    int32_t* oi = buf_i[pass & 1];
    top_k_pass_kernel<<<unsigned(nt), kTile, 0, stream>>>(in_v, in_i, count, k, ov, oi, final, inv_temp, ids,
                                                         scaled_logits, probs);
    check_launch("top_k_pass_kernel");
    if (final) break;
    in_v = ov;
    in_i = oi;
    count = nt * k;
  }
}

}  // namespace baton::cuda
