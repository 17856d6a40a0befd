// Attention kernels (see attention.cuh). Lane l of a warp holds dims l,
// l + 32, ... of each head vector, so K and V rows are read with coalesced
// 128-byte transactions and a score is a per-lane partial dot plus a
// butterfly reduction that leaves it in every lane; all softmax decisions are
// therefore warp-uniform.
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/xq.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kRowsPerWarp = 4;
constexpr int kWarpsPerBlock = 4;
constexpr int kMaxHeadDim = 512;
// Decode has few warps (one per KV head and 4 query rows): splitting the
// positions finely is what fills the card. Up to 256 splits of at least 8
// positions (one step of a split grid's loop for llama heads): a
// 4096-position llama-8b decode runs 8 x 132 warps of 32 positions (4
// dependent steps), a 640-position graph 80 splits instead of the 40 that
// 16 gave (+0.5% Q8_0, +0.8% Q4_K decode at ctx 512, docs/PERFORMANCE.md).
// Prompts of up to 8 positions do not split, so a 3-token chunk still
// matches the whole 8-token prompt to 1e-5 (test_cuda_stage).
constexpr int kMaxSplits = 256;
constexpr int64_t kMaxSplitRows = 256;   // n_tokens * n_head up to this may split
constexpr int64_t kMinSplitPositions = 8;
// The split kernel's arrival counters, one per row group, at the start of
// the workspace (a fixed place whatever the call's row count).
constexpr size_t kCounterBytes = size_t(kMaxSplitRows) * sizeof(unsigned);

struct KernelArgs {
  AttentionParams p;
  int group;              // query heads per KV head
  int64_t groups_per_kv;  // warps per KV head: ceil(n_tokens * group / 4)
  int64_t chunk;          // positions per split (block of the split kernel)
  int n_splits;
  float* partial;        // split kernel: n_splits x (n_tokens * n_head) x (head_dim_v + 2)
  unsigned* counters;    // split kernel: blocks arrived per row group
  uint64_t xq_stride;    // bytes between quantized output rows (p.xq)
};

// Sums each of the K values (K = 4, 8 or 16) over the 32 lanes and leaves
// all K sums in every lane, with 2K shuffles instead of the 5K of K separate
// butterflies: log2(K) halving steps in which each lane keeps half of its
// values and receives its partner's copy of that half (after them lane l
// holds the partial sum of value (l / (32/K)) over its half-warp groups), the
// remaining xor steps, then one broadcast per value.
template <int K>
__device__ __forceinline__ void warp_sum_all(float (&v)[K], int lane) {
  static_assert(K >= 2 && K <= 32 && (K & (K - 1)) == 0, "K must be a power of two <= 32");
  constexpr int kSteps = K == 2 ? 1 : K == 4 ? 2 : K == 8 ? 3 : K == 16 ? 4 : 5;
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    const int half = (K / 2) >> st, o = 16 >> st;
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < K / 2; ++i) {
      if (i < half) {
        const float send = upper ? v[i] : v[i + half];
        const float keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(kFullMask, send, o);
      }
    }
  }
  float mine = v[0];
#pragma unroll
  for (int o = 16 >> kSteps; o >= 1; o /= 2) mine += __shfl_xor_sync(kFullMask, mine, o);
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = __shfl_sync(kFullMask, mine, k * (32 / K));
}

// Positions per step: loading U K rows before the reductions keeps U loads in
// flight and halves a warp's chain of dependent steps; fewer for wide heads,
// whose registers are spent on q and o. Heads of up to 128 dims take 8 (167
// registers, 12 warps per SM instead of 16): a decode split grid has a few
// warps per SM and does not feel it, and prefill grids measured 6% faster
// with 8 than with 4 despite the lost occupancy (docs/PERFORMANCE.md).
template <int N>
constexpr int kPositionsPerStep = N <= 4 ? 8 : (N == 8 ? 2 : 1);

// Run nn of 32 dims (lane l holds dim 32 nn + l) of the output row of
// (tok, head), and of its quantized copy when asked. Called by all 32 lanes.
__device__ __forceinline__ void store_out(const KernelArgs& a, int64_t tok, int head, int nn, int lane, float v) {
  const int dv = a.p.head_dim_v, d = lane + 32 * nn;
  if (d < dv) a.p.out[tok * a.p.out_stride + int64_t(head) * dv + d] = v;
  if (a.p.xq && 32 * nn < dv) {
    xq_store_run(v, lane, static_cast<uint8_t*>(a.p.xq) + uint64_t(tok) * a.xq_stride, int64_t(a.p.n_head) * dv,
                 (int64_t(head) * dv + 32 * nn) / 32);
  }
}

// The 4 query rows of one warp and their running softmax state. Row i of a
// KV head is token i / group, head i % group of the group. Missing rows (past
// the end) repeat the last one and are masked with lim = -1.
template <int N>
struct WarpRows {
  static constexpr int J = kRowsPerWarp;
  int64_t tok[J], lim[J];
  int head[J];
  int64_t last;  // last position any row of the warp sees, -1 when none
  float q[J][N], o[J][N], m[J], l[J];

  __device__ void init(const KernelArgs& a, int kvh, int64_t grp, int lane, int64_t pos0) {
    const int g = a.group, dk = a.p.head_dim_k;
    const int64_t n_rows_kv = a.p.n_tokens * g;
    last = -1;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int64_t i = grp * J + j;
      const bool valid = i < n_rows_kv;
      const int64_t ic = valid ? i : n_rows_kv - 1;
      tok[j] = ic / g;
      head[j] = kvh * g + int(ic % g);
      lim[j] = valid ? pos0 + tok[j] : -1;
      last = max(last, lim[j]);
      const float* qr = a.p.q + tok[j] * a.p.q_stride + int64_t(head[j]) * dk;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const int d = lane + 32 * n;
        q[j][n] = d < dk ? qr[d] : 0.0f;
        o[j][n] = 0.0f;
      }
      m[j] = -INFINITY;
      l[j] = 0.0f;
    }
  }

  // Attends to U positions p_abs + u, u < U: K row u at k + min(u, n - 1) *
  // k_stride (likewise V); positions u >= n, or past a row's limit, are
  // masked. Called by the whole warp (scores are butterfly-reduced).
  template <int U>
  __device__ void step(const KernelArgs& a, int lane, const float* k, int64_t k_stride, const float* v,
                       int64_t v_stride, int64_t p_abs, int n) {
    const int dk = a.p.head_dim_k, dv = a.p.head_dim_v;
    float kr[U][N], vr[U][N];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int uu = min(u, n - 1);
#pragma unroll
      for (int nn = 0; nn < N; ++nn) {
        const int d = lane + 32 * nn;
        kr[u][nn] = d < dk ? k[uu * k_stride + d] : 0.0f;
        vr[u][nn] = d < dv ? v[uu * v_stride + d] : 0.0f;
      }
    }
    // J * U partial dots, summed across the warp in one butterfly.
    float dots[J * U];
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float dot = 0.0f;
#pragma unroll
        for (int nn = 0; nn < N; ++nn) dot = fmaf(q[j][nn], kr[u][nn], dot);
        dots[j * U + u] = dot;
      }
    }
    warp_sum_all<J * U>(dots, lane);
    float s[J][U];
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool visible = u < n && p_abs + u <= lim[j];
        s[j][u] = visible ? a.p.scale * dots[j * U + u] : -INFINITY;
      }
    }
    // Online softmax, U positions at a time: rescale the running sum and
    // output once per step to the new maximum.
#pragma unroll
    for (int j = 0; j < J; ++j) {
      float mx = m[j];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[j][u]);
      if (mx == -INFINITY) continue;  // nothing visible yet for this row
      const float corr = expf(m[j] - mx);
      float pk[U], ps = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        pk[u] = expf(s[j][u] - mx);
        ps += pk[u];
      }
      l[j] = l[j] * corr + ps;
#pragma unroll
      for (int nn = 0; nn < N; ++nn) {
        float acc = o[j][nn] * corr;
#pragma unroll
        for (int u = 0; u < U; ++u) acc = fmaf(pk[u], vr[u][nn], acc);
        o[j][nn] = acc;
      }
      m[j] = mx;
    }
  }

  // Writes the normalized outputs (the unsplit kernel).
  __device__ void finish(const KernelArgs& a, int lane) const {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if (lim[j] < 0) continue;
      const float inv = 1.0f / l[j];  // position 0 is always visible, so l > 0
#pragma unroll
      for (int nn = 0; nn < N; ++nn) store_out(a, tok[j], head[j], nn, lane, o[j][nn] * inv);
    }
  }
};

// Prefill (unsplit): each warp streams K and V rows straight from the cache
// (read-only path) for its 4 query rows; blocks are independent warps.
template <int N>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) attention_kernel(KernelArgs a) {
  constexpr int U = kPositionsPerStep<N>;
  const int lane = threadIdx.x & 31;
  const int64_t n_groups = int64_t(a.p.n_head_kv) * a.groups_per_kv;
  const int64_t w_in = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  // Causal prefill: later tokens see more positions. Blocks start in index
  // order, so the heaviest row groups take the first blocks and the light
  // ones fill the tail (neighbouring warps still share a KV head).
  const int64_t wg = w_in < n_groups ? n_groups - 1 - w_in : 0;
  const int kvh = int(wg / a.groups_per_kv);
  const int dk = a.p.head_dim_k, dv = a.p.head_dim_v;
  const int64_t k_row = int64_t(a.p.n_head_kv) * dk, v_row = int64_t(a.p.n_head_kv) * dv;
  const float* kb = a.p.k_cache + int64_t(kvh) * dk;
  const float* vb = a.p.v_cache + int64_t(kvh) * dv;
  pdl_trigger();
  pdl_wait();  // q and the cache rows come from the kernels before (pdl.cuh); before any return
  if (w_in >= n_groups) return;  // whole warp
  WarpRows<N> rows;
  const int64_t pos0 = a.p.pos0_device ? int64_t(*a.p.pos0_device) : a.p.pos0;
  rows.init(a, kvh, wg % a.groups_per_kv, lane, pos0);
  const int64_t p_end = rows.last + 1;
  for (int64_t p = 0; p < p_end; p += U) {
    rows.template step<U>(a, lane, kb + p * k_row, k_row, vb + p * v_row, v_row, p, int(min(int64_t(U), p_end - p)));
  }
  rows.finish(a, lane);
}

// Warps per block of the split kernel: its warps share the block's
// positions and meet in shared memory (about 16 KB of partials at every
// width). At 167 registers a 256-thread block fills an SM's register file
// alone, so a grid of a block per SM lands one block on each.
template <int N>
constexpr int kSplitWarps = N <= 4 ? 8 : (N == 8 ? 4 : 2);

// Decode and short batches (flash-decoding in one kernel). Block (g, s)
// takes row group g (4 query rows of one KV head) over split s of the
// positions; its warps each take an equal part of the split and meet in
// shared memory. With one split the block writes the output; otherwise it
// writes its partial (unnormalized output, max and sum per row) and the
// last block of the row group to arrive (a counter in the workspace, reset
// by that block) merges all splits: the splits' weights exp(m_s - M) once
// per row, then each warp a run of 32 dims over the splits.
template <int N>
__global__ void __launch_bounds__(kSplitWarps<N> * 32) attention_split_kernel(KernelArgs a) {
  constexpr int W = kSplitWarps<N>, J = kRowsPerWarp, U = kPositionsPerStep<N>;
  __shared__ float so[W][J][32 * N];
  __shared__ float sw[W][J], sl[W][J];  // each warp's max, then its weight; its sum
  __shared__ float bl[J];               // the block's sum per row
  __shared__ float bm[J];               // the block's max per row
  __shared__ float cw[kMaxSplits][J];   // the last block: weight of each split per row
  __shared__ float cl[J];               // the last block: the rows' total sums
  __shared__ int64_t s_row[J];          // token * n_head + head of each row, -1 past the end
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t g = blockIdx.x;
  const int kvh = int(g / a.groups_per_kv);
  const int dk = a.p.head_dim_k, dv = a.p.head_dim_v;
  const int64_t k_row = int64_t(a.p.n_head_kv) * dk, v_row = int64_t(a.p.n_head_kv) * dv;
  const float* kb = a.p.k_cache + int64_t(kvh) * dk;
  const float* vb = a.p.v_cache + int64_t(kvh) * dv;
  pdl_trigger();
  pdl_wait();  // q and the cache rows come from the kernels before (pdl.cuh); before any return
  const int64_t pos0 = a.p.pos0_device ? int64_t(*a.p.pos0_device) : a.p.pos0;
  // With the position read at run time (a decode graph sized for the whole
  // context) the positions seen now are shared among the splits, at least
  // min_split_positions per warp; the splits past them do not run.
  int64_t chunk = a.chunk;
  int n_splits = a.n_splits;
  if (a.p.pos0_device) {
    const int64_t n_pos = pos0 + a.p.n_tokens;
    chunk = max(W * a.p.min_split_positions, (n_pos + a.n_splits - 1) / a.n_splits);
    n_splits = int((n_pos + chunk - 1) / chunk);
  }
  if (int(blockIdx.y) >= n_splits) return;  // whole block
  WarpRows<N> rows;
  rows.init(a, kvh, g % a.groups_per_kv, lane, pos0);
  const int64_t per_warp = (chunk + W - 1) / W, split_begin = int64_t(blockIdx.y) * chunk;
  const int64_t p_begin = split_begin + warp * per_warp;
  const int64_t p_end = min(min(split_begin + chunk, p_begin + per_warp), rows.last + 1);
  for (int64_t p = p_begin; p < p_end; p += U) {
    rows.template step<U>(a, lane, kb + p * k_row, k_row, vb + p * v_row, v_row, p, int(min(int64_t(U), p_end - p)));
  }

  // The block's warps meet: per row, weights exp(m_w - M) of the warps that
  // saw a position (l > 0), M and the sum over them. The rows' identities go
  // to shared memory too: the loops below index them at run time.
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < J; ++j) s_row[j] = rows.lim[j] < 0 ? -1 : rows.tok[j] * a.p.n_head + rows.head[j];
  }
#pragma unroll
  for (int j = 0; j < J; ++j) {
#pragma unroll
    for (int nn = 0; nn < N; ++nn) so[warp][j][lane + 32 * nn] = rows.o[j][nn];
    if (lane == 0) sw[warp][j] = rows.m[j], sl[warp][j] = rows.l[j];
  }
  __syncthreads();
  if (threadIdx.x < J) {
    const int j = threadIdx.x;
    float mx = -INFINITY, sum = 0.0f;
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, sw[w][j]);
    for (int w = 0; w < W; ++w) {
      const float wt = sl[w][j] > 0.0f ? expf(sw[w][j] - mx) : 0.0f;
      sw[w][j] = wt;
      sum += wt * sl[w][j];
    }
    bm[j] = mx, bl[j] = sum;
  }
  __syncthreads();
  // Runs of 32 dims, a warp each in turn: run r is dims 32 (r % N) + lane
  // of row r / N. Skips are warp-uniform.
  const int64_t n_rows = a.p.n_tokens * a.p.n_head, split_stride = n_rows * (dv + 2);
  for (int r = warp; r < J * N; r += W) {
    const int j = r / N, nn = r % N;
    const int64_t row = s_row[j];
    if (row < 0 || 32 * nn >= dv) continue;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) acc = fmaf(sw[w][j], so[w][j][32 * nn + lane], acc);
    if (n_splits == 1) {
      store_out(a, row / a.p.n_head, int(row % a.p.n_head), nn, lane, acc / bl[j]);
      continue;
    }
    float* dst = a.partial + int64_t(blockIdx.y) * split_stride + row * (dv + 2);
    if (32 * nn + lane < dv) dst[32 * nn + lane] = acc;
    if (nn == 0 && lane == 0) dst[dv] = bm[j], dst[dv + 1] = bl[j];
  }
  if (n_splits == 1) return;
  __threadfence();  // this block's partial before its arrival
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(a.counters + g, 1u) + 1 == unsigned(n_splits);
    if (last) a.counters[g] = 0;  // every block of the group has arrived: ready for the next call
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other blocks' partials (read past L1 below)
  for (int j = warp; j < J; j += W) {
    if (s_row[j] < 0) continue;
    const float* base = a.partial + s_row[j] * (dv + 2);
    float mx = -INFINITY, sum = 0.0f;
    for (int s = lane; s < n_splits; s += 32) mx = fmaxf(mx, __ldcg(base + s * split_stride + dv));
    mx = warp_max(mx);
    for (int s = lane; s < n_splits; s += 32) {
      const float ls = __ldcg(base + s * split_stride + dv + 1);
      const float wt = ls > 0.0f ? expf(__ldcg(base + s * split_stride + dv) - mx) : 0.0f;
      cw[s][j] = wt;
      sum += wt * ls;
    }
    sum = warp_sum(sum);
    if (lane == 0) cl[j] = sum;
  }
  __syncthreads();
  for (int r = warp; r < J * N; r += W) {
    const int j = r / N, nn = r % N;
    const int64_t row = s_row[j];
    if (row < 0 || 32 * nn >= dv) continue;
    const int d = 32 * nn + lane;
    const float* base = a.partial + row * (dv + 2) + d;
    float acc = 0.0f;
    if (d < dv) {
#pragma unroll 8
      for (int s = 0; s < n_splits; ++s) acc = fmaf(cw[s][j], __ldcg(base + s * split_stride), acc);
    }
    store_out(a, row / a.p.n_head, int(row % a.p.n_head), nn, lane, acc / cl[j]);
  }
}

// Both kernels are launched in full stream order, not early: an early
// launch of the split grid placed its blocks on whichever SMs had room
// while the kernel before drained, packing them onto some SMs (1.2x slower
// at position 511, 1.6x at 4095, with the old 4-warp blocks; docs/CUDA.md).
// Their pdl_wait() is then a no-op; their pdl_trigger() still lets a kernel
// after them that launches early (the output projection) start as they run.
template <int N>
void launch(const KernelArgs& a, int64_t n_warps, bool split, cudaStream_t stream) {
  if (split) {
    attention_split_kernel<N><<<dim3(unsigned(n_warps), unsigned(a.n_splits)), dim3(kSplitWarps<N> * 32), 0, stream>>>(a);
    check_launch("attention_split_kernel");
    return;
  }
  const dim3 grid(unsigned((n_warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
  attention_kernel<N><<<grid, dim3(kWarpsPerBlock * 32), 0, stream>>>(a);
  check_launch("attention_kernel");
}

}  // namespace

size_t attention_workspace_bytes(int64_t n_tokens, int n_head, int head_dim_v) {
  const int64_t rows = n_tokens * n_head;
  if (rows <= 0 || rows > kMaxSplitRows) return 0;
  return kCounterBytes + size_t(kMaxSplits) * size_t(rows) * size_t(head_dim_v + 2) * sizeof(float);
}

void attention(const AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (p.n_head <= 0 || p.n_head_kv <= 0 || p.n_head % p.n_head_kv != 0) {
    throw std::invalid_argument("attention: n_head " + std::to_string(p.n_head) + " is not a multiple of n_head_kv " +
                                std::to_string(p.n_head_kv));
  }
  if (p.head_dim_k < 1 || p.head_dim_v < 1 || p.head_dim_k > kMaxHeadDim || p.head_dim_v > kMaxHeadDim) {
    throw std::invalid_argument("attention: head dims must be in [1, " + std::to_string(kMaxHeadDim) + "]");
  }
  if (p.n_tokens < 0 || p.pos0 < 0) throw std::invalid_argument("attention: negative n_tokens or pos0");
  if (p.n_tokens == 0) return;
  if (!p.q || !p.k_cache || !p.v_cache || !p.out) throw std::invalid_argument("attention: null pointer");
  if (p.n_tokens > 1 && (p.q_stride < int64_t(p.n_head) * p.head_dim_k || p.out_stride < int64_t(p.n_head) * p.head_dim_v)) {
    throw std::invalid_argument("attention: q_stride or out_stride below one token's row");
  }

  if (p.xq && (p.head_dim_v % 32 != 0 || reinterpret_cast<uintptr_t>(p.xq) % 16 != 0)) {
    throw std::invalid_argument("attention: a quantized output needs head_dim_v a multiple of 32 and 16-byte alignment");
  }
  KernelArgs a{};
  a.p = p;
  a.p.min_split_positions = std::max<int64_t>(1, p.min_split_positions);
  a.xq_stride = p.xq ? xq_row_bytes(int64_t(p.n_head) * p.head_dim_v) : 0;
  a.group = p.n_head / p.n_head_kv;
  a.groups_per_kv = (p.n_tokens * a.group + kRowsPerWarp - 1) / kRowsPerWarp;
  const int64_t n_warps = int64_t(p.n_head_kv) * a.groups_per_kv;
  const int64_t n_pos = p.pos0 + p.n_tokens;
  const int64_t rows = p.n_tokens * p.n_head;

  // Decode and short batches run the split kernel: a block of W warps per
  // row group and split, about one block per SM in all, each warp at least
  // one step of 8 positions. Prompts of up to 8 positions stay on the
  // unsplit kernel, so that a 3-token chunk matches the whole 8-token
  // prompt to 1e-5 (test_cuda_stage).
  const int per_lane = (std::max(p.head_dim_k, p.head_dim_v) + 31) / 32;
  const int n = per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : per_lane <= 8 ? 8 : 16;
  const int64_t warps_per_split = n <= 4 ? kSplitWarps<4> : n == 8 ? kSplitWarps<8> : kSplitWarps<16>;
  bool split = workspace != nullptr && rows <= kMaxSplitRows && n_pos > kMinSplitPositions;
  int64_t splits = 1;
  if (split) {
    splits = std::min<int64_t>({(int64_t(sm_count()) + n_warps - 1) / n_warps, kMaxSplits,
                                (n_pos + warps_per_split * kMinSplitPositions - 1) / (warps_per_split * kMinSplitPositions)});
    splits = std::max<int64_t>(splits, 1);
    const size_t need = kCounterBytes + size_t(splits) * size_t(rows) * size_t(p.head_dim_v + 2) * sizeof(float);
    if (workspace_bytes < need || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) split = false, splits = 1;
  }
  a.chunk = (n_pos + splits - 1) / splits;
  a.n_splits = int((n_pos + a.chunk - 1) / a.chunk);
  if (split) {
    a.counters = static_cast<unsigned*>(workspace);
    a.partial = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + kCounterBytes);
  }
  if (n == 2) {
    launch<2>(a, n_warps, split, stream);
  } else if (n == 4) {
    launch<4>(a, n_warps, split, stream);
  } else if (n == 8) {
    launch<8>(a, n_warps, split, stream);
  } else {
    launch<16>(a, n_warps, split, stream);
  }
}

}  // namespace baton::cuda
