// Routed experts of a short batch by the expert (moe_grouped.cuh): the
// checks and the launch configuration; the kernels are in moe_grouped_impl.cuh.
#include "kernels/cuda/moe_grouped.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/moe_grouped_impl.cuh"

namespace baton::cuda {
namespace {

// The widest weight load is 8 bytes (Q4_K's nibbles, at multiples of 8 in a
// 144-byte block); whole GGUF rows keep every block at that alignment when
// the matrix starts on 16 bytes.
bool aligned(const MatrixView& w) {
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes == *dtype_bytes(w.type, uint64_t(w.cols));
}

}  // namespace

bool moe_grouped_supported(const MoeWeights& m) {
  const int64_t ff = m.gate.rows_per_expert(), n_embd = m.gate.w.cols;
  return detail::grouped_type_ok(m.gate.w.type) && detail::grouped_type_ok(m.down.w.type) &&
         m.up.w.type == m.gate.w.type && m.gate.w.data && m.up.w.data && m.down.w.data && m.up.w.row_bytes == m.gate.w.row_bytes && m.up.w.rows == m.gate.w.rows &&
         n_embd % 256 == 0 && ff % 256 == 0 && m.down.w.cols == ff && m.down.rows_per_expert() == n_embd &&
         m.gate.n_expert == m.down.n_expert && m.up.n_expert == m.gate.n_expert && m.gate.n_expert >= 1 &&
         m.gate.n_expert <= detail::kMaxExperts && aligned(m.gate.w) && aligned(m.up.w) && aligned(m.down.w) &&
         m.clamp > 0.0f;
}

size_t moe_grouped_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k) {
  return size_t(detail::grouped_layout(m, n_tokens, k).bytes);
}

void moe_grouped(const MoeWeights& m, const void* xq, int64_t n_tokens, const int32_t* ids, const float* weights,
                 int k, float* out, int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const std::string who = "moe_grouped";
  if (!moe_grouped_supported(m)) {
    throw std::invalid_argument(who + ": needs IQ2_XXS, Q2_K, Q4_K or Q8_0 experts with n_embd and n_ff multiples of 256");
  }
  const int64_t n_embd = m.gate.w.cols, pairs = n_tokens * int64_t(k);
  if (xq == nullptr || ids == nullptr || weights == nullptr || out == nullptr || workspace == nullptr ||
      n_tokens < 1 || k < 1 || k > 32 || pairs > detail::kMaxPairs || (n_tokens > 1 && out_stride < n_embd)) {
    throw std::invalid_argument(who + ": bad buffers, token count, k (1..32, at most 1024 pairs) or stride");
  }
  const detail::GroupedLayout l = detail::grouped_layout(m, n_tokens, k);
  if (workspace_bytes < l.bytes || reinterpret_cast<uintptr_t>(workspace) % 256 != 0 ||
      reinterpret_cast<uintptr_t>(xq) % 16 != 0) {
    throw std::invalid_argument(who + ": workspace too small or not 256-byte aligned, or xq not 16-byte aligned");
  }
  // Two warps per 16-row tile in both products (bench_cuda_kernels moe
  // compares the other splits).
  detail::launch_moe_grouped<2, 2>(m, xq, n_tokens, ids, weights, k, out, out_stride, workspace, stream);
}

}  // namespace baton::cuda
