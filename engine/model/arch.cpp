#include "engine/model/arch.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "engine/model/registry.h"
#include "engine/runtime/kv_cache.h"
#include "kernels/cpu_ops.h"

namespace baton {

std::vector<std::string> Arch::known() {
  std::vector<std::string> out;
  for (const ArchEntry& e : arch_entries()) out.emplace_back(e.name);
  return out;
}

std::unique_ptr<Arch> Arch::from_gguf(const GgufFile& f) { return arch_entry(f).make_arch(f); }

uint64_t Arch::kv_bytes_per_token_per_layer() const {
  uint64_t n = 0;
  for (int64_t w : kv_stream_widths()) n += uint64_t(w);
  return n * sizeof(float);
}

std::vector<KvStreamShape> Arch::kv_layer_streams(int /*layer*/, int64_t n_ctx) const {
  std::vector<KvStreamShape> out;
  for (int64_t w : kv_stream_widths()) out.push_back({n_ctx, w, false});
  return out;
}

void check_forward_args(const ForwardArgs& a) {
  const WorkspaceShape& s = a.shape;
  const int64_t B = a.n_tokens;
  if (B <= 0 || B > s.max_batch) {
    throw std::invalid_argument(fmt::format("forward: {} tokens; the workspace holds 1..{}", B, s.max_batch));
  }
  if (a.pos0 < 0 || a.pos0 + B > s.n_ctx || a.pos0 + B > a.kv->n_ctx()) {
    throw std::out_of_range(fmt::format("forward: positions [{}, {}) do not fit the context of {}", a.pos0, a.pos0 + B,
                                        std::min(s.n_ctx, a.kv->n_ctx())));
  }
  if (a.pool->size() > s.n_threads) {
    throw std::invalid_argument(fmt::format("forward: {} threads; the workspace was sized for {}", a.pool->size(), s.n_threads));
  }
  if (a.head && (a.logit_rows < 1 || a.logit_rows > std::min(B, s.max_logit_rows))) {
    throw std::invalid_argument(fmt::format("forward: {} logit rows for {} tokens (at most {})", a.logit_rows, B,
                                            s.max_logit_rows));
  }
}

}  // namespace baton
