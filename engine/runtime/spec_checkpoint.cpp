#include "engine/runtime/spec_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/model/arch.h"
#include "engine/runtime/stage.h"

namespace baton {

void check_forward_options(const StageConfig& c, int64_t n_tokens, const ForwardOptions& o) {
  const int64_t logit_rows = c.all_logits || o.all_logits ? n_tokens : 1;
  if (c.head && logit_rows > std::max<int64_t>(1, c.all_logits ? c.max_batch : c.verify_rows)) {
    throw std::invalid_argument(
        fmt::format("logits for {} rows: the stage was planned for {} (verify rows)", n_tokens, c.verify_rows));
  }
  if (o.checkpoint && n_tokens > c.verify_rows) {
    throw std::invalid_argument(fmt::format("a checkpointed forward takes 1..{} tokens (the verify rows), got {}",
                                            c.verify_rows, n_tokens));
  }
  if (o.capture && c.capture_layers.empty()) {
    throw std::invalid_argument("capture: the stage was planned without capture layers");
  }
}

SpecCut plan_cut(const Arch& arch, const SpecCheckpoint& last, int seq, int64_t have, int64_t n) {
  if (n < 0 || n > have) {
    throw std::out_of_range(fmt::format("sequence {} holds {} positions; cannot keep {}", seq, have, n));
  }
  if (n == have) return SpecCut::Nothing;
  if (n == 0) return SpecCut::Reset;
  if (arch.kv_truncatable()) return SpecCut::Truncate;
  if (last.seq != seq || n < last.pos0) {
    const std::string can = last.seq == seq ? fmt::format("{}..{} (its last verify forward) or 0", last.pos0, have)
                                            : fmt::format("{} or 0 (no checkpointed forward)", have);
    throw std::invalid_argument(
        fmt::format("{}: sequence {} holds {} positions and can keep {}, not {}", arch.name(), seq, have, can, n));
  }
  return SpecCut::Restore;
}

}  // namespace baton
