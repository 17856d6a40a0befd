// Integer-dot routed-expert decode (moe_xq.cuh).
#include "kernels/cuda/moe_xq.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe_xq_impl.cuh"

namespace baton::cuda {

bool moe_xq_supported(const MoeWeights& m) {
  const int64_t ff = m.gate.rows_per_expert(), n_embd = m.gate.w.cols;
  return m.gate.w.type == DType::IQ2_XXS && m.up.w.type == DType::IQ2_XXS && m.down.w.type == DType::Q2_K &&
         m.gate.w.data && m.up.w.data && m.down.w.data && m.up.w.row_bytes == m.gate.w.row_bytes &&
         n_embd % 256 == 0 && ff % 256 == 0 && m.down.w.cols == ff && m.down.rows_per_expert() == n_embd &&
         m.gate.n_expert == m.down.n_expert && m.up.n_expert == m.gate.n_expert;
}

size_t moe_xq_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k) {
  return size_t(uint64_t(std::max<int64_t>(n_tokens, 0)) * uint64_t(std::max(k, 0)) *
                xq_row_bytes(m.gate.rows_per_expert()));
}

void moe_decode_xq(const MoeWeights& m, const void* xq, int64_t n_tokens, const int32_t* ids, const float* weights,
                   int k, float* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) {
  const char* who = "moe_decode_xq";
  if (!moe_xq_supported(m)) throw std::invalid_argument(std::string(who) + ": needs IQ2_XXS gate/up, Q2_K down");
  const int64_t n_embd = m.gate.w.cols;
  if (xq == nullptr || ids == nullptr || weights == nullptr || out == nullptr || workspace == nullptr ||
      n_tokens < 1 || n_tokens > 65535 || k < 1 || k > 32 || n_tokens * k > 65535 || (n_tokens > 1 && out_stride < n_embd)) {
    throw std::invalid_argument(std::string(who) + ": bad buffers, token count, k or stride");
  }
  if (workspace_bytes < moe_xq_workspace_bytes(m, n_tokens, k) || reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(xq) % 16 != 0) {
    throw std::invalid_argument(std::string(who) + ": workspace too small or misaligned");
  }
  // Gate/up: the grid from shared memory and the sign masks by arithmetic
  // (the fastest lookups of those bench_cuda_kernels ds4 compares,
  // bench/results/kernels_ds4_moe_h200.log), registers bounded to 64 so that
  // 32 warps are resident per SM (76 registers left 24): 16 warps of 2 rows
  // for 1-2 tokens, 8 warps of 4 rows beyond (bench_cuda_kernels moe,
  // bench/results/kernels_moe_pairs_h100.log: 0.91x the time of the
  // unbounded 8 x 4 at one token, 0.87x from 8 tokens).
  using L = detail::Iq2Lookup<true, false>;
  if (n_tokens <= 2) {
    detail::launch_moe_decode_xq<16, 2, L, 2>(m, xq, n_tokens, ids, weights, k, out, out_stride, workspace, stream);
  } else {
    detail::launch_moe_decode_xq<8, 4, L, 4>(m, xq, n_tokens, ids, weights, k, out, out_stride, workspace, stream);
  }
}

}  // namespace baton::cuda
