// Tensor-core indexer scores (see ds4_indexer_tc.cuh).
//
// Block = one token, warp mh = heads [16 mh, 16 mh + 16). Per tile of 64
// rows: the rows are split into F16 high and low parts in shared memory;
// each warp computes its 16 heads x 64 rows with three mma per fragment
// (hi.hi into one accumulator, hi.lo + lo.hi into another), applies relu
// and the head weights, sums its 16 heads with shuffles, and the warps'
// sums are added in warp order. Fragment layouts as in ds4_attn_tc.cu.
#include "kernels/cuda/ds4_indexer_tc.cuh"

#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"

namespace baton::cuda {
namespace {

constexpr int kRows = 64;
constexpr int kPadH = 8;
constexpr int kMaxHeadTiles = 4;
constexpr float kLoScale = 2048.0f;  // 2^11: the low part back in F16's normal range

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four floats into their F16 high parts and scaled low parts.
__device__ __forceinline__ void split4(float4 v, __half* hi, __half* lo) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  __align__(8) __half h[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[i] = __float2half_rn(f[i]);
    l[i] = __float2half_rn((f[i] - __half2float(h[i])) * kLoScale);
  }
  *reinterpret_cast<uint2*>(hi) = *reinterpret_cast<const uint2*>(h);
  *reinterpret_cast<uint2*>(lo) = *reinterpret_cast<const uint2*>(l);
}

template <int HD>
__global__ void __launch_bounds__(kMaxHeadTiles * 32) indexer_scores_tc_kernel(Ds4IndexerParams p) {
  constexpr int kLd = HD + kPadH;
  extern __shared__ __align__(16) unsigned char smem[];
  const int head_tiles = int(blockDim.x) / 32;
  const int rows_q = head_tiles * 16;
  __half* qh = reinterpret_cast<__half*>(smem);
  __half* ql = qh + rows_q * kLd;
  __half* kh = ql + rows_q * kLd;
  __half* kl = kh + kRows * kLd;
  float* red = reinterpret_cast<float*>(kl + kRows * kLd);  // head_tiles x kRows

  const int64_t t = blockIdx.x;
  const int64_t nv = (p.pos0 + t + 1) / p.ratio;
  if (nv <= p.top_k) return;  // every row is taken: no scores needed (block-uniform)
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int g = lane >> 2, tq = lane & 3;

  const float* qt = p.q + t * int64_t(p.n_head) * HD;
  for (int i = threadIdx.x; i < rows_q * (HD / 4); i += blockDim.x) {
    const int h = i / (HD / 4), c = (i % (HD / 4)) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (h < p.n_head) v = *reinterpret_cast<const float4*>(qt + int64_t(h) * HD + c);
    split4(v, qh + h * kLd + c, ql + h * kLd + c);
  }
  const int hA = warp * 16 + g, hB = hA + 8;
  const float wA = hA < p.n_head ? p.w[t * p.n_head + hA] : 0.0f;
  const float wB = hB < p.n_head ? p.w[t * p.n_head + hB] : 0.0f;
  float* out = p.scores + t * p.score_stride;
  const int mi = lane >> 3;
  const int a_off = (warp * 16 + (lane & 7) + (mi & 1) * 8) * kLd + (mi >> 1) * 8;
  const int b_off = ((lane & 7) + (mi >> 1) * 8) * kLd + (mi & 1) * 8;

  for (int64_t r0 = 0; r0 < nv; r0 += kRows) {
    __syncthreads();  // the previous tile is read and its sums are out (and q is in)
    constexpr int kTotal = kRows * (HD / 4);
    for (int base = 0; base < kTotal; base += 4 * int(blockDim.x)) {
      float4 v[4];  // four loads in flight per thread before the first use
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * int(blockDim.x) + int(threadIdx.x);
        const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
        v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < kTotal && r0 + r < nv) v[u] = *reinterpret_cast<const float4*>(p.rows + (r0 + r) * HD + c);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * int(blockDim.x) + int(threadIdx.x);
        const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
        if (i < kTotal) split4(v[u], kh + r * kLd + c, kl + r * kLd + c);
      }
    }
    __syncthreads();
    float hh[8][4], x[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) hh[i][j] = 0.0f, x[i][j] = 0.0f;
    }
#pragma unroll
    for (int d0 = 0; d0 < HD; d0 += 16) {
      uint32_t ah[4], al[4];
      ldsm_x4(smem_u32(qh + a_off + d0), ah[0], ah[1], ah[2], ah[3]);
      ldsm_x4(smem_u32(ql + a_off + d0), al[0], al[1], al[2], al[3]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bh[4], bl[4];
        ldsm_x4(smem_u32(kh + b_off + np * 16 * kLd + d0), bh[0], bh[1], bh[2], bh[3]);
        ldsm_x4(smem_u32(kl + b_off + np * 16 * kLd + d0), bl[0], bl[1], bl[2], bl[3]);
        mma16816(hh[2 * np], ah, bh[0], bh[1]);
        mma16816(hh[2 * np + 1], ah, bh[2], bh[3]);
        mma16816(x[2 * np], ah, bl[0], bl[1]);
        mma16816(x[2 * np + 1], ah, bl[2], bl[3]);
        mma16816(x[2 * np], al, bh[0], bh[1]);
        mma16816(x[2 * np + 1], al, bh[2], bh[3]);
      }
    }
    // relu(q . k) * w over this warp's 16 heads, per row of the tile.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float dA = hh[nt][j] + x[nt][j] * (1.0f / kLoScale);
        const float dB = hh[nt][2 + j] + x[nt][2 + j] * (1.0f / kLoScale);
        float v = fmaxf(0.0f, dA) * wA + fmaxf(0.0f, dB) * wB;
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (g == 0) red[warp * kRows + nt * 8 + 2 * tq + j] = v;
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < kRows; c += blockDim.x) {
      if (r0 + c >= nv) continue;
      float s = 0.0f;
      for (int w = 0; w < head_tiles; ++w) s += red[w * kRows + c];
      out[r0 + c] = s;
    }
  }
}

size_t smem_bytes(int hd, int head_tiles) {
  return size_t(2 * (head_tiles * 16 + kRows)) * size_t(hd + kPadH) * 2 + size_t(head_tiles) * kRows * 4;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <int HD>
void launch(const Ds4IndexerParams& p, cudaStream_t stream) {
  const int head_tiles = (p.n_head + 15) / 16;
  const size_t shared = smem_bytes(HD, head_tiles);
  BATON_CUDA_CHECK(
      cudaFuncSetAttribute(indexer_scores_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
  indexer_scores_tc_kernel<HD><<<unsigned(p.n_tokens), unsigned(head_tiles * 32), shared, stream>>>(p);
  check_launch("indexer_scores_tc_kernel");
}

}  // namespace

bool ds4_indexer_scores_tc_supported(const Ds4IndexerParams& p) {
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  if (p.n_head < 1 || p.n_head > kMaxHeadTiles * 16 || p.pos0_dev != nullptr) return false;
  return aligned16(p.q) && aligned16(p.rows);
}

void ds4_indexer_scores_tc(const Ds4IndexerParams& p, cudaStream_t stream) {
  const std::string who = "ds4_indexer_scores_tc";
  if (!ds4_indexer_scores_tc_supported(p)) {
    throw std::invalid_argument(who + ": needs head_dim 64 or 128, at most 64 heads, a host position and "
                                      "16-byte aligned q and rows");
  }
  if (p.n_tokens < 1 || p.n_tokens > INT32_MAX || p.pos0 < 0 || p.ratio < 1 || p.top_k < 1) {
    throw std::invalid_argument(who + ": needs tokens, a position >= 0, a ratio and top_k");
  }
  if (!p.q || !p.w || !p.rows || !p.scores || p.score_stride < (p.pos0 + p.n_tokens) / p.ratio) {
    throw std::invalid_argument(who + ": a buffer is missing or score_stride is below the number of rows");
  }
  if ((p.pos0 + p.n_tokens) / p.ratio <= p.top_k) return;  // no token needs scores
  if (p.head_dim == 64) {
    launch<64>(p, stream);
  } else {
    launch<128>(p, stream);
  }
}

}  // namespace baton::cuda
