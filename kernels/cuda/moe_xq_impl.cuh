// The integer-dot routed-expert kernels of moe_xq.cu and their launcher
// (device-only; include from .cu files). moe_xq.cu picks the gate/up
// configuration; the micro-benchmark instantiates others to compare them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/iq2_grid.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu_act.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda::detail {

inline constexpr int kDownRows = 4;  // down: output rows per block, each warp one expert's share
constexpr int kDownWarps = 8; // experts worked on at once; slot j goes to warp j % 8
constexpr uint32_t kOnes = 0x01010101u;

// The IQ2_XXS tables in shared memory, built by each block before its
// pdl_wait() (they depend on nothing): the grid, and for each 7-bit sign
// field the 8-byte mask (0xff where the value is negative, the eighth sign
// the field's parity).
struct Iq2Tables {
  uint2 grid[256];
  uint2 sign[128];
};
__device__ __forceinline__ void build_iq2_tables(Iq2Tables& t) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    const uint64_t g = kIq2xxsGridDevice[i];
    t.grid[i] = make_uint2(uint32_t(g), uint32_t(g >> 32));
  }
  for (int i = threadIdx.x; i < 128; i += blockDim.x) {
    const uint32_t signs = uint32_t(i) | ((__popc(i) & 1u) << 7);
    uint32_t m[2] = {0u, 0u};
#pragma unroll
    for (int b = 0; b < 8; ++b) m[b >> 2] |= ((signs >> b) & 1u) ? 0xffu << (8 * (b & 3)) : 0u;
    t.sign[i] = make_uint2(m[0], m[1]);
  }
}

// Four magnitude bytes (each 8..43) negated where the mask byte is 0xff:
// (g ^ 0xff) + 1 = 256 - g per byte, never carrying into the next byte.
__device__ __forceinline__ int apply_signs(uint32_t g, uint32_t m) { return int((g ^ m) + (m & kOnes)); }

// The mask of four sign bits (bit i: byte i negative) by arithmetic: the
// multiply puts bit i at bit 8i (the copies never overlap), then 0x01 -> 0xff.
__device__ __forceinline__ uint32_t sign_mask4(uint32_t bits4) { return ((bits4 * 0x00204081u) & kOnes) * 0xffu; }

// Where the kernels find the grid and the signs (the benchmark compares them):
// the grid from shared memory or through the read-only cache, the 8-byte
// sign masks from a shared table or by arithmetic.
template <bool kSharedGrid, bool kSignTable>
struct Iq2Lookup {
  __device__ static uint2 grid(const Iq2Tables& t, uint32_t i) {
    if constexpr (kSharedGrid) {
      return t.grid[i];
    } else {
      const uint64_t g = __ldg(reinterpret_cast<const unsigned long long*>(&kIq2xxsGridDevice[i]));
      return make_uint2(uint32_t(g), uint32_t(g >> 32));
    }
  }
  __device__ static uint2 signs(const Iq2Tables& t, uint32_t s7) {
    if constexpr (kSignTable) {
      return t.sign[s7];
    } else {
      const uint32_t signs = s7 | ((__popc(s7) & 1u) << 7);
      return make_uint2(sign_mask4(signs & 15u), sign_mask4(signs >> 4));
    }
  }
  static constexpr bool kNeedsTables = kSharedGrid || kSignTable;
};

// Run r (32 values) of an IQ2_XXS row against the 16-bit activations of the
// same run: db * (256 * sum v hi + sum v lo), v the signed grid values.
template <class L>
__device__ __forceinline__ float iq2xxs_run_dot(const Iq2Tables& tb, const uint8_t* row, int r,
                                                const uint32_t (&hi)[8], const uint32_t (&lo)[8]) {
  const uint8_t* sb = row + uint64_t(r >> 3) * 66;
  uint32_t grp[2];
  ld_words_a2<2>(sb + 2 + 8 * (r & 7), grp);
  const uint32_t aux = grp[1];
  int sh = 0, sl = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint2 g = L::grid(tb, (grp[0] >> (8 * q)) & 0xffu);
    const uint2 m = L::signs(tb, (aux >> (7 * q)) & 127u);
    const int v0 = apply_signs(g.x, m.x), v1 = apply_signs(g.y, m.y);
    sh = __dp4a(v0, int(hi[2 * q]), sh);
    sh = __dp4a(v1, int(hi[2 * q + 1]), sh);
    sl = __dp4a(v0, int(lo[2 * q]), sl);
    sl = __dp4a(v1, int(lo[2 * q + 1]), sl);
  }
  const float db = half_bits_to_float(ld_u16(sb)) * (0.5f + float(aux >> 28)) * 0.25f;
  return db * float(sh * 256 + sl);
}

// Block (x: 32 rows of n_ff, y: pair): the clamped SwiGLU of gate and up rows
// of expert ids[pair] with token pair / k's quantized x, then those 32
// activations quantized as run blockIdx.x of the pair's act row: kGuWarps
// warps of kGuRows rows (gate and up each), kGuWarps * kGuRows = 32; each
// lane's runs are unrolled by two. kMinBlocks: resident blocks per SM the
// registers must allow (1: no bound).
template <int kGuWarps, int kGuRows, class L, int kMinBlocks>
__global__ void __launch_bounds__(kGuWarps * 32, kMinBlocks)
    xq_gate_up_kernel(const uint8_t* __restrict__ gate, const uint8_t* __restrict__ up, uint64_t row_bytes,
                      int64_t ff, int64_t cols, int64_t n_expert, const uint8_t* __restrict__ xq, uint64_t xq_bytes,
                      const int32_t* __restrict__ ids, int k, float clamp, uint8_t* __restrict__ act,
                      uint64_t act_bytes) {
  static_assert(kGuWarps * kGuRows == 32, "a block makes one run of 32 activations");
  __shared__ float acts[kGuWarps * kGuRows];
  __shared__ Iq2Tables tb;
  if constexpr (L::kNeedsTables) build_iq2_tables(tb);  // constants: before the wait
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // ids and x come from the kernels before
  if constexpr (L::kNeedsTables) __syncthreads();  // the tables
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t pair = blockIdx.y;
  const int32_t e = ids[pair];
  const bool bad = e < 0 || int64_t(e) >= n_expert;  // uniform over the block
  if (!bad) {
    const XqRow x = xq_row(xq + uint64_t(pair / k) * xq_bytes, cols);
    const int64_t row0 = int64_t(blockIdx.x) * (kGuWarps * kGuRows) + warp * kGuRows;
    const uint8_t* g_rows = gate + (uint64_t(e) * uint64_t(ff) + uint64_t(row0)) * row_bytes;
    const uint8_t* u_rows = up + (uint64_t(e) * uint64_t(ff) + uint64_t(row0)) * row_bytes;
    float acc[2 * kGuRows] = {};
    const int runs = int(cols / 32);
#pragma unroll 2
    for (int r = lane; r < runs; r += 32) {
      uint32_t hi[8], lo[8];
      const uint4* h4 = reinterpret_cast<const uint4*>(x.hi + 32 * r);
      const uint4* l4 = reinterpret_cast<const uint4*>(x.lo + 32 * r);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 a = __ldg(h4 + i), b = __ldg(l4 + i);
        hi[4 * i] = a.x, hi[4 * i + 1] = a.y, hi[4 * i + 2] = a.z, hi[4 * i + 3] = a.w;
        lo[4 * i] = b.x, lo[4 * i + 1] = b.y, lo[4 * i + 2] = b.z, lo[4 * i + 3] = b.w;
      }
      const float dx = __ldg(&x.ds[r].x);
#pragma unroll
      for (int j = 0; j < kGuRows; ++j) {
        acc[j] += dx * iq2xxs_run_dot<L>(tb, g_rows + j * row_bytes, r, hi, lo);
        acc[kGuRows + j] += dx * iq2xxs_run_dot<L>(tb, u_rows + j * row_bytes, r, hi, lo);
      }
    }
#pragma unroll
    for (int j = 0; j < 2 * kGuRows; ++j) acc[j] = warp_sum(acc[j]);
    if (lane < kGuRows) {
      float g = acc[0], u = acc[kGuRows];
#pragma unroll
      for (int j = 1; j < kGuRows; ++j) {
        if (lane == j) g = acc[j], u = acc[kGuRows + j];
      }
      acts[warp * kGuRows + lane] = swiglu_act<true>(g, u, clamp);
    }
  }
  __syncthreads();
  if (warp == 0) {
    // A bad id quantizes NaN garbage; the down kernel turns the pair into NaN.
    const float v = bad ? 0.0f : acts[lane];
    xq_store_run(v, lane, act + uint64_t(pair) * act_bytes, ff, blockIdx.x);
  }
}

// Block (x: kDownRows rows of n_embd, y: token t): out[t][r] = sum_j w_j *
// (Q2_K down row r of expert ids[t*k + j]) . act[t*k + j], in slot order.
// Warp w takes slots w, w + 8, ...: the experts' loads are in flight together
// (one warp walking all k experts waited for memory k times); each slot's
// weighted sum goes to shared memory and the slots are added in order, so
// the result is the same as one warp's running sum. Lane c of a warp reads
// 16-byte chunks c, c + 32, ... of each row's quants: chunk c of a
// super-block holds elements 128 * (c / 2) + 32 * s + 16 * (c % 2) + b for
// shift s in 0..3 and byte b in 0..15, so it meets four sub-blocks (scale
// bytes 8 * (c / 2) + 2 * s + c % 2).
static __global__ void __launch_bounds__(kDownWarps * 32)
    xq_down_kernel(const uint8_t* __restrict__ down, uint64_t row_bytes, int64_t n_out, int64_t ff,
                   int64_t n_expert, const uint8_t* __restrict__ act, uint64_t act_bytes,
                   const int32_t* __restrict__ ids, const float* __restrict__ weights, int k,
                   float* __restrict__ out, int64_t out_stride) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // the activations come from the gate/up kernel
  __shared__ float slot_sum[32][kDownRows];  // k <= 32
  __shared__ int slot_bad[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.y;
  const int64_t row0 = int64_t(blockIdx.x) * kDownRows;
  const int chunks = int(ff / 256) * 4;
  for (int j = warp; j < k; j += kDownWarps) {
    const int64_t pair = t * k + j;
    const int32_t e = ids[pair];
    if (e < 0 || int64_t(e) >= n_expert) {
      if (lane == 0) slot_bad[j] = 1;
      continue;
    }
    const XqRow a = xq_row(act + uint64_t(pair) * act_bytes, ff);
    const uint8_t* rows = down + (uint64_t(e) * uint64_t(n_out) + uint64_t(row0)) * row_bytes;
    float acc[kDownRows] = {};
    for (int c = lane; c < chunks; c += 32) {
      const int sbi = c >> 2, cc = c & 3, half = cc >> 1, h = cc & 1;
      // The rows' quants of the chunk, scale bytes and super-block scales first.
      uint32_t q[kDownRows][4], sc_a[kDownRows], sc_b[kDownRows];
      float d[kDownRows], dmin[kDownRows];
#pragma unroll
      for (int i = 0; i < kDownRows; ++i) {
        const uint8_t* sb = rows + uint64_t(i) * row_bytes + uint64_t(sbi) * 84;
        const uint32_t dd = ld_u32(sb + 80);
        d[i] = half_bits_to_float(dd & 0xffffu);
        dmin[i] = half_bits_to_float(dd >> 16);
        sc_a[i] = ld_u32(sb + 8 * half);
        sc_b[i] = ld_u32(sb + 8 * half + 4);
#pragma unroll
        for (int w = 0; w < 4; ++w) q[i][w] = ld_u32(sb + 16 + 16 * cc + 4 * w);
      }
      // Per shift s: 16 activations (4 words of hi and lo), shared by the rows.
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int64_t e0 = int64_t(sbi) * 256 + 128 * half + 32 * s + 16 * h;
        const uint4 x4 = __ldg(reinterpret_cast<const uint4*>(a.hi + e0));
        const uint4 y4 = __ldg(reinterpret_cast<const uint4*>(a.lo + e0));
        const int ah[4] = {int(x4.x), int(x4.y), int(x4.z), int(x4.w)};
        const int al[4] = {int(y4.x), int(y4.y), int(y4.z), int(y4.w)};
        const float dx = __ldg(&a.ds[e0 / 32].x);
        int qh = 0, ql = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) qh = __dp4a(int(kOnes), ah[w], qh), ql = __dp4a(int(kOnes), al[w], ql);
        const float qsum = float(qh * 256 + ql);
#pragma unroll
        for (int i = 0; i < kDownRows; ++i) {
          const uint32_t sc = ((s < 2 ? sc_a[i] : sc_b[i]) >> (8 * (2 * (s & 1) + h))) & 0xffu;
          int vh = 0, vl = 0;
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const int v = int((q[i][w] >> (2 * s)) & 0x03030303u);
            vh = __dp4a(v, ah[w], vh);
            vl = __dp4a(v, al[w], vl);
          }
          acc[i] += dx * (d[i] * float(sc & 15u) * float(vh * 256 + vl) - dmin[i] * float(sc >> 4) * qsum);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kDownRows; ++i) {
      const float v = weights[pair] * warp_sum(acc[i]);
      if (lane == 0) slot_sum[j][i] = v;
    }
    if (lane == 0) slot_bad[j] = 0;
  }
  __syncthreads();
  if (threadIdx.x < kDownRows) {
    float total = 0.0f;
    bool bad = false;
    for (int j = 0; j < k; ++j) {
      if (slot_bad[j]) {
        bad = true;
        continue;
      }
      total += slot_sum[j][threadIdx.x];
    }
    out[t * out_stride + row0 + threadIdx.x] = bad ? NAN : total;
  }
}


// moe_decode_xq's two launches with the gate/up configuration given (the
// checks are moe_decode_xq's): warps, rows per warp, IQ2_XXS lookups and
// register bound (resident blocks per SM; 1: none).
template <int kGuWarps, int kGuRows, class L, int kGuMinBlocks = 1>
void launch_moe_decode_xq(const MoeWeights& m, const void* xq, int64_t n_tokens, const int32_t* ids,
                          const float* weights, int k, float* out, int64_t out_stride, void* workspace,
                          cudaStream_t stream) {
  const int64_t ff = m.gate.rows_per_expert(), n_embd = m.gate.w.cols;
  auto* act = static_cast<uint8_t*>(workspace);
  const uint64_t act_bytes = xq_row_bytes(ff);
  launch_pdl("xq_gate_up_kernel", xq_gate_up_kernel<kGuWarps, kGuRows, L, kGuMinBlocks>,
             dim3(unsigned(ff / (kGuWarps * kGuRows)), unsigned(n_tokens * k)), dim3(kGuWarps * 32), 0, stream,
             static_cast<const uint8_t*>(m.gate.w.data), static_cast<const uint8_t*>(m.up.w.data),
             m.gate.w.row_bytes, ff, n_embd, m.gate.n_expert, static_cast<const uint8_t*>(xq),
             xq_row_bytes(n_embd), ids, k, m.clamp, act, act_bytes);
  launch_pdl("xq_down_kernel", xq_down_kernel, dim3(unsigned(n_embd / kDownRows), unsigned(n_tokens)),
             dim3(unsigned(std::min(k, kDownWarps) * 32)), 0, stream, static_cast<const uint8_t*>(m.down.w.data),
             m.down.w.row_bytes, n_embd, ff, m.down.n_expert, static_cast<const uint8_t*>(act), act_bytes, ids,
             weights, k, out, out_stride);
}

}  // namespace baton::cuda::detail
