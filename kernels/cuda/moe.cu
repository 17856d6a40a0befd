// Routed-expert products (moe.cuh): the decode kernels, the grouping of
// (token, slot) pairs by expert and the grouped prefill over cuBLAS.
#include "kernels/cuda/moe.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu_act.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

constexpr int kThreads = 128;   // per block of the decode kernels
constexpr int kRows = 2;        // output rows per block (gate/up: 2 gate + 2 up rows in flight)
constexpr int kGroupThreads = 256;

uint64_t align256(uint64_t n) { return (n + 255) / 256 * 256; }

// Threads for rows of `steps` steps: whole warps, no more than needed.
int threads_for(int64_t steps) { return int(std::clamp<int64_t>((steps + 31) / 32 * 32, 32, kThreads)); }

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
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
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
    a[row0 + threadIdx.x] = swiglu_act<true>(g, u, clamp);
  }
}

// Block (x: kRows rows of n_embd, y: token t): out[t][r] = sum_j w_j *
// (down row r of expert ids[t*k + j]) . act[t*k + j], j in slot order.
template <class Q>
__global__ void __launch_bounds__(kThreads)
    expert_down_kernel(const uint8_t* __restrict__ down, uint64_t row_bytes, int64_t n_out, int64_t ff,
                       int64_t n_expert, const float* __restrict__ act, const int32_t* __restrict__ ids,
                       const float* __restrict__ weights, int k, float* __restrict__ out, int64_t out_stride) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
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

// Block i: xg[i] = x row of the token of pair sorted[i], rounded to F16 once
// for both the gate and the up product.
__global__ void gather_f16_kernel(const float* __restrict__ x, int64_t x_stride, const int32_t* __restrict__ sorted,
                                  int k, int64_t n, __half* __restrict__ xg) {
  const int64_t i = blockIdx.x;
  const float* src = x + int64_t(sorted[i] / k) * x_stride;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) xg[i * n + c] = __float2half_rn(src[c]);
}

// act[s][i] = F16(silu(min(gate, c)) * clamp(up, -c, c)) with gate and up side
// by side in gu[s] (ff gate values, then ff up values).
__global__ void swiglu_gu_kernel(const float* __restrict__ gu, int64_t n_pairs, int64_t ff, float clamp,
                                 __half* __restrict__ act) {
  const int64_t total = n_pairs * ff;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / ff, c = i % ff;
    act[i] = __float2half_rn(swiglu_act<true>(gu[s * 2 * ff + c], gu[s * 2 * ff + ff + c], clamp));
  }
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

}  // namespace

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
    launch_pdl("expert_gate_up_kernel", expert_gate_up_kernel<Q>, dim3(grid), dim3(threads_for(n_embd / Q::kStep)), 0,
               stream, static_cast<const uint8_t*>(m.gate.w.data), static_cast<const uint8_t*>(m.up.w.data),
               m.gate.w.row_bytes, ff, n_embd, m.gate.n_expert, x, x_stride, ids, k, m.clamp, act);
  });
  check_launch("expert_gate_up_kernel");
  dispatch_dtype(m.down.w.type, [&](auto q) {
    using Q = decltype(q);
    const dim3 grid(unsigned((n_embd + kRows - 1) / kRows), unsigned(n_tokens));
    launch_pdl("expert_down_kernel", expert_down_kernel<Q>, dim3(grid), dim3(threads_for(ff / Q::kStep)), 0, stream,
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

// Workspace of moe_prefill: gathered x in F16, gate|up outputs side by side
// (float; reused for the down outputs), the activations in F16, then one
// expert's gate|up (or down) dequantized to an F16 tile.
struct PrefillLayout {
  uint64_t xg, gu, act, tile, bytes;
};

PrefillLayout prefill_layout(const MoeWeights& m, int64_t n_tokens, int k) {
  const uint64_t pairs = uint64_t(std::max<int64_t>(n_tokens, 0)) * uint64_t(std::max(k, 0));
  const uint64_t n_embd = uint64_t(m.gate.w.cols), ff = uint64_t(m.gate.rows_per_expert());
  PrefillLayout l{};
  l.xg = 0;
  l.gu = l.xg + align256(pairs * n_embd * 2);
  l.act = l.gu + align256(pairs * std::max(2 * ff, n_embd) * sizeof(float));
  l.tile = l.act + align256(pairs * ff * 2);
  l.bytes = l.tile + align256(2 * ff * n_embd * 2);
  return l;
}

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(st)));
  }
}

// out (n x rows, ld ldo, float) = x16 (n x cols, F16) * tile^T (rows x cols, F16).
void gemm_f16(cublasHandle_t handle, const void* tile, int64_t rows, int64_t cols, const void* x16, int64_t n,
              float* out, int64_t ldo) {
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n), int(cols), &alpha, tile, CUDA_R_16F,
                            int(cols), x16, CUDA_R_16F, int(cols), &beta, out, CUDA_R_32F, int(ldo),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "moe_prefill: cublasGemmEx");
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
  if (n_embd % 8 != 0 || ff % 8 != 0 || 2 * ff > INT32_MAX || n_embd > INT32_MAX || n_pairs > INT32_MAX) {
    throw std::invalid_argument("moe_prefill: n_embd and n_ff must be multiples of 8 within cuBLAS's int range");
  }
  const PrefillLayout l = prefill_layout(m, n_tokens, k);
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0 || workspace_bytes < l.bytes) {
    throw std::invalid_argument("moe_prefill: workspace must be 256-byte aligned and at least moe_prefill_workspace_bytes");
  }
  // cublasSetStream drops a workspace given with cublasSetWorkspace, so only
  // switch when needed (as matmul does).
  cudaStream_t current = nullptr;
  check_cublas(cublasGetStream(handle, &current), "cublasGetStream");
  if (current != stream) check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  __half* xg = reinterpret_cast<__half*>(ws + l.xg);
  float* gu = reinterpret_cast<float*>(ws + l.gu);
  __half* act = reinterpret_cast<__half*>(ws + l.act);
  __half* tile = reinterpret_cast<__half*>(ws + l.tile);
  const int64_t total = host_offsets[n_expert];
  if (total > 0) {
    gather_f16_kernel<<<unsigned(total), 256, 0, stream>>>(x, x_stride, g.sorted, k, n_embd, xg);
    check_launch("gather_f16_kernel");
  }
  auto each_expert = [&](auto&& fn) {
    for (int64_t e = 0; e < n_expert; ++e) {
      const int64_t n = host_offsets[e + 1] - host_offsets[e];
      if (n > 0) fn(e, int64_t(host_offsets[e]), n);
    }
  };
  // Gate and up of an expert as one 2 ff x n_embd tile: one GEMM whose rows
  // hold the ff gate values, then the ff up values. The tile is rewritten for
  // the next expert only after this GEMM (one stream).
  each_expert([&](int64_t e, int64_t off, int64_t n) {
    dequantize_rows_f16(m.gate.w, e * ff, ff, tile, stream);
    dequantize_rows_f16(m.up.w, e * ff, ff, tile + ff * n_embd, stream);
    gemm_f16(handle, tile, 2 * ff, n_embd, xg + off * n_embd, n, gu + off * 2 * ff, 2 * ff);
  });
  if (total > 0) {
    const unsigned blocks = unsigned(std::clamp<int64_t>((total * ff + 255) / 256, 1, int64_t(sm_count()) * 32));
    swiglu_gu_kernel<<<blocks, 256, 0, stream>>>(gu, total, ff, m.clamp, act);
    check_launch("swiglu_gu_kernel");
  }
  float* y = gu;  // gate|up are consumed
  each_expert([&](int64_t e, int64_t off, int64_t n) {
    dequantize_rows_f16(m.down.w, e * n_embd, n_embd, tile, stream);
    gemm_f16(handle, tile, n_embd, ff, act + off * ff, n, y + off * n_embd, n_embd);
  });
  combine_kernel<<<unsigned(n_tokens), 256, 0, stream>>>(y, g.slot_of, weights, k, n_embd, out, out_stride);
  check_launch("combine_kernel");
}

}  // namespace baton::cuda
