// Tensor-core attention for DeepSeek V4 prefill (see ds4_attn_tc.cuh).
//
// Block = one token, 4 warps per 16 heads (head tile mh, slice md of 4).
// Per tile of 64 visible rows:
//   1. the rows are gathered (window from the batch or the ring, compressed
//      rows by index), rounded to F16 into shared memory;
//   2. scores: warp (mh, md) computes heads mh x rows [16 md, 16 md + 16)
//      over all hd dims (mma m16n8k16) and stores them, scaled, in shared;
//   3. each warp reads its 16 heads x 64 scores, updates the running max and
//      sum (online softmax that starts at the sink: m = sink, l = 1), turns
//      the probabilities into F16 A fragments in registers, rescales and
//      accumulates its output slice [16 heads x hd / 4 dims] from the same
//      F16 rows (ldmatrix.trans gives the V fragments).
// The four warps of a head tile compute identical maxima and sums (same
// inputs, same order). Fragment layouts are the PTX ISA's for
// mma.m16n8k16 (g = lane / 4, t = lane % 4): A regs {row g, cols 2t..},
// {row g+8}, {row g, cols 2t+8..}, {row g+8, cols 2t+8..}; B regs {k 2t..,
// n g}, {k 2t+8.., n g}; C {row g, cols 2t, 2t+1}, {row g+8, ...}.
#include "kernels/cuda/ds4_attn_tc.cuh"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"

namespace baton::cuda {
namespace {

constexpr int kRows = 64;       // visible rows per tile
constexpr int kPadH = 8;        // halves of padding per shared row (ldmatrix without bank conflicts)
constexpr int kSStride = 72;    // floats per score row in shared
constexpr int kMaxHeadTiles = 4;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
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

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <int HD>
__global__ void __launch_bounds__(kMaxHeadTiles * 4 * 32, 1) attention_tc_kernel(Ds4AttentionParams p) {
  constexpr int kLd = HD + kPadH;       // halves per shared row
  constexpr int kSlice = HD / 4;        // output dims per warp
  constexpr int kNt = kSlice / 8;       // output n-tiles per warp (even)
  extern __shared__ __align__(16) unsigned char smem[];
  const int head_tiles = int(blockDim.x) / 128;
  __half* qs = reinterpret_cast<__half*>(smem);                 // head_tiles*16 rows
  __half* ks = qs + head_tiles * 16 * kLd;                      // kRows rows
  float* ss = reinterpret_cast<float*>(ks + kRows * kLd);       // head_tiles x 16 x kSStride
  int* bad_flag = reinterpret_cast<int*>(ss + head_tiles * 16 * kSStride);

  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int mh = warp >> 2, md = warp & 3;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t t = blockIdx.x, pos = p.pos0 + t;
  const int64_t lo = pos - p.window + 1 > 0 ? pos - p.window + 1 : 0, n_win = pos - lo + 1;
  const int64_t nv = p.ratio > 0 ? (pos + 1) / p.ratio : 0;
  const int64_t n_comp = p.itop ? (nv < p.top_k ? nv : int64_t(p.top_k)) : nv;
  const int64_t n = n_win + n_comp;

  // Queries of every head (zero rows past n_head), rounded to F16.
  if (threadIdx.x == 0) *bad_flag = 0;
  const float* qt = p.q + t * p.q_stride;
  for (int i = threadIdx.x; i < head_tiles * 16 * (HD / 4); i += blockDim.x) {
    const int h = i / (HD / 4), c = (i % (HD / 4)) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (h < p.n_head) v = *reinterpret_cast<const float4*>(qt + int64_t(h) * HD + c);
    uint2 packed;
    packed.x = pack_half2(v.x, v.y);
    packed.y = pack_half2(v.z, v.w);
    *reinterpret_cast<uint2*>(qs + h * kLd + c) = packed;
  }

  const int hA = mh * 16 + g, hB = hA + 8;
  float mA = hA < p.n_head ? p.sinks[hA] : 0.0f, mB = hB < p.n_head ? p.sinks[hB] : 0.0f;
  float lA = 1.0f, lB = 1.0f;
  float o[kNt][4];
#pragma unroll
  for (int i = 0; i < kNt; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (int64_t r0 = 0; r0 < n; r0 += kRows) {
    __syncthreads();  // the previous tile's rows are no longer read (and qs is written)
    // 1. Gather rows r0 .. r0 + 63 of the visible list as F16 (four loads in
    //    flight per thread before the first use).
    constexpr int kTotal = kRows * (HD / 4);
    for (int base = 0; base < kTotal; base += 4 * int(blockDim.x)) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * int(blockDim.x) + int(threadIdx.x);
        const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
        const int64_t k = r0 + r;
        v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i >= kTotal) continue;
        if (k < n_win) {
          const int64_t j = lo + k;
          const float* row = j >= p.pos0 ? p.kv_new + (j - p.pos0) * HD : p.ring + (j % p.window) * HD;
          v[u] = *reinterpret_cast<const float4*>(row + c);
        } else if (k < n) {
          const int64_t cidx = k - n_win;
          const int64_t idx = p.itop ? int64_t(p.itop[t * p.top_k + cidx]) : cidx;
          if (idx < 0 || idx >= nv) {
            *bad_flag = 1;  // not a complete row: refuse rather than read it
          } else {
            v[u] = *reinterpret_cast<const float4*>(p.comp_rows + idx * HD + c);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * int(blockDim.x) + int(threadIdx.x);
        if (i >= kTotal) continue;
        const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
        uint2 packed;
        packed.x = pack_half2(v[u].x, v[u].y);
        packed.y = pack_half2(v[u].z, v[u].w);
        *reinterpret_cast<uint2*>(ks + r * kLd + c) = packed;
      }
    }
    __syncthreads();

    // 2. Scores of heads mh x rows [16 md, 16 md + 16).
    {
      float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const int mi = lane >> 3;
      const uint32_t a_base = smem_u32(qs + (mh * 16 + (lane & 7) + (mi & 1) * 8) * kLd + (mi >> 1) * 8);
      const uint32_t b_base = smem_u32(ks + (md * 16 + (lane & 7) + (mi >> 1) * 8) * kLd + (mi & 1) * 8);
#pragma unroll 8
      for (int d0 = 0; d0 < HD; d0 += 16) {
        uint32_t a[4], b[4];
        ldsm_x4(a_base + d0 * 2, a[0], a[1], a[2], a[3]);
        ldsm_x4(b_base + d0 * 2, b[0], b[1], b[2], b[3]);
        mma16816(acc[0], a, b[0], b[1]);
        mma16816(acc[1], a, b[2], b[3]);
      }
      float* srow = ss + (mh * 16) * kSStride;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = md * 16 + nt * 8 + 2 * tq;
        *reinterpret_cast<float2*>(srow + g * kSStride + col) = make_float2(acc[nt][0] * p.scale, acc[nt][1] * p.scale);
        *reinterpret_cast<float2*>(srow + (g + 8) * kSStride + col) =
            make_float2(acc[nt][2] * p.scale, acc[nt][3] * p.scale);
      }
    }
    __syncthreads();

    // 3. Online softmax over the 64 scores of rows hA, hB, then P V.
    const int valid = n - r0 < kRows ? int(n - r0) : kRows;
    float sA[16], sB[16];
    const float* rowA = ss + (mh * 16 + g) * kSStride;
    const float* rowB = rowA + 8 * kSStride;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = kk * 16 + half * 8 + 2 * tq;
        const float2 a = *reinterpret_cast<const float2*>(rowA + col);
        const float2 b = *reinterpret_cast<const float2*>(rowB + col);
        const int e = kk * 4 + half * 2;
        sA[e] = col < valid ? a.x : -INFINITY;
        sA[e + 1] = col + 1 < valid ? a.y : -INFINITY;
        sB[e] = col < valid ? b.x : -INFINITY;
        sB[e + 1] = col + 1 < valid ? b.y : -INFINITY;
      }
    }
    float xA = -INFINITY, xB = -INFINITY;
#pragma unroll
    for (int e = 0; e < 16; ++e) xA = fmaxf(xA, sA[e]), xB = fmaxf(xB, sB[e]);
    xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 1));
    xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 2));
    xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 1));
    xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 2));
    const float nA = fmaxf(mA, xA), nB = fmaxf(mB, xB);
    const float cA = expf(mA - nA), cB = expf(mB - nB);
    mA = nA, mB = nB;
    uint32_t pa[4][4];
    float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = kk * 4 + half * 2;
        const __half2 hA2 = __floats2half2_rn(expf(sA[e] - nA), expf(sA[e + 1] - nA));
        const __half2 hB2 = __floats2half2_rn(expf(sB[e] - nB), expf(sB[e + 1] - nB));
        const float2 fA = __half22float2(hA2), fB = __half22float2(hB2);
        sumA += fA.x + fA.y;
        sumB += fB.x + fB.y;
        pa[kk][half * 2] = *reinterpret_cast<const uint32_t*>(&hA2);
        pa[kk][half * 2 + 1] = *reinterpret_cast<const uint32_t*>(&hB2);
      }
    }
    sumA += __shfl_xor_sync(0xffffffffu, sumA, 1);
    sumA += __shfl_xor_sync(0xffffffffu, sumA, 2);
    sumB += __shfl_xor_sync(0xffffffffu, sumB, 1);
    sumB += __shfl_xor_sync(0xffffffffu, sumB, 2);
    lA = lA * cA + sumA;
    lB = lB * cB + sumB;
#pragma unroll
    for (int i = 0; i < kNt; ++i) o[i][0] *= cA, o[i][1] *= cA, o[i][2] *= cB, o[i][3] *= cB;
    {
      const int mi = lane >> 3;
      const uint32_t v_base = smem_u32(ks + ((lane & 7) + (mi & 1) * 8) * kLd + md * kSlice + (mi >> 1) * 8);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int np = 0; np < kNt / 2; ++np) {
          uint32_t b[4];
          ldsm_x4_t(v_base + (kk * 16 * kLd + np * 16) * 2, b[0], b[1], b[2], b[3]);
          mma16816(o[2 * np], pa[kk], b[0], b[1]);
          mma16816(o[2 * np + 1], pa[kk], b[2], b[3]);
        }
      }
    }
  }
  __syncthreads();  // bad_flag from every gather
  const bool bad = *bad_flag != 0;
  const float iA = bad ? NAN : 1.0f / lA, iB = bad ? NAN : 1.0f / lB;
  float* ot = p.out + t * p.out_stride;
#pragma unroll
  for (int i = 0; i < kNt; ++i) {
    const int d = md * kSlice + i * 8 + 2 * tq;
    if (hA < p.n_head) *reinterpret_cast<float2*>(ot + int64_t(hA) * HD + d) = make_float2(o[i][0] * iA, o[i][1] * iA);
    if (hB < p.n_head) *reinterpret_cast<float2*>(ot + int64_t(hB) * HD + d) = make_float2(o[i][2] * iB, o[i][3] * iB);
  }
}

size_t smem_bytes(int hd, int head_tiles) {
  return size_t(head_tiles * 16 + kRows) * size_t(hd + kPadH) * 2 + size_t(head_tiles) * 16 * kSStride * 4 + 16;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <int HD>
void launch(const Ds4AttentionParams& p, cudaStream_t stream) {
  const int head_tiles = (p.n_head + 15) / 16;
  const size_t shared = smem_bytes(HD, head_tiles);
  BATON_CUDA_CHECK(cudaFuncSetAttribute(attention_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(shared)));
  attention_tc_kernel<HD><<<unsigned(p.n_tokens), unsigned(head_tiles * 128), shared, stream>>>(p);
  check_launch("attention_tc_kernel");
}

}  // namespace

bool ds4_attention_tc_supported(const Ds4AttentionParams& p) {
  const int hd = p.head_dim;
  if (hd != 64 && hd != 128 && hd != 256 && hd != 512) return false;
  if (p.n_head < 1 || p.n_head > kMaxHeadTiles * 16 || p.pos0_dev != nullptr) return false;
  if (p.q_stride % 4 != 0 || p.out_stride % 4 != 0) return false;
  if (!aligned16(p.q) || !aligned16(p.out) || !aligned16(p.kv_new) || !aligned16(p.ring) ||
      !aligned16(p.comp_rows)) {
    return false;
  }
  return smem_bytes(hd, (p.n_head + 15) / 16) <= 227 * 1024;
}

void ds4_attention_tc(const Ds4AttentionParams& p, cudaStream_t stream) {
  const std::string who = "ds4_attention_tc";
  if (!ds4_attention_tc_supported(p)) {
    throw std::invalid_argument(who + ": needs head_dim 64/128/256/512, at most 64 heads, a host position and "
                                      "16-byte aligned buffers");
  }
  if (p.n_tokens < 1 || p.n_tokens > INT32_MAX || p.pos0 < 0 || p.window < 1) {
    throw std::invalid_argument(who + ": needs tokens, a position >= 0 and a window");
  }
  if (!p.q || !p.kv_new || !p.sinks || !p.out || (p.pos0 > 0 && !p.ring) || (p.ratio > 0 && !p.comp_rows) ||
      (p.itop && (p.ratio <= 0 || p.top_k < 1)) || p.ratio < 0) {
    throw std::invalid_argument(who + ": a buffer is missing for these parameters");
  }
  if (p.q_stride < int64_t(p.n_head) * p.head_dim || p.out_stride < int64_t(p.n_head) * p.head_dim) {
    throw std::invalid_argument(who + ": strides below n_head * head_dim");
  }
  switch (p.head_dim) {
    case 64: launch<64>(p, stream); break;
    case 128: launch<128>(p, stream); break;
    case 256: launch<256>(p, stream); break;
    default: launch<512>(p, stream); break;
  }
}

}  // namespace baton::cuda
