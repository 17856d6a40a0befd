// DeepSeek V4 lightning indexer (ds4_indexer.cuh).
// Each kernel follows the CPU code of engine/arch/deepseek4*.cpp step by
// step (same reduction orders where the work is per thread), so the tests
// can hold tight tolerances.
#include "kernels/cuda/ds4_indexer.cuh"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ds4_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

constexpr int kTopkThreads = 1024;

// Block (x: a slice of rows, y: token): scores of the token's complete rows
// (only for tokens with more than top_k of them), one row per warp at a time.
__global__ void indexer_score_kernel(Ds4IndexerParams p) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  extern __shared__ float qs[];  // n_head * head_dim query values, then n_head weights
  if (p.pos0_dev) p.pos0 = *p.pos0_dev;
  const int64_t t = blockIdx.y;
  if (p.batch.seq) p.rows += int64_t(p.batch.seq[t]) * p.batch.seq_stride;
  const int64_t nv = ((p.batch.seq ? p.batch.pos[t] : p.pos0 + t) + 1) / p.ratio;
  if (nv <= p.top_k) return;
  const int hd = p.head_dim, per = hd / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = int(blockDim.x >> 5);
  float* ws = qs + p.n_head * hd;
  // The token's queries as float4 (head_dim % 32 == 0), 8 loads in flight
  // per thread rather than one loop step per load.
  const float4* q4 = reinterpret_cast<const float4*>(p.q + t * p.n_head * hd);
  float4* qs4 = reinterpret_cast<float4*>(qs);
#pragma unroll 8
  for (int i = threadIdx.x; i < p.n_head * hd / 4; i += blockDim.x) qs4[i] = __ldg(q4 + i);
  for (int i = threadIdx.x; i < p.n_head; i += blockDim.x) ws[i] = p.w[t * p.n_head + i] * p.w_scale;
  __syncthreads();
  float* out = p.scores + t * p.score_stride;
  for (int64_t w = int64_t(blockIdx.x) * n_warps + warp; w < nv; w += int64_t(gridDim.x) * n_warps) {
    const float* kr = p.rows + w * hd;
    float k[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) k[i] = i < per ? kr[lane + 32 * i] : 0.0f;
    float s = 0.0f;
    for (int h = 0; h < p.n_head; ++h) {
      const float* qh = qs + h * hd;
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (i < per) part = fmaf(qh[lane + 32 * i], k[i], part);
      }
      s += fmaxf(0.0f, warp_sum(part)) * ws[h];
    }
    if (lane == 0) out[w] = s;
  }
}

// Order-preserving key of a float score (-0 counts as +0, as == does).
__device__ __forceinline__ uint32_t score_key(float v) {
  uint32_t u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// How many threads before this one (in thread order) and in the whole block
// have `flag` set. Every thread must call it.
__device__ __forceinline__ void block_count(bool flag, int* warp_cnt, int& before, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = int(blockDim.x >> 5);
  const unsigned ballot = __ballot_sync(kFullMask, flag);
  if (lane == 0) warp_cnt[warp] = __popc(ballot);
  __syncthreads();
  before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < n_warps; ++w) {
    before += w < warp ? warp_cnt[w] : 0;
    total += warp_cnt[w];
  }
  __syncthreads();
}

// Block t: the token's top_k rows by radix selection of the top_k-th largest
// key (8 bits per pass), then an ordered compaction: every key above it and
// the first (lowest-index) ones equal to it. Output ascending by row.
__global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_kernel(const float* __restrict__ scores, int64_t stride, int64_t pos0, int ratio, int top_k,
                        int32_t* __restrict__ itop, const int32_t* __restrict__ pos0_dev,
                        const int32_t* __restrict__ row_pos) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  __shared__ int hist[256];
  __shared__ uint32_t sh_prefix;
  __shared__ int sh_remaining;
  __shared__ int warp_cnt[32];
  if (pos0_dev) pos0 = *pos0_dev;
  const int64_t t = blockIdx.x;
  const int64_t nv = ((row_pos ? row_pos[t] : pos0 + t) + 1) / ratio;  // row_pos: decode rows
  int32_t* out = itop + t * top_k;
  if (nv <= top_k) {
    for (int64_t w = threadIdx.x; w < nv; w += blockDim.x) out[w] = int32_t(w);
    return;
  }
  const float* sc = scores + t * stride;
  uint32_t prefix = 0, mask = 0;
  int remaining = top_k;  // rank wanted among the keys that match prefix under mask
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t w = threadIdx.x; w < nv; w += blockDim.x) {
      const uint32_t key = score_key(sc[w]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    // The digit: the largest dg with (count of digits above it) < remaining
    // <= (that count + hist[dg]). Thread i < 256 holds digit 255 - i, so an
    // inclusive scan in thread order counts the digits from the top; the
    // one thread whose scan crosses `remaining` there writes the result
    // (one scan instead of one thread's walk over 256 bins per pass).
    if (threadIdx.x < 256) {
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      const int dg = 255 - int(threadIdx.x), c = hist[dg];
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(kFullMask, incl, o);
        if (lane >= o) incl += v;
      }
      if (lane == 31) warp_cnt[warp] = incl;
      asm volatile("bar.sync 1, 256;" ::: "memory");  // the first 256 threads only
      for (int k = 0; k < warp; ++k) incl += warp_cnt[k];
      if (incl >= remaining && incl - c < remaining) {
        sh_prefix = prefix | (uint32_t(dg) << shift);
        sh_remaining = remaining - (incl - c);
      }
    }
    __syncthreads();
    prefix = sh_prefix;
    remaining = sh_remaining;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  const uint32_t key_t = prefix;  // the top_k-th largest key; take `remaining` of its ties
  int base = 0, eq_base = 0;
  for (int64_t w0 = 0; w0 < nv; w0 += blockDim.x) {
    const int64_t w = w0 + threadIdx.x;
    const uint32_t key = w < nv ? score_key(sc[w]) : 0u;
    const bool eq = w < nv && key == key_t, gt = w < nv && key > key_t;
    int eq_before, eq_total, before, total;
    block_count(eq, warp_cnt, eq_before, eq_total);
    const bool take = gt || (eq && eq_base + eq_before < remaining);
    block_count(take, warp_cnt, before, total);
    if (take) out[base + before] = int32_t(w);
    base += total;
    eq_base += eq_total;
  }
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

}  // namespace

void ds4_indexer_select(const Ds4IndexerParams& p, cudaStream_t stream) {
  const char* who = "ds4_indexer_select";
  require(p.n_head >= 1 && p.head_dim >= 32 && p.head_dim <= kMaxHeadDim && p.head_dim % 32 == 0, who,
          "head_dim must be a multiple of 32 up to 512");
  require(p.ratio >= 1 && p.top_k >= 1, who, "ratio and top_k must be positive");
  require(p.n_tokens >= 1 && p.n_tokens <= 65535 && p.pos0 >= 0, who, "1..65535 tokens");
  require(p.q && p.w && p.rows && p.scores && p.itop, who, "null buffer");
  require(reinterpret_cast<uintptr_t>(p.q) % 16 == 0, who, "q must be 16-byte aligned");
  require(p.batch.seq == nullptr || (p.batch.pos && p.batch.seq_stride > 0 && !p.pos0_dev), who,
          "decode rows need positions and a sequence stride, and no device pos0");
  const int64_t max_nv = (p.batch.seq ? p.pos0 + 1 : p.pos0 + p.n_tokens) / p.ratio;
  require(p.score_stride >= max_nv, who, "score_stride below the number of rows");
  if (max_nv > p.top_k) {
    const size_t shared = size_t(p.n_head) * size_t(p.head_dim + 1) * sizeof(float);
    require(shared <= 200 * 1024, who, "indexer queries too large for shared memory");
    if (shared > 48 * 1024) {
      BATON_CUDA_CHECK(
          cudaFuncSetAttribute(indexer_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    }
    const int warps = 8;
    const int64_t blocks = std::clamp<int64_t>((max_nv + warps - 1) / warps, 1, int64_t(sm_count()) * 2);
    launch_pdl("indexer_score_kernel", indexer_score_kernel, dim3(dim3(unsigned(blocks), unsigned(p.n_tokens))),
               dim3(warps * 32), shared, stream, p);
    check_launch("indexer_score_kernel");
  }
  launch_pdl("indexer_topk_kernel", indexer_topk_kernel, dim3(unsigned(p.n_tokens)), dim3(kTopkThreads), 0, stream,
             p.scores, p.score_stride, p.pos0, p.ratio, p.top_k, p.itop, p.pos0_dev, p.batch.pos);
  check_launch("indexer_topk_kernel");
}

void ds4_indexer_topk(const Ds4IndexerParams& p, cudaStream_t stream) {
  const char* who = "ds4_indexer_topk";
  require(p.ratio >= 1 && p.top_k >= 1, who, "ratio and top_k must be positive");
  require(p.n_tokens >= 1 && p.n_tokens <= 65535 && p.pos0 >= 0, who, "1..65535 tokens");
  require(p.scores && p.itop, who, "null buffer");
  require(p.score_stride >= (p.batch.seq ? p.pos0 + 1 : p.pos0 + p.n_tokens) / p.ratio, who,
          "score_stride below the number of rows");
  launch_pdl("indexer_topk_kernel", indexer_topk_kernel, dim3(unsigned(p.n_tokens)), dim3(kTopkThreads), 0, stream,
             p.scores, p.score_stride, p.pos0, p.ratio, p.top_k, p.itop, p.pos0_dev, p.batch.pos);
  check_launch("indexer_topk_kernel");
}

void ds4_scale(float* x, int64_t n, float s, cudaStream_t stream) {
  require(x != nullptr && n >= 0, "ds4_scale", "bad arguments");
  if (n == 0) return;
  launch_pdl("scale_kernel", scale_kernel, dim3(grid_for(n, 256)), dim3(256), 0, stream, x, n, s);
  check_launch("scale_kernel");
}

}  // namespace baton::cuda
