// Routed-expert products (moe.cuh): the decode kernels, the grouping of
// (token, slot) pairs by expert and the grouped prefill over cuBLAS.
#include "kernels/cuda/moe.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/matmul.cuh"

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 128;   // per block of the decode kernels
constexpr int kRows = 2;        // output rows per block (gate/up: 2 gate + 2 up rows in flight)
constexpr int kGroupThreads = 256;

uint64_t align256(uint64_t n) { return (n + 255) / 256 * 256; }

// Threads for rows of `steps` steps: whole warps, no more than needed.
int threads_for(int64_t steps) { return int(std::clamp<int64_t>((steps + 31) / 32 * 32, 32, kThreads)); }

__device__ __forceinline__ float clamped_act(float g, float u, float c) {
  g = fminf(g, c);
  u = fminf(fmaxf(u, -c), c);
  return g / (1.0f + expf(-g)) * u;  // silu(g) * u, as kernels/cpu_ops.h
}

template <int E>
__device__ __forceinline__ void load_x(const float* p, float* out) {
#pragma unroll
  for (int i = 0; i < E / 4; ++i) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
    out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
  }
}

// Dot products of kRows weight rows with x over `cols` (multiple of Q::kStep),
// one step of Q::kStep elements per thread at a time; per-thread partials.
template <class Q, int N>
__device__ __forceinline__ void dot_rows(const uint8_t* const (&rows)[N], const float* x, int64_t cols, float (&acc)[N]) {
  constexpr int E = Q::kStep;
  const int64_t n_steps = cols / E;
  for (int64_t st = threadIdx.x; st < n_steps; st += blockDim.x) {
    const int64_t c0 = st * E;
    const uint64_t boff = uint64_t(c0 / Q::kQK) * Q::kBytes;
    const int s0 = int(c0 % Q::kQK) / 8;
    float xv[E];
    load_x<E>(x + c0, xv);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      float w[E];
      Q::dequant(rows[r] + boff, s0, w);
      float d = acc[r];
#pragma unroll
      for (int i = 0; i < E; ++i) d = fmaf(w[i], xv[i], d);
      acc[r] = d;
    }
  }
}

// Sums each of the N per-thread values over the block; thread r < N gets
// value r's total. `part` is shared scratch; barriers before and after make
// consecutive calls safe.
template <int N>
__device__ __forceinline__ float block_reduce_rows(const float (&acc)[N], float (&part)[kThreads / 32][N]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) part[warp][r] = v;
  }
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x < N) {
    for (int w = 0; w < int(blockDim.x >> 5); ++w) total += part[w][threadIdx.x];
  }
  return total;
}

// Block (x: kRows rows of n_ff, y: pair t*k + j): act[pair][r] = clamped
// SwiGLU of gate row r and up row r of expert ids[pair], with x of token t.
template <class Q>
__global__ void __launch_bounds__(kThreads)
    expert_gate_up_kernel(const uint8_t* __restrict__ gate, const uint8_t* __restrict__ up, uint64_t row_bytes,
                          int64_t ff, int64_t cols, int64_t n_expert, const float* __restrict__ x, int64_t x_stride,
                          const int32_t* __restrict__ ids, int k, float clamp, float* __restrict__ act) {
  const int64_t pair = blockIdx.y;
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const int32_t e = ids[pair];
  float* a = act + pair * ff;
  if (e < 0 || int64_t(e) >= n_expert) {  // uniform over the block
    if (threadIdx.x < kRows && row0 + threadIdx.x < ff) a[row0 + threadIdx.x] = NAN;
    return;
  }
  // Rows past the end repeat the last one; their results are not written.
  const uint8_t* rows[2 * kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint64_t row = uint64_t(e) * uint64_t(ff) + uint64_t(min(row0 + r, ff - 1));
    rows[r] = gate + row * row_bytes;
    rows[kRows + r] = up + row * row_bytes;
  }
  float acc[2 * kRows];
#pragma unroll
  for (int r = 0; r < 2 * kRows; ++r) acc[r] = 0.0f;
  dot_rows<Q>(rows, x + (pair / k) * x_stride, cols, acc);
  __shared__ float part[kThreads / 32][2 * kRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < 2 * kRows; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) part[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < kRows && row0 + threadIdx.x < ff) {
    float g = 0.0f, u = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) g += part[w][threadIdx.x], u += part[w][kRows + threadIdx.x];
    a[row0 + threadIdx.x] = clamped_act(g, u, clamp);
  }
}

// Block (x: kRows rows of n_embd, y: token t): out[t][r] = sum_j w_j *
// (down row r of expert ids[t*k + j]) . act[t*k + j], j in slot order.
template <class Q>
__global__ void __launch_bounds__(kThreads)
    expert_down_kernel(const uint8_t* __restrict__ down, uint64_t row_bytes, int64_t n_out, int64_t ff,
                       int64_t n_expert, const float* __restrict__ act, const int32_t* __restrict__ ids,
                       const float* __restrict__ weights, int k, float* __restrict__ out, int64_t out_stride) {
  const int64_t t = blockIdx.y;
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  __shared__ float part[kThreads / 32][kRows];
  float total = 0.0f;
  bool bad = false;
  for (int j = 0; j < k; ++j) {
    const int64_t pair = t * k + j;
    const int32_t e = ids[pair];
    if (e < 0 || int64_t(e) >= n_expert) {  // uniform over the block
      bad = true;
      continue;
    }
    const uint8_t* rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      rows[r] = down + (uint64_t(e) * uint64_t(n_out) + uint64_t(min(row0 + r, n_out - 1))) * row_bytes;
    }
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    dot_rows<Q>(rows, act + pair * ff, ff, acc);
    const float d = block_reduce_rows<kRows>(acc, part);
    if (threadIdx.x < kRows) total += weights[pair] * d;
  }
  if (threadIdx.x < kRows && row0 + threadIdx.x < n_out) {
    out[t * out_stride + row0 + threadIdx.x] = bad ? NAN : total;
  }
}

__global__ void swiglu_clamped_kernel(const float* gate, const float* up, float* out, int64_t n, float clamp) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = clamped_act(gate[i], up[i], clamp);
  }
}

// --- grouping ---------------------------------------------------------------

// Block e: offsets[e + 1] = number of pairs whose id is e.
__global__ void group_count_kernel(const int32_t* __restrict__ ids, int64_t n_pairs, int32_t* offsets) {
  __shared__ float red[32];
  const int32_t e = int32_t(blockIdx.x);
  int c = 0;
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) c += ids[p] == e;
  // Counts below 2^24 are exact in float (checked by the launcher).
  const float total = block_sum(float(c), red);
  if (threadIdx.x == 0) offsets[e + 1] = int32_t(total);
}

// One block: counts to offsets (exclusive scan), every slot_of to -1.
__global__ void group_scan_kernel(int32_t* offsets, int64_t n_expert, int32_t* slot_of, int64_t n_pairs) {
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int64_t e = 0; e < n_expert; ++e) offsets[e + 1] += offsets[e];
  }
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) slot_of[p] = -1;
}

// Block e: the pairs of expert e, in pair order, at sorted[offsets[e] ...].
// Each pass ranks blockDim pairs with warp ballots, so the order is stable.
__global__ void group_place_kernel(const int32_t* __restrict__ ids, int64_t n_pairs, const int32_t* offsets,
                                   int32_t* sorted, int32_t* slot_of) {
  __shared__ int warp_count[kGroupThreads / 32];
  const int32_t e = int32_t(blockIdx.x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = int(blockDim.x >> 5);
  int32_t base = offsets[e];
  for (int64_t p0 = 0; p0 < n_pairs; p0 += blockDim.x) {
    const int64_t p = p0 + threadIdx.x;
    const bool match = p < n_pairs && ids[p] == e;
    const unsigned ballot = __ballot_sync(kFullMask, match);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, chunk = 0;
    for (int w = 0; w < n_warps; ++w) {
      before += w < warp ? warp_count[w] : 0;
      chunk += warp_count[w];
    }
    if (match) {
      const int32_t pos = base + before + __popc(ballot & ((1u << lane) - 1u));
      sorted[pos] = int32_t(p);
      slot_of[p] = pos;
    }
    base += chunk;
    __syncthreads();  // warp_count is rewritten by the next pass
  }
}

// Block i: xg[i] = x row of the token of pair sorted[i].
__global__ void gather_kernel(const float* __restrict__ x, int64_t x_stride, const int32_t* __restrict__ sorted, int k,
                              int64_t n, float* __restrict__ xg) {
  const int64_t i = blockIdx.x;
  const float* src = x + int64_t(sorted[i] / k) * x_stride;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) xg[i * n + c] = src[c];
}

// Block t: out[t] = sum_j w[t*k + j] * y[slot_of[t*k + j]] in slot order.
__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ slot_of,
                               const float* __restrict__ weights, int k, int64_t n, float* __restrict__ out,
                               int64_t out_stride) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < n; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t s = slot_of[t * k + j];
      acc = s < 0 ? NAN : acc + weights[t * k + j] * y[int64_t(s) * n + d];
    }
    out[t * out_stride + d] = acc;
  }
}

// --- host checks --------------------------------------------------------------

void validate_experts(const ExpertMatrix& x, const char* who, const char* which) {
  if (x.n_expert < 1 || x.w.rows % x.n_expert != 0) {
    throw std::invalid_argument(std::string(who) + ": " + which + " has " + std::to_string(x.w.rows) +
                                " rows, not a multiple of " + std::to_string(x.n_expert) + " experts");
  }
  validate_matrix(x.w, who);
}

void validate(const MoeWeights& m, const char* who) {
  validate_experts(m.gate, who, "gate");
  validate_experts(m.up, who, "up");
  validate_experts(m.down, who, "down");
  const std::string w = who;
  if (m.gate.w.type != m.up.w.type || m.gate.w.row_bytes != m.up.w.row_bytes || m.gate.w.rows != m.up.w.rows ||
      m.gate.w.cols != m.up.w.cols) {
    throw std::invalid_argument(w + ": gate and up must have the same dtype, shape and row stride");
  }
  if (m.gate.n_expert != m.up.n_expert || m.gate.n_expert != m.down.n_expert) {
    throw std::invalid_argument(w + ": gate, up and down disagree on the expert count");
  }
  if (m.down.w.cols != m.gate.rows_per_expert() || m.down.rows_per_expert() != m.gate.w.cols) {
    throw std::invalid_argument(w + ": down must be [n_ff, n_embd] per expert for gate/up of [n_embd, n_ff]");
  }
  if (!(m.clamp > 0.0f)) throw std::invalid_argument(w + ": the SwiGLU clamp must be positive (INFINITY: none)");
}

// Expert e of a stacked tensor as a matrix of its own.
MatrixView expert_view(const ExpertMatrix& x, int64_t e) {
  MatrixView v = x.w;
  v.rows = x.rows_per_expert();
  v.data = static_cast<const uint8_t*>(x.w.data) + uint64_t(e) * uint64_t(v.rows) * x.w.row_bytes;
  return v;
}

}  // namespace

void swiglu_clamped(const float* gate, const float* up, float* out, int64_t n, float clamp, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (gate == nullptr || up == nullptr || out == nullptr))) {
    throw std::invalid_argument("swiglu_clamped: bad buffers");
  }
  if (!(clamp > 0.0f)) throw std::invalid_argument("swiglu_clamped: the clamp must be positive (INFINITY: none)");
  if (n == 0) return;
  const unsigned blocks = unsigned(std::clamp<int64_t>((n + 255) / 256, 1, int64_t(sm_count()) * 32));
  swiglu_clamped_kernel<<<blocks, 256, 0, stream>>>(gate, up, out, n, clamp);
  check_launch("swiglu_clamped_kernel");
}

size_t moe_decode_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k) {
  return size_t(align256(uint64_t(std::max<int64_t>(n_tokens, 0)) * uint64_t(std::max(k, 0)) *
                         uint64_t(m.gate.rows_per_expert()) * sizeof(float)));
}

void moe_decode(const MoeWeights& m, const float* x, int64_t n_tokens, int64_t x_stride, const int32_t* ids,
                const float* weights, int k, float* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                cudaStream_t stream) {
  validate(m, "moe_decode");
  const int64_t n_embd = m.gate.w.cols, ff = m.gate.rows_per_expert();
  if (n_tokens < 1 || k < 1) throw std::invalid_argument("moe_decode: n_tokens and k must be at least 1");
  if (n_tokens * k > 65535) throw std::invalid_argument("moe_decode: more than 65535 (token, expert) pairs");
  if (x == nullptr || reinterpret_cast<uintptr_t>(x) % 16 != 0 || x_stride % 4 != 0 ||
      (n_tokens > 1 && x_stride < n_embd)) {
    throw std::invalid_argument("moe_decode: x must be 16-byte aligned with a stride of at least n_embd, a multiple of 4");
  }
  if (out == nullptr || (n_tokens > 1 && out_stride < n_embd)) {
    throw std::invalid_argument("moe_decode: out needs a stride of at least n_embd");
  }
  if (ids == nullptr || weights == nullptr) throw std::invalid_argument("moe_decode: ids and weights are required");
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      workspace_bytes < moe_decode_workspace_bytes(m, n_tokens, k)) {
    throw std::invalid_argument("moe_decode: workspace must be 16-byte aligned and at least moe_decode_workspace_bytes");
  }
  float* act = static_cast<float*>(workspace);
  dispatch_dtype(m.gate.w.type, [&](auto q) {
    using Q = decltype(q);
    const dim3 grid(unsigned((ff + kRows - 1) / kRows), unsigned(n_tokens * k));
    expert_gate_up_kernel<Q><<<grid, threads_for(n_embd / Q::kStep), 0, stream>>>(
        static_cast<const uint8_t*>(m.gate.w.data), static_cast<const uint8_t*>(m.up.w.data), m.gate.w.row_bytes, ff,
        n_embd, m.gate.n_expert, x, x_stride, ids, k, m.clamp, act);
  });
  check_launch("expert_gate_up_kernel");
  dispatch_dtype(m.down.w.type, [&](auto q) {
    using Q = decltype(q);
    const dim3 grid(unsigned((n_embd + kRows - 1) / kRows), unsigned(n_tokens));
    expert_down_kernel<Q><<<grid, threads_for(ff / Q::kStep), 0, stream>>>(
        static_cast<const uint8_t*>(m.down.w.data), m.down.w.row_bytes, n_embd, ff, m.down.n_expert, act, ids,
        weights, k, out, out_stride);
  });
  check_launch("expert_down_kernel");
}

void moe_group(const int32_t* ids, int64_t n_tokens, int k, int64_t n_expert, const MoeGroups& g,
               cudaStream_t stream) {
  const int64_t n_pairs = n_tokens * int64_t(k);
  if (n_tokens < 1 || k < 1 || n_expert < 1) throw std::invalid_argument("moe_group: empty routing");
  if (n_pairs >= (int64_t(1) << 24) || n_expert > 65535) {
    throw std::invalid_argument("moe_group: at most 2^24 pairs and 65535 experts");
  }
  if (ids == nullptr || g.offsets == nullptr || g.sorted == nullptr || g.slot_of == nullptr) {
    throw std::invalid_argument("moe_group: null buffer");
  }
  group_count_kernel<<<unsigned(n_expert), kGroupThreads, 0, stream>>>(ids, n_pairs, g.offsets);
  check_launch("group_count_kernel");
  group_scan_kernel<<<1, 1024, 0, stream>>>(g.offsets, n_expert, g.slot_of, n_pairs);
  check_launch("group_scan_kernel");
  group_place_kernel<<<unsigned(n_expert), kGroupThreads, 0, stream>>>(ids, n_pairs, g.offsets, g.sorted, g.slot_of);
  check_launch("group_place_kernel");
}

namespace {

// Workspace of moe_prefill: gathered x (reused for the down outputs), gate
// outputs (then the activations), up outputs, then matmul's tiles.
struct PrefillLayout {
  uint64_t xg, g, u, mm, mm_bytes, bytes;
};

PrefillLayout prefill_layout(const MoeWeights& m, int64_t n_tokens, int k) {
  const uint64_t pairs = uint64_t(std::max<int64_t>(n_tokens, 0)) * uint64_t(std::max(k, 0));
  const uint64_t n_embd = uint64_t(m.gate.w.cols), ff = uint64_t(m.gate.rows_per_expert());
  PrefillLayout l{};
  l.xg = 0;
  l.g = l.xg + align256(pairs * n_embd * sizeof(float));
  l.u = l.g + align256(pairs * ff * sizeof(float));
  l.mm = l.u + align256(pairs * ff * sizeof(float));
  // One GEMM per expert over its whole group (a group holds at most n_pairs
  // rows); the tile holds a whole expert matrix so each expert is one GEMM.
  size_t mm = 0;
  for (const ExpertMatrix* x : {&m.gate, &m.up, &m.down}) {
    mm = std::max(mm, matmul_workspace_bytes(x->w.type, x->w.cols, int64_t(pairs), x->rows_per_expert()));
  }
  l.mm_bytes = align256(mm);
  l.bytes = l.mm + l.mm_bytes;
  return l;
}

}  // namespace

size_t moe_prefill_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k) {
  return size_t(prefill_layout(m, n_tokens, k).bytes);
}

void moe_prefill(cublasHandle_t handle, const MoeWeights& m, const float* x, int64_t n_tokens, int64_t x_stride,
                 const MoeGroups& g, const int32_t* host_offsets, const float* weights, int k, float* out,
                 int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  validate(m, "moe_prefill");
  const int64_t n_embd = m.gate.w.cols, ff = m.gate.rows_per_expert(), n_expert = m.gate.n_expert;
  const int64_t n_pairs = n_tokens * int64_t(k);
  if (n_tokens < 1 || k < 1) throw std::invalid_argument("moe_prefill: n_tokens and k must be at least 1");
  if (x == nullptr || x_stride < n_embd) throw std::invalid_argument("moe_prefill: x needs a stride of at least n_embd");
  if (out == nullptr || out_stride < n_embd) throw std::invalid_argument("moe_prefill: out needs a stride of at least n_embd");
  if (weights == nullptr || g.sorted == nullptr || g.slot_of == nullptr || host_offsets == nullptr) {
    throw std::invalid_argument("moe_prefill: weights, groups and host offsets are required");
  }
  if (host_offsets[0] != 0 || host_offsets[n_expert] > n_pairs) {
    throw std::invalid_argument("moe_prefill: host offsets do not describe these pairs");
  }
  for (int64_t e = 0; e < n_expert; ++e) {
    if (host_offsets[e + 1] < host_offsets[e]) throw std::invalid_argument("moe_prefill: host offsets must not decrease");
  }
  for (const ExpertMatrix* xm : {&m.gate, &m.down}) {
    if ((uint64_t(xm->rows_per_expert()) * xm->w.row_bytes) % 16 != 0) {
      throw std::invalid_argument("moe_prefill: each expert's rows must start 16-byte aligned");
    }
  }
  const PrefillLayout l = prefill_layout(m, n_tokens, k);
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0 || workspace_bytes < l.bytes) {
    throw std::invalid_argument("moe_prefill: workspace must be 256-byte aligned and at least moe_prefill_workspace_bytes");
  }
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  float* xg = reinterpret_cast<float*>(ws + l.xg);
  float* gb = reinterpret_cast<float*>(ws + l.g);
  float* ub = reinterpret_cast<float*>(ws + l.u);
  void* mm = ws + l.mm;
  const size_t mm_bytes = workspace_bytes - size_t(l.mm);
  const int64_t total = host_offsets[n_expert];
  if (total > 0) {
    gather_kernel<<<unsigned(total), 256, 0, stream>>>(x, x_stride, g.sorted, k, n_embd, xg);
    check_launch("gather_kernel");
  }
  auto each_expert = [&](auto&& fn) {
    for (int64_t e = 0; e < n_expert; ++e) {
      const int64_t n = host_offsets[e + 1] - host_offsets[e];
      if (n > 0) fn(e, int64_t(host_offsets[e]), n);
    }
  };
  each_expert([&](int64_t e, int64_t off, int64_t n) {
    matmul(handle, expert_view(m.gate, e), xg + off * n_embd, n, n_embd, gb + off * ff, ff, mm, mm_bytes, stream);
    matmul(handle, expert_view(m.up, e), xg + off * n_embd, n, n_embd, ub + off * ff, ff, mm, mm_bytes, stream);
  });
  swiglu_clamped(gb, ub, gb, total * ff, m.clamp, stream);
  float* y = xg;  // the gathered inputs are no longer needed
  each_expert([&](int64_t e, int64_t off, int64_t n) {
    matmul(handle, expert_view(m.down, e), gb + off * ff, n, ff, y + off * n_embd, n_embd, mm, mm_bytes, stream);
  });
  combine_kernel<<<unsigned(n_tokens), 256, 0, stream>>>(y, g.slot_of, weights, k, n_embd, out, out_stride);
  check_launch("combine_kernel");
}

}  // namespace baton::cuda
