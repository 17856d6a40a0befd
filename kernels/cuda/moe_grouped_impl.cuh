// The grouped routed-expert kernels of moe_grouped.cu and their launcher
// (device-only; include from .cu files): moe_grouped.cu picks the warps per
// tile, the micro-benchmark instantiates others to compare them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/iq2_grid.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu_act.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda::detail {


// A block of the product kernels: kRowGroups mma tiles of 16 rows, each
// tile's runs of 32 split over kSplit warps (a template parameter; their
// partial sums added in slice order), so that a batch of a few rows still
// has several warps' loads in flight on every multiprocessor.
constexpr int kRowGroups = 2;
constexpr int kTileRows = 16 * kRowGroups;  // output rows per block: one run of 32 activations
static_assert(kTileRows == 32, "the gate/up block quantizes one run of its 32 activations per row");
constexpr int kPlanThreads = 256;
constexpr int kMaxPairs = kGroupedMaxPairs;
constexpr int kMaxExperts = 1024;
constexpr uint32_t kByteOnes = 0x01010101u;

// One work item: rows slot0 .. slot0 + rows - 1 of the sorted pairs, all of
// one expert.
struct GroupedItem {
  int32_t expert, slot0, rows, pad;
};

inline uint64_t align256(uint64_t n) { return (n + 255) / 256 * 256; }

// Workspace: sorted pairs, slot of each pair, work list, its length, the
// quantized SwiGLU output of every slot, the down output of every slot.
struct GroupedLayout {
  uint64_t sorted, slot_of, work, n_work, act, y, bytes;
};

inline GroupedLayout grouped_layout(const MoeWeights& m, int64_t n_tokens, int k) {
  const uint64_t pairs = uint64_t(std::max<int64_t>(n_tokens, 0)) * uint64_t(std::max(k, 0));
  GroupedLayout l{};
  l.sorted = 0;
  l.slot_of = align256(pairs * 4);
  l.work = l.slot_of + align256(pairs * 4);
  l.n_work = l.work + align256(pairs * sizeof(GroupedItem));
  l.act = l.n_work + 256;
  l.y = l.act + align256(pairs * xq_row_bytes(m.gate.rows_per_expert()));
  l.bytes = l.y + align256(pairs * uint64_t(m.gate.w.cols) * sizeof(float));
  return l;
}

// Work items an expert of c pairs gives, and an upper bound for a batch.
__host__ __device__ inline int items_of(int c) { return (c + kGroupedItemRows - 1) / kGroupedItemRows; }
inline int64_t max_items(int64_t pairs, int64_t n_expert) {
  return std::min(pairs, std::min(n_expert, pairs) + pairs / kGroupedItemRows);
}

// --- grouping -----------------------------------------------------------------

__device__ __forceinline__ int warp_inclusive_scan(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

// One block: the pairs with a valid id sorted by expert (stable: pair order
// within an expert) into sorted[], each pair's position into slot_of[] (-1
// for a bad id), and the work list: each expert's slots cut into items of at
// most kGroupedItemRows, experts in id order.
static __global__ void __launch_bounds__(kPlanThreads)
    grouped_plan_kernel(const int32_t* __restrict__ ids, int n_pairs, int n_expert, int32_t* __restrict__ sorted,
                        int32_t* __restrict__ slot_of, GroupedItem* __restrict__ work, int32_t* __restrict__ n_work) {
  __shared__ int32_t sid[kMaxPairs];
  __shared__ int32_t count[kMaxExperts];
  __shared__ int32_t first[kMaxExperts];  // first slot of each expert
  __shared__ int32_t item0[kMaxExperts];  // first work item of each expert
  __shared__ int32_t warp_pairs[kPlanThreads / 32], warp_items[kPlanThreads / 32];
  pdl_trigger();
  pdl_wait();  // the router writes ids
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < n_expert; e += kPlanThreads) count[e] = 0;
  for (int p = tid; p < n_pairs; p += kPlanThreads) {
    const int32_t e = ids[p];
    sid[p] = e >= 0 && e < n_expert ? e : -1;
  }
  __syncthreads();
  for (int p = tid; p < n_pairs; p += kPlanThreads) {
    if (sid[p] >= 0) atomicAdd(&count[sid[p]], 1);  // integer counts: the same whatever the order
  }
  __syncthreads();
  // Exclusive scans of the pair and item counts: thread t owns a run of
  // consecutive experts.
  const int per = (n_expert + kPlanThreads - 1) / kPlanThreads;
  const int e0 = min(tid * per, n_expert), e1 = min(e0 + per, n_expert);
  int own_pairs = 0, own_items = 0;
  for (int e = e0; e < e1; ++e) own_pairs += count[e], own_items += items_of(count[e]);
  const int inc_pairs = warp_inclusive_scan(own_pairs, lane), inc_items = warp_inclusive_scan(own_items, lane);
  if (lane == 31) warp_pairs[warp] = inc_pairs, warp_items[warp] = inc_items;
  __syncthreads();
  int base_pairs = inc_pairs - own_pairs, base_items = inc_items - own_items, total_items = 0;
  for (int w = 0; w < kPlanThreads / 32; ++w) {
    if (w < warp) base_pairs += warp_pairs[w], base_items += warp_items[w];
    total_items += warp_items[w];
  }
  for (int e = e0; e < e1; ++e) {
    first[e] = base_pairs, item0[e] = base_items;
    base_pairs += count[e], base_items += items_of(count[e]);
  }
  if (tid == 0) *n_work = total_items;
  __syncthreads();
  for (int p = tid; p < n_pairs; p += kPlanThreads) {
    const int32_t e = sid[p];
    if (e < 0) {
      slot_of[p] = -1;
      continue;
    }
    int rank = 0;
    for (int q = 0; q < p; ++q) rank += sid[q] == e;
    const int s = first[e] + rank;
    sorted[s] = p;
    slot_of[p] = s;
  }
  for (int e = e0; e < e1; ++e) {
    const int c = count[e];
    for (int j = 0; j * kGroupedItemRows < c; ++j) {
      work[item0[e] + j] = GroupedItem{e, first[e] + j * kGroupedItemRows, min(kGroupedItemRows, c - j * kGroupedItemRows), 0};
    }
  }
}

// --- weight fragments ---------------------------------------------------------

// What a lane multiplies of one weight row's run of 32: with c = lane % 4 the
// values 8c .. 8c + 7 of the run as int8 in two words (the mma's k order is
// permuted so that they are the lane's A elements k = 4c..4c+3 and
// 16+4c..16+4c+3; the activations follow the same permutation), the run's
// scale and minimum factor, and (Q2_K) the sub-block minimum in every byte.
struct GroupedFrag {
  uint32_t w0, w1, mw;
  float scale, mn;
};

enum MinKind { kNoMin, kRunSum, kMinMma };

// Four magnitude bytes (each below 128) negated where the mask byte is 0xff:
// (g ^ 0xff) + 1 = 256 - g per byte, never carrying into the next byte.
__device__ __forceinline__ uint32_t negate_where(uint32_t g, uint32_t m) { return (g ^ m) + (m & kByteOnes); }
// The mask of four sign bits (bit i: byte i negative): the multiply puts bit
// i at bit 8i (the copies never overlap), then 0x01 -> 0xff.
__device__ __forceinline__ uint32_t sign_bytes4(uint32_t bits4) { return ((bits4 * 0x00204081u) & kByteOnes) * 0xffu; }

template <DType T>
struct GFrag;

// IQ2_XXS (66 bytes a 256): d, then 8 groups of 4 grid indices and a word of
// four 7-bit sign fields and the 4-bit scale; one group is one run, lane c
// takes grid entry c.
template <>
struct GFrag<DType::IQ2_XXS> {
  static constexpr int kMin = kNoMin;
  __device__ static GroupedFrag load(const uint8_t* row, int run, int c, const uint2* grid) {
    const uint8_t* sb = row + uint64_t(run >> 3) * 66;
    const uint8_t* grp = sb + 2 + 8 * (run & 7);
    const uint32_t aux = ld_u32_a2(grp + 4);
    const uint2 g = grid[ld_u8(grp + c)];
    const uint32_t s7 = (aux >> (7 * c)) & 127u;
    const uint32_t signs = s7 | ((__popc(s7) & 1u) << 7);  // the eighth sign: an even count
    GroupedFrag f;
    f.w0 = negate_where(g.x, sign_bytes4(signs & 15u));
    f.w1 = negate_where(g.y, sign_bytes4(signs >> 4));
    f.mw = 0;
    f.scale = half_bits_to_float(ld_u16(sb)) * (0.5f + float(aux >> 28)) * 0.25f;
    f.mn = 0.0f;
    return f;
  }
};

// Q8_0 (34 bytes a 32): d, 32 int8; one block is one run.
template <>
struct GFrag<DType::Q8_0> {
  static constexpr int kMin = kNoMin;
  __device__ static GroupedFrag load(const uint8_t* row, int run, int c, const uint2*) {
    const uint8_t* b = row + uint64_t(run) * 34;
    uint32_t q[2];
    ld_words_a2<2>(b + 2 + 8 * c, q);
    return GroupedFrag{q[0], q[1], 0u, half_bits_to_float(ld_u16(b)), 0.0f};
  }
};

// Q4_K (144 bytes a 256): sub-block j (one run) is d * sc_j * q - dmin * m_j,
// the nibbles of element e at qs[32 * (j / 2) + e % 32], low for even j.
template <>
struct GFrag<DType::Q4_K> {
  static constexpr int kMin = kRunSum;
  __device__ static GroupedFrag load(const uint8_t* row, int run, int c, const uint2*) {
    const uint8_t* b = row + uint64_t(run >> 3) * 144;
    const int j = run & 7;
    const uint32_t dd = ld_u32(b);
    float sc, m;
    k_scale_min(b, j, sc, m);
    const uint2 q = ld_u64(b + 16 + 32 * (j >> 1) + 8 * c);
    const int sh = 4 * (j & 1);
    return GroupedFrag{(q.x >> sh) & 0x0f0f0f0fu, (q.y >> sh) & 0x0f0f0f0fu, 0u, half_bits_to_float(dd & 0xffffu) * sc,
                half_bits_to_float(dd >> 16) * m};
  }
};

// Q2_K (84 bytes a 256): sub-blocks of 16 with a 4-bit scale and minimum,
// value d * sc * q - dmin * m. A run spans two sub-blocks; the lane's 8
// values lie in one (2 * run + c / 2), so its scale is folded into the
// integers (q * sc <= 45) and its minimum becomes the minima word.
template <>
struct GFrag<DType::Q2_K> {
  static constexpr int kMin = kMinMma;
  __device__ static GroupedFrag load(const uint8_t* row, int run, int c, const uint2*) {
    const uint8_t* b = row + uint64_t(run >> 3) * 84;
    const int g = run & 7;
    const uint32_t dd = ld_u32(b + 80);
    const uint32_t sc = ld_u8(b + 2 * g + (c >> 1));
    const uint8_t* q = b + 16 + 32 * (g >> 2) + 8 * c;
    const int sh = 2 * (g & 3);
    return GroupedFrag{((ld_u32(q) >> sh) & 0x03030303u) * (sc & 15u), ((ld_u32(q + 4) >> sh) & 0x03030303u) * (sc & 15u),
                (sc >> 4) * kByteOnes, half_bits_to_float(dd & 0xffffu), half_bits_to_float(dd >> 16)};
  }
};

// d (16 x 8, int32) += a (16 x 32, int8) * b (32 x 8, int8).
__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One run of one 16 x 8 tile: rows g (r0) and g + 8 (r1) of the warp's 16,
// the 8 activation rows' hi and lo bytes (column g: bh, bl) and the (d, sum)
// of this lane's two output columns 2c and 2c + 1 (x0, x1). acc in the mma's
// C order: (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1).
template <int kMin>
__device__ __forceinline__ void tile_run(float (&acc)[4], const GroupedFrag& r0, const GroupedFrag& r1, uint2 bh, uint2 bl,
                                         float2 x0, float2 x1) {
  int h[4] = {0, 0, 0, 0}, l[4] = {0, 0, 0, 0};
  mma_s8(h, r0.w0, r1.w0, r0.w1, r1.w1, bh.x, bh.y);
  mma_s8(l, r0.w0, r1.w0, r0.w1, r1.w1, bl.x, bl.y);
  const float xd[4] = {x0.x, x1.x, x0.x, x1.x};
  const float xs[4] = {x0.y, x1.y, x0.y, x1.y};
  if constexpr (kMin == kMinMma) {
    int hm[4] = {0, 0, 0, 0}, lm[4] = {0, 0, 0, 0};
    mma_s8(hm, r0.mw, r1.mw, r0.mw, r1.mw, bh.x, bh.y);
    mma_s8(lm, r0.mw, r1.mw, r0.mw, r1.mw, bl.x, bl.y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const GroupedFrag& r = i < 2 ? r0 : r1;
      acc[i] += xd[i] * (r.scale * float(h[i] * 256 + l[i]) - r.mn * float(hm[i] * 256 + lm[i]));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const GroupedFrag& r = i < 2 ? r0 : r1;
      acc[i] += xd[i] * r.scale * float(h[i] * 256 + l[i]);
      if constexpr (kMin == kRunSum) acc[i] -= r.mn * xs[i];
    }
  }
}

// The IQ2_XXS grid in shared memory (the lanes' 32 lookups at once would
// serialize in __constant__ memory); built before pdl_wait(): constants.
template <DType T>
__device__ __forceinline__ void load_grid(uint2* grid) {
  if constexpr (T == DType::IQ2_XXS) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      const uint64_t g = kIq2xxsGridDevice[i];
      grid[i] = make_uint2(uint32_t(g), uint32_t(g >> 32));
    }
  }
}

// The product of a warp's 16 rows (a0: row g, a1: row g + 8) over runs
// [run0, run1) with up to 16 activation rows: xb[t] the quantized row of
// tile t's column g, xs0/xs1[t] the (d, sum) runs of this lane's columns.
// kGateUp: a second matrix (u0, u1) against the same activations.
template <DType T, bool kGateUp>
__device__ __forceinline__ void warp_product(const uint8_t* a0, const uint8_t* a1, const uint8_t* u0,
                                             const uint8_t* u1, int64_t cols, int tiles, const uint8_t* const (&xb)[2],
                                             const float2* const (&xs0)[2], const float2* const (&xs1)[2],
                                             const uint2* grid, int c, int run0, int run1, float (&acc)[2][4],
                                             float (&accu)[2][4]) {
  using F = GFrag<T>;
#pragma unroll 2
  for (int run = run0; run < run1; ++run) {
    const GroupedFrag f0 = F::load(a0, run, c, grid), f1 = F::load(a1, run, c, grid);
    GroupedFrag g0{}, g1{};
    if constexpr (kGateUp) g0 = F::load(u0, run, c, grid), g1 = F::load(u1, run, c, grid);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      if (t < tiles) {
        const uint64_t off = uint64_t(run) * 32 + 8 * c;
        const uint2 bh = ld_u64(xb[t] + off), bl = ld_u64(xb[t] + cols + off);
        const float2 x0 = __ldg(xs0[t] + run), x1 = __ldg(xs1[t] + run);
        tile_run<F::kMin>(acc[t], f0, f1, bh, bl, x0, x1);
        if constexpr (kGateUp) tile_run<F::kMin>(accu[t], g0, g1, bh, bl, x0, x1);
      }
    }
  }
}

// Adds the kSplit warps' partial sums of each row group into the slice-0
// warp's acc, in slice order (red: shared, one [N * 8][32] per warp).
template <int N, int kSplit>
__device__ __forceinline__ void reduce_slices(float (&acc)[N][2][4], float (&red)[kRowGroups * kSplit][N * 8][32],
                                              int slice, int group, int lane) {
  if (slice > 0) {
#pragma unroll
    for (int m = 0; m < N; ++m) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) red[slice * kRowGroups + group][m * 8 + t * 4 + i][lane] = acc[m][t][i];
      }
    }
  }
  __syncthreads();
  if (slice == 0) {
    for (int s = 1; s < kSplit; ++s) {
#pragma unroll
      for (int m = 0; m < N; ++m) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][t][i] += red[s * kRowGroups + group][m * 8 + t * 4 + i][lane];
        }
      }
    }
  }
}

// Block (x: kTileRows rows of n_ff, y: work item): the clamped SwiGLU of the
// expert's gate and up rows for each of the item's rows, quantized as run
// blockIdx.x of the slot's act row.
template <DType T, int kSplit>
__global__ void __launch_bounds__(kRowGroups * kSplit * 32, 10 / kSplit)
    grouped_gate_up_kernel(const uint8_t* __restrict__ gate, const uint8_t* __restrict__ up, uint64_t row_bytes,
                           int64_t ff, int64_t cols, const uint8_t* __restrict__ xq, uint64_t xq_bytes,
                           const int32_t* __restrict__ sorted, int k, const GroupedItem* __restrict__ work,
                           const int32_t* __restrict__ n_work, float clamp, uint8_t* __restrict__ act,
                           uint64_t act_bytes) {
  __shared__ uint2 grid[256];
  __shared__ float acts[kGroupedItemRows][kTileRows + 1];
  constexpr int kWarps = kRowGroups * kSplit;
  __shared__ float red[kWarps][16][32];
  load_grid<T>(grid);
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // the work list and x come from the kernels before
  __syncthreads();
  if (int(blockIdx.y) >= *n_work) return;  // uniform over the block
  const GroupedItem it = work[blockIdx.y];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int group = warp % kRowGroups, slice = warp / kRowGroups;
  const int runs = int(cols / 32), run0 = runs * slice / kSplit, run1 = runs * (slice + 1) / kSplit;
  const uint64_t row = uint64_t(it.expert) * uint64_t(ff) + uint64_t(blockIdx.x) * kTileRows + group * 16 + g;
  const uint8_t* g0 = gate + row * row_bytes;
  const uint8_t* u0 = up + row * row_bytes;
  const int tiles = (it.rows + 7) / 8;
  // Columns past the item's rows repeat its last row; they are not stored.
  auto xrow = [&](int i) { return xq + uint64_t(sorted[it.slot0 + min(i, it.rows - 1)] / k) * xq_bytes; };
  const uint8_t* xb[2];
  const float2 *xs0[2], *xs1[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    xb[t] = xrow(8 * t + g);
    xs0[t] = reinterpret_cast<const float2*>(xrow(8 * t + 2 * c) + 2 * cols);
    xs1[t] = reinterpret_cast<const float2*>(xrow(8 * t + 2 * c + 1) + 2 * cols);
  }
  float acc[2][2][4] = {};  // [gate, up][tile][C element]
  warp_product<T, true>(g0, g0 + 8 * row_bytes, u0, u0 + 8 * row_bytes, cols, tiles, xb, xs0, xs1, grid, c, run0,
                        run1, acc[0], acc[1]);
  reduce_slices<2, kSplit>(acc, red, slice, group, lane);
  if (slice == 0) {
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      if (t < tiles) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acts[8 * t + 2 * c + (i & 1)][group * 16 + g + 8 * (i >> 1)] =
              swiglu_act<true>(acc[0][t][i], acc[1][t][i], clamp);
        }
      }
    }
  }
  __syncthreads();
  for (int col = warp; col < it.rows; col += kWarps) {
    xq_store_run(acts[col][lane], lane, act + uint64_t(it.slot0 + col) * act_bytes, ff, int64_t(blockIdx.x));
  }
}

// Block (x: kTileRows rows of n_embd, y: work item): y[slot][r] = down row r
// of the item's expert . act[slot], for each of the item's slots.
template <DType T, int kSplit>
__global__ void __launch_bounds__(kRowGroups * kSplit * 32, 12 / kSplit)
    grouped_down_kernel(const uint8_t* __restrict__ down, uint64_t row_bytes, int64_t n_out, int64_t ff,
                        const uint8_t* __restrict__ act, uint64_t act_bytes, const GroupedItem* __restrict__ work,
                        const int32_t* __restrict__ n_work, float* __restrict__ y) {
  __shared__ uint2 grid[256];
  constexpr int kWarps = kRowGroups * kSplit;
  __shared__ float red[kWarps][8][32];
  load_grid<T>(grid);
  pdl_trigger();
  pdl_wait();  // the activations come from the gate/up kernel
  __syncthreads();
  if (int(blockIdx.y) >= *n_work) return;
  const GroupedItem it = work[blockIdx.y];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int group = warp % kRowGroups, slice = warp / kRowGroups;
  const int runs = int(ff / 32), run0 = runs * slice / kSplit, run1 = runs * (slice + 1) / kSplit;
  const int64_t out_row = int64_t(blockIdx.x) * kTileRows + group * 16 + g;
  const uint8_t* d0 = down + (uint64_t(it.expert) * uint64_t(n_out) + uint64_t(out_row)) * row_bytes;
  const int tiles = (it.rows + 7) / 8;
  auto arow = [&](int i) { return act + uint64_t(it.slot0 + min(i, it.rows - 1)) * act_bytes; };
  const uint8_t* xb[2];
  const float2 *xs0[2], *xs1[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    xb[t] = arow(8 * t + g);
    xs0[t] = reinterpret_cast<const float2*>(arow(8 * t + 2 * c) + 2 * ff);
    xs1[t] = reinterpret_cast<const float2*>(arow(8 * t + 2 * c + 1) + 2 * ff);
  }
  float acc[1][2][4] = {}, unused[2][4];
  warp_product<T, false>(d0, d0 + 8 * row_bytes, nullptr, nullptr, ff, tiles, xb, xs0, xs1, grid, c, run0, run1,
                         acc[0], unused);
  reduce_slices<1, kSplit>(acc, red, slice, group, lane);
  if (slice > 0) return;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 8 * t + 2 * c + (i & 1);
      if (t < tiles && col < it.rows) y[int64_t(it.slot0 + col) * n_out + out_row + 8 * (i >> 1)] = acc[0][t][i];
    }
  }
}

// Block (x: 256 values, y: token t): out[t] = sum_j weights[t*k + j] *
// y[slot_of[t*k + j]] in slot order; a pair without a slot gives NaN.
static __global__ void grouped_combine_kernel(const float* __restrict__ y, int64_t n, const int32_t* __restrict__ slot_of,
                                       const float* __restrict__ weights, int k, float* __restrict__ out,
                                       int64_t out_stride) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y, d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= n) return;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int32_t s = slot_of[t * k + j];
    acc = s < 0 ? NAN : acc + weights[t * k + j] * y[int64_t(s) * n + d];
  }
  out[t * out_stride + d] = acc;
}

inline bool grouped_type_ok(DType t) {
  return t == DType::IQ2_XXS || t == DType::Q2_K || t == DType::Q4_K || t == DType::Q8_0;
}

template <class Fn>
void dispatch_grouped(DType t, Fn&& fn) {
  switch (t) {
    case DType::IQ2_XXS: fn(std::integral_constant<DType, DType::IQ2_XXS>{}); break;
    case DType::Q2_K: fn(std::integral_constant<DType, DType::Q2_K>{}); break;
    case DType::Q4_K: fn(std::integral_constant<DType, DType::Q4_K>{}); break;
    case DType::Q8_0: fn(std::integral_constant<DType, DType::Q8_0>{}); break;
    default: throw std::invalid_argument("moe_grouped: unsupported dtype");
  }
}


// moe_grouped's launches with kSplitGu (gate/up) and kSplitDown (down) warps
// per 16-row tile; the checks are moe_grouped's (workspace 256-byte aligned,
// grouped_layout's size).
template <int kSplitGu, int kSplitDown>
void launch_moe_grouped(const MoeWeights& m, const void* xq, int64_t n_tokens, const int32_t* ids,
                        const float* weights, int k, float* out, int64_t out_stride, void* workspace,
                        cudaStream_t stream) {
  const int64_t n_embd = m.gate.w.cols, ff = m.gate.rows_per_expert(), pairs = n_tokens * int64_t(k);
  const GroupedLayout l = grouped_layout(m, n_tokens, k);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  auto* sorted = reinterpret_cast<int32_t*>(ws + l.sorted);
  auto* slot_of = reinterpret_cast<int32_t*>(ws + l.slot_of);
  auto* work = reinterpret_cast<GroupedItem*>(ws + l.work);
  auto* n_work = reinterpret_cast<int32_t*>(ws + l.n_work);
  uint8_t* act = ws + l.act;
  auto* y = reinterpret_cast<float*>(ws + l.y);
  const uint64_t act_bytes = xq_row_bytes(ff);
  const unsigned items = unsigned(max_items(pairs, m.gate.n_expert));
  launch_pdl("grouped_plan_kernel", grouped_plan_kernel, dim3(1), dim3(kPlanThreads), 0, stream, ids, int(pairs),
             int(m.gate.n_expert), sorted, slot_of, work, n_work);
  dispatch_grouped(m.gate.w.type, [&](auto t) {
    launch_pdl("grouped_gate_up_kernel", grouped_gate_up_kernel<decltype(t)::value, kSplitGu>,
               dim3(unsigned(ff / kTileRows), items), dim3(kRowGroups * kSplitGu * 32), 0, stream,
               static_cast<const uint8_t*>(m.gate.w.data), static_cast<const uint8_t*>(m.up.w.data),
               m.gate.w.row_bytes, ff, n_embd, static_cast<const uint8_t*>(xq), xq_row_bytes(n_embd),
               static_cast<const int32_t*>(sorted), k, static_cast<const GroupedItem*>(work),
               static_cast<const int32_t*>(n_work), m.clamp, act, act_bytes);
  });
  dispatch_grouped(m.down.w.type, [&](auto t) {
    launch_pdl("grouped_down_kernel", grouped_down_kernel<decltype(t)::value, kSplitDown>,
               dim3(unsigned(n_embd / kTileRows), items), dim3(kRowGroups * kSplitDown * 32), 0, stream,
               static_cast<const uint8_t*>(m.down.w.data), m.down.w.row_bytes, n_embd, ff,
               static_cast<const uint8_t*>(act), act_bytes, static_cast<const GroupedItem*>(work),
               static_cast<const int32_t*>(n_work), y);
  });
  launch_pdl("grouped_combine_kernel", grouped_combine_kernel, dim3(unsigned((n_embd + 255) / 256), unsigned(n_tokens)),
             dim3(256), 0, stream, static_cast<const float*>(y), n_embd, static_cast<const int32_t*>(slot_of), weights,
             k, out, out_stride);
}

}  // namespace baton::cuda::detail
