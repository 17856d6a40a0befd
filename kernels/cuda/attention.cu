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
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

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
constexpr int kMergeWarps = 4;

// Positions the grid covers when they are read at run time (a captured
// graph sized for the whole context): *rt_pos + rt_add; -1 when static.
__device__ __forceinline__ int64_t runtime_positions(const int32_t* rt_pos, int64_t rt_add) {
  return rt_pos ? int64_t(*rt_pos) + rt_add : -1;
}

// Positions per split. With the positions read at run time the positions
// seen now are shared among the splits, at least min_positions each.
__device__ __forceinline__ int64_t split_chunk(int64_t n_pos_rt, int n_splits, int64_t static_chunk,
                                               int64_t min_positions) {
  if (n_pos_rt < 0) return static_chunk;
  return max(min_positions, (n_pos_rt + n_splits - 1) / n_splits);
}

struct KernelArgs {
  AttentionParams p;
  int group;              // query heads per KV head
  int64_t groups_per_kv;  // warps per KV head: ceil(n_tokens * group / 4)
  int64_t chunk;          // positions per split
  int n_splits;
  float* partial;  // n_splits x (n_tokens * n_head) x (head_dim_v + 2), when n_splits > 1
  uint64_t xq_stride;  // bytes between quantized output rows (p.xq)
  // Run-time positions (runtime_positions): pos0_device + n_tokens, or a
  // batch's n_pos_device; null when static.
  const int32_t* rt_pos;
  int64_t rt_add;
  int sub;  // a batch (p.row_seq): warps per token and KV head, ceil(group / 4)
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
// registers, fewer warps per SM): a decode split grid has a few warps per SM
// and does not feel it, and prefill grids were faster with 8 than with 4
// despite the lost occupancy (figures in docs/PERFORMANCE.md).
template <int N>
constexpr int kPositionsPerStep = N <= 4 ? 8 : (N == 8 ? 2 : 1);

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

  // A batch (p.row_seq) keeps each warp's rows inside one token, whose
  // sequence's cache the warp reads: row j is head (grp % sub) * 4 + j of
  // the group of token grp / sub.
  __device__ void init(const KernelArgs& a, int kvh, int64_t grp, int lane, int64_t pos0) {
    const int g = a.group, dk = a.p.head_dim_k;
    const int64_t n_rows_kv = a.p.n_tokens * g;
    last = -1;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      bool valid;
      if (a.p.row_seq) {
        const int h0 = int(grp % a.sub) * J;
        valid = h0 + j < g;
        tok[j] = grp / a.sub;
        head[j] = kvh * g + (valid ? h0 + j : h0);
        lim[j] = valid ? int64_t(a.p.row_pos[tok[j]]) : -1;
      } else {
        const int64_t i = grp * J + j;
        valid = i < n_rows_kv;
        const int64_t ic = valid ? i : n_rows_kv - 1;
        tok[j] = ic / g;
        head[j] = kvh * g + int(ic % g);
        lim[j] = valid ? pos0 + tok[j] : -1;
      }
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

  // K and V rows of U positions: row u at k + min(u, n - 1) * k_stride
  // (likewise V).
  template <int U>
  struct Kv {
    float k[U][N], v[U][N];
    __device__ void load(const KernelArgs& a, int lane, const float* kp, int64_t k_stride, const float* vp,
                         int64_t v_stride, int n) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int uu = min(u, n - 1);
#pragma unroll
        for (int nn = 0; nn < N; ++nn) {
          const int d = lane + 32 * nn;
          k[u][nn] = d < a.p.head_dim_k ? kp[uu * k_stride + d] : 0.0f;
          v[u][nn] = d < a.p.head_dim_v ? vp[uu * v_stride + d] : 0.0f;
        }
      }
    }
  };

  // Attends to U positions p_abs + u, u < U, from their K and V rows;
  // positions u >= n, or past a row's limit, are masked. Called by the whole
  // warp (scores are butterfly-reduced).
  template <int U>
  __device__ void step(const KernelArgs& a, int lane, const float* k, int64_t k_stride, const float* v,
                       int64_t v_stride, int64_t p_abs, int n) {
    Kv<U> kv;
    kv.load(a, lane, k, k_stride, v, v_stride, n);
    attend<U>(a, kv, p_abs, n, lane);
  }

  template <int U>
  __device__ void attend(const KernelArgs& a, const Kv<U>& kv, int64_t p_abs, int n, int lane) {
    const auto& kr = kv.k;
    const auto& vr = kv.v;
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

  // Writes the normalized output (one split) or this split's partial.
  __device__ void finish(const KernelArgs& a, int lane, int split) const {
    const int dv = a.p.head_dim_v;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if (lim[j] < 0) continue;
      if (a.n_splits == 1) {
        // Position 0 is always visible, so l > 0.
        const float inv = 1.0f / l[j];
        float* dst = a.p.out + tok[j] * a.p.out_stride + int64_t(head[j]) * dv;
#pragma unroll
        for (int nn = 0; nn < N; ++nn) {
          const int d = lane + 32 * nn;
          if (d < dv) dst[d] = o[j][nn] * inv;
          // Lanes hold dims d = lane + 32 nn: one run of 32 per nn.
          if (a.p.xq && 32 * nn < dv) {
            const int64_t width = int64_t(a.p.n_head) * dv;
            xq_store_run(o[j][nn] * inv, lane, static_cast<uint8_t*>(a.p.xq) + uint64_t(tok[j]) * a.xq_stride, width,
                         (int64_t(head[j]) * dv + 32 * nn) / 32);
          }
        }
      } else {
        const int64_t row = tok[j] * a.p.n_head + head[j];
        float* dst = a.partial + (int64_t(split) * a.p.n_tokens * a.p.n_head + row) * (dv + 2);
#pragma unroll
        for (int nn = 0; nn < N; ++nn) {
          const int d = lane + 32 * nn;
          if (d < dv) dst[d] = o[j][nn];
        }
        if (lane == 0) {
          dst[dv] = m[j];
          dst[dv + 1] = l[j];
        }
      }
    }
  }
};

// Each warp streams K and V rows straight from the cache (read-only path);
// blocks are independent warps. kEarly: a split grid, launched early
// (launch() below).
template <int N, bool kEarly>
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
  // A batch's token picks its sequence's cache. Positions and sequences
  // are step parameters (pdl.cuh: readable before the wait).
  const int64_t seq_off =
      a.p.row_seq && w_in < n_groups ? int64_t(a.p.row_seq[(wg % a.groups_per_kv) / a.sub]) * a.p.seq_stride : 0;
  const float* kb = a.p.k_cache + seq_off + int64_t(kvh) * dk;
  const float* vb = a.p.v_cache + seq_off + int64_t(kvh) * dv;
  const int64_t pos0 = a.p.pos0_device ? int64_t(*a.p.pos0_device) : a.p.pos0;
  const int64_t n_pos_rt = runtime_positions(a.rt_pos, a.rt_add);
  const int64_t chunk = split_chunk(n_pos_rt, a.n_splits, a.chunk, a.p.min_split_positions);
  const int64_t p_begin = int64_t(blockIdx.y) * chunk;
  // Early (split grids launched under PDL), in a decode graph (pos0_device):
  // the first step's K and V rows, when all of them are before pos0, were
  // written by earlier steps, whose graphs completed before this one began
  // (pdl.cuh), so they are loaded before the wait and overlap the Q|K|V
  // projection's tail.
  typename WarpRows<N>::template Kv<U> first;
  const bool pre = kEarly && a.p.pos0_device && !a.p.row_seq && w_in < n_groups && p_begin + U <= pos0;
  if (pre) first.load(a, lane, kb + p_begin * k_row, k_row, vb + p_begin * v_row, v_row, U);
  pdl_trigger();
  pdl_wait();  // q and the newest cache rows come from the kernels before (pdl.cuh); before any return
  if (w_in >= n_groups) return;  // whole warp
  WarpRows<N> rows;
  rows.init(a, kvh, wg % a.groups_per_kv, lane, pos0);
  // A split past every row's last position is not read by the merge.
  if (n_pos_rt >= 0 && p_begin >= n_pos_rt) return;
  const int64_t p_end = min(p_begin + chunk, rows.last + 1);
  int64_t p = p_begin;
  if (pre && p < p_end) {
    rows.template attend<U>(a, first, p, int(min(int64_t(U), p_end - p)), lane);
    p += U;
  }
  for (; p < p_end; p += U) {
    rows.template step<U>(a, lane, kb + p * k_row, k_row, vb + p * v_row, v_row, p, int(min(int64_t(U), p_end - p)));
  }
  rows.finish(a, lane, blockIdx.y);
}

// One block per (token, head) row and 32 output dims: weight each split's
// partial by w_s = exp(m_s - M) and normalize by sum_s w_s l_s. A split that
// saw no visible position has l = 0 and m = -inf and drops out. The weights
// are formed once per block in shared memory; the warps then share the
// splits of their 32 dims and meet in shared memory.
__global__ void __launch_bounds__(kMergeWarps * 32)
    attention_merge_kernel(const float* __restrict__ partial, int n_splits, int64_t n_rows, int n_head, int dv,
                           float* out, int64_t out_stride, uint8_t* xq, uint64_t xq_stride,
                           const int32_t* rt_pos, int64_t rt_add, int64_t static_chunk, int64_t min_positions) {
  __shared__ float wts[kMaxSplits];
  __shared__ float red[32];
  __shared__ float part[kMergeWarps][32];
  pdl_trigger();
  pdl_wait();  // the partials of the split kernel (a no-op in stream order, kept for launch_pdl)
  // Splits past the last position wrote nothing this time (the split
  // kernel's chunk); those before it all did.
  if (rt_pos) {
    const int64_t n_pos = runtime_positions(rt_pos, rt_add);
    const int64_t chunk = split_chunk(n_pos, n_splits, static_chunk, min_positions);
    n_splits = int(min(int64_t(n_splits), (n_pos + chunk - 1) / chunk));
  }
  const int64_t row = blockIdx.x;
  const int64_t split_stride = n_rows * (dv + 2);
  const float* base = partial + row * (dv + 2);
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) mx = fmaxf(mx, base[s * split_stride + dv]);
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float ls = base[s * split_stride + dv + 1];
    const float w = ls > 0.0f ? expf(base[s * split_stride + dv] - mx) : 0.0f;
    wts[s] = w;
    sum += w * ls;
  }
  sum = block_sum(sum, red);  // its barriers also publish wts
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int d = int(blockIdx.y) * 32 + lane;
  float acc = 0.0f;
  if (d < dv) {
    for (int s = warp; s < n_splits; s += kMergeWarps) acc = fmaf(wts[s], base[s * split_stride + d], acc);
  }
  part[warp][lane] = acc;
  __syncthreads();
  if (warp == 0) {
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kMergeWarps; ++k) total += part[k][lane];
    total /= sum;
    if (d < dv) out[(row / n_head) * out_stride + (row % n_head) * dv + d] = total;
    // The block's 32 dims are one run of the token's quantized row (dv % 32 == 0).
    if (xq) {
      xq_store_run(total, lane, xq + uint64_t(row / n_head) * xq_stride, int64_t(n_head) * dv,
                   ((row % n_head) * dv + int64_t(blockIdx.y) * 32) / 32);
    }
  }
}

// A split grid (decode) launches early under PDL, its first K and V rows
// loaded while the Q|K|V projection drains. A plain early launch had put
// its few hundred blocks on whichever SMs had room first, several per SM,
// and ran slower than in stream order; so each block also asks for almost
// half of an SM's shared memory, which it does not use: at most two blocks
// share an SM, with room left for the small blocks of the kernels around it.
// The merge stays in stream order: launched early, its waiting blocks made
// the split kernel and the output projection's early loads contend. The
// figures of both are in docs/PERFORMANCE.md.
// Prefill grids (unsplit) stay in stream order too.
size_t early_split_smem() {
  static std::mutex mu;
  static std::vector<size_t> bytes;  // per device, 0: not set up yet
  int dev = 0;
  BATON_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(dev) >= bytes.size()) bytes.resize(size_t(dev) + 1, 0);
  size_t& b = bytes[size_t(dev)];
  if (b == 0) {
    int per_sm = 0, per_block = 0;
    BATON_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    BATON_CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    // Half of the SM less 12 KiB, the room the kernels around it need.
    b = std::min<size_t>(size_t(per_sm) / 2 - (size_t(12) << 10), size_t(per_block));
    for (auto* k : {attention_kernel<2, true>, attention_kernel<4, true>, attention_kernel<8, true>,
                    attention_kernel<16, true>}) {
      BATON_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(b)));
    }
  }
  return b;
}

template <int N>
void launch(const KernelArgs& a, int64_t n_warps, cudaStream_t stream) {
  const dim3 grid(unsigned((n_warps + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(a.n_splits));
  if (a.n_splits > 1) {
    launch_pdl("attention_kernel", attention_kernel<N, true>, grid, dim3(kWarpsPerBlock * 32), early_split_smem(),
               stream, a);
    return;
  }
  attention_kernel<N, false><<<grid, dim3(kWarpsPerBlock * 32), 0, stream>>>(a);
  check_launch("attention_kernel");
}

}  // namespace

size_t attention_workspace_bytes(int64_t n_tokens, int n_head, int head_dim_v) {
  const int64_t rows = n_tokens * n_head;
  if (rows <= 0 || rows > kMaxSplitRows) return 0;
  return size_t(kMaxSplits) * size_t(rows) * size_t(head_dim_v + 2) * sizeof(float);
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
  const bool batch = p.row_seq != nullptr;
  if (batch && (!p.row_pos || p.seq_stride < 0 || p.max_positions < 1)) {
    throw std::invalid_argument("attention: a batch needs row_pos, a sequence stride and max_positions >= 1");
  }
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
  a.sub = (a.group + kRowsPerWarp - 1) / kRowsPerWarp;
  a.groups_per_kv = batch ? p.n_tokens * a.sub : (p.n_tokens * a.group + kRowsPerWarp - 1) / kRowsPerWarp;
  a.rt_pos = batch ? p.n_pos_device : p.pos0_device;
  a.rt_add = batch ? 0 : p.n_tokens;
  const int64_t n_warps = int64_t(p.n_head_kv) * a.groups_per_kv;
  const int64_t n_pos = batch ? p.max_positions : p.pos0 + p.n_tokens;
  const int64_t rows = p.n_tokens * p.n_head;

  // Split positions when the unsplit grid would leave most of the GPU idle:
  // aim for about 8 warps per multiprocessor, each with >= 64 positions.
  int64_t splits = 1;
  if (workspace != nullptr && rows <= kMaxSplitRows) {
    const int64_t target = int64_t(sm_count()) * 8;
    splits = std::min<int64_t>({(target + n_warps - 1) / n_warps, kMaxSplits,
                                (n_pos + kMinSplitPositions - 1) / kMinSplitPositions});
    splits = std::max<int64_t>(splits, 1);
    const size_t need = size_t(splits) * size_t(rows) * size_t(p.head_dim_v + 2) * sizeof(float);
    if (workspace_bytes < need) splits = 1;
  }
  a.chunk = (n_pos + splits - 1) / splits;
  a.n_splits = int((n_pos + a.chunk - 1) / a.chunk);
  a.partial = a.n_splits > 1 ? static_cast<float*>(workspace) : nullptr;

  const int per_lane = (std::max(p.head_dim_k, p.head_dim_v) + 31) / 32;
  if (per_lane <= 2) {
    launch<2>(a, n_warps, stream);
  } else if (per_lane <= 4) {
    launch<4>(a, n_warps, stream);
  } else if (per_lane <= 8) {
    launch<8>(a, n_warps, stream);
  } else {
    launch<16>(a, n_warps, stream);
  }
  if (a.n_splits > 1) {
    const dim3 grid(unsigned(rows), unsigned((p.head_dim_v + 31) / 32));
    attention_merge_kernel<<<grid, dim3(kMergeWarps * 32), 0, stream>>>(
        static_cast<const float*>(a.partial), a.n_splits, rows, p.n_head, p.head_dim_v, p.out, p.out_stride,
        static_cast<uint8_t*>(p.xq), a.xq_stride, a.rt_pos, a.rt_add, a.chunk, a.p.min_split_positions);
    check_launch("attention_merge_kernel");
  }
}

}  // namespace baton::cuda
