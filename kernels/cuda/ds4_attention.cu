// DeepSeek V4 attention (ds4_attention.cuh).
// Each kernel follows the CPU code of engine/arch/deepseek4*.cpp step by
// step (same reduction orders where the work is per thread), so the tests
// can hold tight tolerances.
#include "kernels/cuda/ds4_attention.cuh"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ds4_common.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/pdl.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

constexpr int kAttnWarps = 8;
constexpr int kMaxSplitsDevice = 256;  // attention splits per (token, head)

// Row-invariant splits: a list of n rows in chunks of at least kMinSplitRows
// rows, at most `cap` chunks. A function of n alone (the token's position),
// so one token's sums are the same in any launch.
constexpr int64_t kMinSplitRows = 16;
__host__ __device__ __forceinline__ int64_t row_chunk(int64_t n, int64_t cap) {
  const int64_t c = (n + cap - 1) / cap;
  return c > kMinSplitRows ? c : kMinSplitRows;
}

// The inverse RoPE of Ds4AttentionParams::rope_pos on the output pair
// (x0, x1) of dims (d, d + 1), d even: rope_kernel's arithmetic (a double
// angle, float rotation), so folding it into the attention changes nothing.
__device__ __forceinline__ bool out_rope_angle(const Ds4AttentionParams& p, int64_t t, int d, float& c, float& sn) {
  const int lo = p.head_dim - p.rope_dim;
  if (p.rope_pos == nullptr || d < lo) return false;
  double sd, cd;
  sincos(double(p.rope_pos[t]) * double(p.rope_freq[(d - lo) / 2]), &sd, &cd);
  c = float(cd), sn = float(sd);
  return true;
}

// Warp: head blockIdx.x * kAttnWarps + warp of token blockIdx.y; lane l holds
// dims l, l + 32, ... Online softmax over the token's visible list (window
// rows, then compressed rows). Unsplit, it starts from the sink (m = sink,
// sum = 1, no value), so the sink sits in the denominator only, and writes
// the output. Split (decode), block z takes rows [z * chunk, (z + 1) * chunk)
// of the list, starts empty (m = -inf, sum = 0) and writes its partial
// (m, sum, acc) for attention_merge_kernel, which adds the sink.
// chunk > 0: given by the host; 0: the bound's splits shared over the
// batch's real rows; -cap (row-invariant launches): each token's own list
// in chunks of row_chunk(its length, cap), so a token's partials, and its
// output, do not depend on the other tokens of the launch, its grid or
// whether its position came from the device.
template <bool kSplit>
__global__ void __launch_bounds__(kAttnWarps * 32) ds4_attention_kernel(Ds4AttentionParams p, int64_t chunk,
                                                                        float* __restrict__ part) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = int(blockIdx.x) * kAttnWarps + warp;
  if (h >= p.n_head) return;  // whole warps only: no block barrier below
  const int64_t t = blockIdx.y;
  const int hd = p.head_dim, per = hd / 32;
  // Positions from kv0 on come from kv_new rows (from kv_base), earlier
  // ones from the ring.
  int64_t pos, kv0, last;
  const float* kv_base = p.kv_new;
  if (p.batch.seq) {
    // Row t of its own sequence: only its own K = V row is in kv_new.
    const int64_t sq = p.batch.seq[t];
    pos = kv0 = p.batch.pos[t];
    kv_base = p.kv_new + t * hd;
    p.ring += sq * p.batch.seq_stride;
    if (p.comp_rows) p.comp_rows += sq * p.batch.seq_stride;
    last = pos + 1;
  } else {
    if (p.pos0_dev) p.pos0 = *p.pos0_dev;
    pos = p.pos0 + t, kv0 = p.pos0, last = p.pos0 + p.n_tokens;
  }
  if (chunk == 0) {
    // The splits were sized for the upper bound; share the real rows.
    const int64_t cv = p.ratio > 0 ? (p.itop ? min(int64_t(p.top_k), last / p.ratio) : last / p.ratio) : 0;
    chunk = (min(p.window, last) + cv + gridDim.z - 1) / gridDim.z;
  }
  float qv[kPerLane], acc[kPerLane];
  const float* qh = p.q + t * p.q_stride + int64_t(h) * hd;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    qv[i] = i < per ? qh[lane + 32 * i] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = kSplit ? -INFINITY : p.sinks[h], s = kSplit ? 0.0f : 1.0f;
  auto visit = [&](const float (&v)[kPerLane]) {
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) d = fmaf(qv[i], v[i], d);
    const float sc = p.scale * warp_sum(d);
    if (sc > m) {
      const float corr = expf(m - sc);  // 0 while m is -inf
      s *= corr;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[i] *= corr;
      m = sc;
    }
    const float e = expf(sc - m);
    s += e;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] = fmaf(e, v[i], acc[i]);
  };
  const int64_t lo = max(int64_t(0), pos - p.window + 1), n_win = pos - lo + 1;
  const int64_t nv = p.ratio > 0 ? (pos + 1) / p.ratio : 0;
  const int64_t n_comp = p.itop ? min(nv, int64_t(p.top_k)) : nv;
  const int64_t n = n_win + n_comp;
  if (chunk < 0) chunk = row_chunk(n, -chunk);
  const int64_t k0 = kSplit ? int64_t(blockIdx.z) * chunk : 0, k1 = kSplit ? min(n, k0 + chunk) : n;
  bool bad = false;
  // Row k of the visible list, or null for a refused compressed id.
  auto row_of = [&](int64_t k) -> const float* {
    if (k < n_win) {
      const int64_t j = lo + k;
      return j >= kv0 ? kv_base + (j - kv0) * hd : p.ring + (j % p.window) * hd;
    }
    const int64_t c = k - n_win;
    const int64_t idx = p.itop ? int64_t(p.itop[t * p.top_k + c]) : c;
    return idx < 0 || idx >= nv ? nullptr : p.comp_rows + idx * hd;  // not a complete row: refuse, not read
  };
  // One row ahead: the next row's values are loaded while this one's score
  // is reduced (a warp's rows were one memory round trip each).
  float nxt[kPerLane];
  const float* r_next = k0 < k1 ? row_of(k0) : nullptr;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) nxt[i] = r_next && i < per ? r_next[lane + 32 * i] : 0.0f;
  for (int64_t k = k0; k < k1; ++k) {
    const bool ok = r_next != nullptr;
    float cur[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) cur[i] = nxt[i];
    r_next = k + 1 < k1 ? row_of(k + 1) : nullptr;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) nxt[i] = r_next && i < per ? r_next[lane + 32 * i] : 0.0f;
    if (!ok) {
      bad = true;
      continue;
    }
    visit(cur);
  }
  if constexpr (kSplit) {
    float* rec = part + ((t * p.n_head + h) * int64_t(gridDim.z) + blockIdx.z) * int64_t(hd + 32);
    if (lane == 0) rec[0] = m, rec[1] = bad ? NAN : s;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i < per) rec[32 + lane + 32 * i] = acc[i];
    }
  } else {
    const float inv = bad ? NAN : 1.0f / s;
    float* o = p.out + t * p.out_stride + int64_t(h) * hd;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      float v = acc[i] * inv;
      // Pairs (d, d + 1) sit in lanes (2m, 2m + 1): the partner by a shuffle.
      const float other = __shfl_xor_sync(kFullMask, v, 1);
      float cs, sn;
      const int d = lane + 32 * i;
      if (i < per && out_rope_angle(p, t, d & ~1, cs, sn)) {
        v = (lane & 1) ? other * sn + v * cs : v * cs - other * sn;
      }
      if (i < per) o[d] = v;
    }
  }
}

// Block (head, token), thread c: dims 4c .. 4c + 3 of the output. Warp 0
// turns the splits' maxima into weights (shared memory) and the sum with the
// sink into 1 / sum; then every thread adds its four dims of all splits'
// partials, loads unrolled so that many are in flight (the partials were
// one thread's serial loop of `splits` dependent loads before), and with
// rope_pos rotates its pairs back.
constexpr int kMergeThreads = kMaxHeadDim / 4;
__global__ void __launch_bounds__(kMergeThreads) attention_merge_kernel(Ds4AttentionParams p, int splits,
                                                                        const float* __restrict__ part) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  __shared__ float f[kMaxSplitsDevice], g[kMaxSplitsDevice];
  __shared__ float sh_inv;
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int hd = p.head_dim;
  const int64_t rf = hd + 32;
  const float* rec = part + (t * p.n_head + h) * int64_t(splits) * rf;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mx = p.sinks[h];
    for (int z = lane; z < splits; z += 32) mx = fmaxf(mx, rec[z * rf]);
    mx = warp_max(mx);
    for (int z = lane; z < splits; z += 32) {
      f[z] = expf(rec[z * rf] - mx);  // 0 for an empty split (m = -inf)
      g[z] = rec[z * rf + 1];
    }
    __syncwarp();
    if (lane == 0) {
      float sum = expf(p.sinks[h] - mx);
      for (int z = 0; z < splits; ++z) sum += g[z] * f[z];
      sh_inv = 1.0f / sum;
    }
  }
  __syncthreads();
  const int c = threadIdx.x;
  if (4 * c >= hd) return;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
  for (int z = 0; z < splits; ++z) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(rec + z * rf + 32) + c);
    const float fz = f[z];
    acc.x = fmaf(fz, v.x, acc.x), acc.y = fmaf(fz, v.y, acc.y), acc.z = fmaf(fz, v.z, acc.z);
    acc.w = fmaf(fz, v.w, acc.w);
  }
  const float inv = sh_inv;
  float o[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
#pragma unroll
  for (int k = 0; k < 4; k += 2) {
    float cs, sn;
    if (out_rope_angle(p, t, 4 * c + k, cs, sn)) {
      const float x0 = o[k], x1 = o[k + 1];
      o[k] = x0 * cs - x1 * sn;
      o[k + 1] = x0 * sn + x1 * cs;
    }
  }
  *reinterpret_cast<float4*>(p.out + t * p.out_stride + int64_t(h) * hd + 4 * c) = make_float4(o[0], o[1], o[2], o[3]);
}

__global__ void window_store_rows_kernel(const float* __restrict__ kv_new, int64_t hd, Ds4Rows rows,
                                         float* __restrict__ ring, int64_t window) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  const int64_t t = blockIdx.x;
  float* dst = ring + int64_t(rows.seq[t]) * rows.seq_stride + (rows.pos[t] % window) * hd;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = kv_new[t * hd + i];
}

__global__ void window_store_kernel(const float* __restrict__ kv_new, int64_t n_tokens, int64_t n_store, int64_t hd,
                                    int64_t pos0, float* __restrict__ ring, int64_t window) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  const int64_t t = n_tokens - n_store + blockIdx.x;
  float* dst = ring + ((pos0 + t) % window) * hd;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = kv_new[t * hd + i];
}

// The longest visible list of the batch (window + compressed rows).
int64_t max_visible(const Ds4AttentionParams& p) {
  // Rows complete after the last token: last / ratio.
  const int64_t last = p.batch.seq ? p.pos0 + 1 : p.pos0 + p.n_tokens;
  const int64_t comp = p.ratio > 0 ? (p.itop ? std::min<int64_t>(p.top_k, last / p.ratio) : last / p.ratio) : 0;
  return std::min(p.window, last) + comp;
}

// Launches of up to kMatvecMaxTokens tokens (decode steps, a speculative
// verify forward, a few sequences' decode rows) are row-invariant: each
// token's list is split by its own length (row_chunk), into at most
// invariant_cap() chunks, always through the merge kernel. A verify row then
// equals the decode step of its position to the bit, queued or replayed from
// a graph (docs/DEEPSEEK4.md, "Batch invariance"). The cap is what one token
// wants: about two blocks per multiprocessor, at most kMaxInvariantSplits
// (what the stage's workspace holds for kMatvecMaxTokens tokens).
constexpr int64_t kMaxInvariantSplits = 32;
bool row_invariant(const Ds4AttentionParams& p) { return p.n_tokens <= kMatvecMaxTokens; }
int64_t invariant_cap(const Ds4AttentionParams& p) {
  const int64_t head_blocks = (p.n_head + kAttnWarps - 1) / kAttnWarps;
  return std::clamp<int64_t>((2 * int64_t(sm_count()) + head_blocks - 1) / head_blocks, 1, kMaxInvariantSplits);
}

// Splits per (token, head). Row-invariant launches: as many as the longest
// list can take; shorter lists leave the last splits empty, which the merge
// adds as exact zeros. Others: enough blocks for about two per
// multiprocessor, at least kMinSplitRows rows each, at most kMaxSplits.
constexpr int64_t kMaxSplits = kMaxSplitsDevice;
int64_t attention_splits(const Ds4AttentionParams& p) {
  const int64_t vis = max_visible(p);
  // A list of n rows takes ceil(n / row_chunk(n, cap)) <= min(cap, ceil(n / 16)) chunks.
  if (row_invariant(p)) return std::clamp<int64_t>((vis + kMinSplitRows - 1) / kMinSplitRows, 1, invariant_cap(p));
  const int64_t blocks = (p.n_head + kAttnWarps - 1) / kAttnWarps * p.n_tokens;
  const int64_t want = (2 * int64_t(sm_count()) + blocks - 1) / blocks;
  const int64_t most = (vis + kMinSplitRows - 1) / kMinSplitRows;
  return std::clamp<int64_t>(std::min(want, most), 1, kMaxSplits);
}

void validate_attention(const Ds4AttentionParams& p) {
  const char* who = "ds4_attention";
  require(p.n_head >= 1 && p.head_dim >= 32 && p.head_dim <= kMaxHeadDim && p.head_dim % 32 == 0, who,
          "head_dim must be a multiple of 32 up to 512");
  require(p.n_tokens >= 1 && p.n_tokens <= 65535 && p.pos0 >= 0, who, "1..65535 tokens");
  require(p.q && p.kv_new && p.sinks && p.out && p.window >= 1, who, "null buffer or empty window");
  require(p.ring != nullptr || p.pos0 == 0, who, "a ring is needed after position 0");
  require(p.q_stride >= int64_t(p.n_head) * p.head_dim && p.out_stride >= int64_t(p.n_head) * p.head_dim, who,
          "strides below n_head * head_dim");
  require(p.ratio == 0 || (p.ratio > 0 && p.comp_rows != nullptr), who, "compressed rows need comp_rows");
  require(p.itop == nullptr || (p.ratio > 0 && p.top_k >= 1), who, "itop needs a ratio and top_k");
  require(p.batch.seq == nullptr || (p.batch.pos && p.batch.seq_stride > 0 && !p.pos0_dev), who,
          "decode rows need positions and a sequence stride, and no device pos0");
  require(p.rope_pos == nullptr || (p.rope_freq != nullptr && p.rope_dim >= 2 && p.rope_dim % 2 == 0 &&
                                    p.rope_dim <= p.head_dim),
          who, "rope_pos needs rope_freq and an even rope_dim up to head_dim");
  require(reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.out_stride % 4 == 0, who,
          "out must be 16-byte aligned with a stride that is a multiple of 4");
}

}  // namespace

size_t ds4_attention_workspace_bytes(const Ds4AttentionParams& p) {
  validate_attention(p);
  const int64_t splits = attention_splits(p);
  if (splits <= 1 && !row_invariant(p)) return 0;
  return size_t(p.n_tokens * p.n_head * splits * (p.head_dim + 32)) * sizeof(float);
}

void ds4_attention(const Ds4AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  validate_attention(p);
  const int64_t splits = attention_splits(p);
  const size_t need = ds4_attention_workspace_bytes(p);
  const unsigned head_blocks = unsigned((p.n_head + kAttnWarps - 1) / kAttnWarps);
  const bool invariant = row_invariant(p);
  if ((splits > 1 || invariant) && workspace != nullptr && workspace_bytes >= need) {
    // Row-invariant: -cap (each token's own chunks); 0: from the device position(s).
    const int64_t chunk = invariant                     ? -invariant_cap(p)
                          : p.pos0_dev || p.batch.seq ? 0
                                                      : (max_visible(p) + splits - 1) / splits;
    float* part = static_cast<float*>(workspace);
    launch_pdl("ds4_attention_kernel", ds4_attention_kernel<true>,
               dim3(dim3(head_blocks, unsigned(p.n_tokens), unsigned(splits))), dim3(kAttnWarps * 32), 0, stream, p,
               chunk, part);
    check_launch("ds4_attention_kernel (split)");
    launch_pdl("attention_merge_kernel", attention_merge_kernel, dim3(dim3(unsigned(p.n_head), unsigned(p.n_tokens))),
               dim3(unsigned(std::max(32, (p.head_dim / 4 + 31) / 32 * 32))), 0, stream, p, int(splits), part);
    check_launch("attention_merge_kernel");
    return;
  }
  launch_pdl("ds4_attention_kernel", ds4_attention_kernel<false>, dim3(dim3(head_blocks, unsigned(p.n_tokens))),
             dim3(kAttnWarps * 32), 0, stream, p, 0, nullptr);
  check_launch("ds4_attention_kernel");
}

void ds4_window_store(const float* kv_new, int64_t n_tokens, int64_t head_dim, int64_t pos0, float* ring,
                      int64_t window, cudaStream_t stream) {
  require(kv_new && ring && n_tokens >= 1 && head_dim >= 1 && window >= 1 && pos0 >= 0, "ds4_window_store",
          "bad arguments");
  const int64_t n_store = std::min(n_tokens, window);
  launch_pdl("window_store_kernel", window_store_kernel, dim3(unsigned(n_store)), dim3(256), 0, stream, kv_new,
             n_tokens, n_store, head_dim, pos0, ring, window);
  check_launch("window_store_kernel");
}

void ds4_window_store_rows(const float* kv_new, int64_t n_rows, int64_t head_dim, const Ds4Rows& rows, float* ring,
                           int64_t window, cudaStream_t stream) {
  require(kv_new && ring && rows.seq && rows.pos && rows.seq_stride > 0 && n_rows >= 1 && n_rows <= 65535 &&
              head_dim >= 1 && window >= 1,
          "ds4_window_store_rows", "bad arguments");
  launch_pdl("window_store_rows_kernel", window_store_rows_kernel, dim3(unsigned(n_rows)), dim3(256), 0, stream, kv_new,
             head_dim, rows, ring, window);
  check_launch("window_store_rows_kernel");
}

}  // namespace baton::cuda
