// DeepSeek V4 router (ds4_router.cuh).
// Each kernel follows the CPU code of engine/arch/deepseek4*.cpp step by
// step (same reduction orders where the work is per thread), so the tests
// can hold tight tolerances.
#include "kernels/cuda/ds4_router.cuh"

#include <climits>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

// (v, i) beats (bv, bi): higher value, ties to the lower id; id -1 is none.
__device__ __forceinline__ void keep_better(float& bv, int& bi, float v, int i) {
  if (i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi))) bv = v, bi = i;
}

__global__ void router_kernel(Ds4RouterParams p, float* logits, int32_t* ids, float* weights) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  extern __shared__ float sc[];  // n_expert scores, then n_expert taken flags
  int* taken = reinterpret_cast<int*>(sc + p.n_expert);
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ int picked[32];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = int(blockDim.x >> 5);
  float* lt = logits + t * p.n_expert;
  for (int e = threadIdx.x; e < p.n_expert; e += blockDim.x) {
    const float x = lt[e];
    const float s = sqrtf(x > 20.0f ? x : log1pf(expf(x)));  // softplus as torch: linear above 20
    lt[e] = s;
    sc[e] = s;
    taken[e] = 0;
  }
  __syncthreads();
  if (p.tid2eid != nullptr) {
    if (threadIdx.x == 0) {
      const int32_t tok = p.tokens[t];
      const bool ok = tok >= 0 && int64_t(tok) < p.n_vocab;
      for (int k = 0; k < p.n_used; ++k) {
        const int32_t id = ok ? p.tid2eid[int64_t(tok) * p.n_used + k] : -1;
        picked[k] = id >= 0 && id < p.n_expert ? id : -1;
      }
    }
  } else {
    // n_used passes of arg-max over the unpicked biased scores.
    for (int k = 0; k < p.n_used; ++k) {
      float bv = 0.0f;
      int bi = -1;
      for (int e = threadIdx.x; e < p.n_expert; e += blockDim.x) {
        if (!taken[e]) keep_better(bv, bi, sc[e] + (p.bias ? p.bias[e] : 0.0f), e);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(kFullMask, bv, o);
        const int i = __shfl_xor_sync(kFullMask, bi, o);
        keep_better(bv, bi, v, i);
      }
      if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < n_warps; ++w) keep_better(bv, bi, red_v[w], red_i[w]);
        picked[k] = bi;
        if (bi >= 0) taken[bi] = 1;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float w[32], sum = 0.0f;
    for (int k = 0; k < p.n_used; ++k) sum += w[k] = picked[k] >= 0 ? sc[picked[k]] : NAN;
    for (int k = 0; k < p.n_used; ++k) {
      weights[t * p.n_used + k] = (p.norm ? w[k] / (sum + 1e-20f) : w[k]) * p.scale;
      ids[t * p.n_used + k] = picked[k];
    }
  }
}

}  // namespace

void ds4_router(const Ds4RouterParams& p, float* logits, int64_t n_tokens, int32_t* ids, float* weights,
                cudaStream_t stream) {
  const char* who = "ds4_router";
  require(p.n_expert >= 1 && p.n_expert <= 4096, who, "n_expert must be 1..4096");  // scores in shared memory
  require(p.n_used >= 1 && p.n_used <= 32 && p.n_used <= p.n_expert, who, "n_used must be 1..min(32, n_expert)");
  require(n_tokens >= 1 && n_tokens <= INT_MAX, who, "n_tokens must be at least 1");
  require(logits && ids && weights, who, "null buffer");
  require((p.tid2eid == nullptr) == (p.tokens == nullptr), who, "hash routing needs both tokens and tid2eid");
  require(p.tid2eid == nullptr || p.n_vocab >= 1, who, "hash routing needs n_vocab");
  const size_t shared = size_t(p.n_expert) * (sizeof(float) + sizeof(int));
  launch_pdl("router_kernel", router_kernel, dim3(unsigned(n_tokens)), dim3(256), shared, stream, p, logits, ids,
             weights);
  check_launch("router_kernel");
}

}  // namespace baton::cuda
