#include "coordinator/cluster/batch_scheduler.h"

#include <fmt/format.h>

#include <algorithm>

#include "coordinator/api/generation.h"

namespace baton {

std::vector<SchedChunk> plan_batch(std::span<const SchedSeq> seqs, int64_t budget, int64_t prefill_chunk) {
  std::vector<const SchedSeq*> decodes, prompts;
  for (const SchedSeq& s : seqs) {
    if (!s.ready) continue;
    (s.prompt_left > 0 ? prompts : decodes).push_back(&s);
  }
  auto by_turn = [](const SchedSeq* a, const SchedSeq* b) {
    return a->last_run != b->last_run ? a->last_run < b->last_run : a->admitted < b->admitted;
  };
  std::sort(decodes.begin(), decodes.end(), by_turn);
  std::sort(prompts.begin(), prompts.end(), by_turn);
  budget = std::max<int64_t>(budget, 1);
  prefill_chunk = std::max<int64_t>(prefill_chunk, 1);
  // The share kept for prompts: a quarter of the budget, at most one chunk,
  // at least one token.
  const int64_t reserve = prompts.empty() ? 0 : std::clamp<int64_t>(budget / 4, 1, prefill_chunk);
  std::vector<SchedChunk> out;
  int64_t used = 0;
  const int64_t decode_cap = std::max<int64_t>(budget - reserve, prompts.empty() ? budget : 0);
  for (const SchedSeq* s : decodes) {
    if (used >= decode_cap) break;
    out.push_back({s->slot, 1, false});
    ++used;
  }
  for (const SchedSeq* s : prompts) {
    if (used >= budget) break;
    const int64_t n = std::min({s->prompt_left, prefill_chunk, budget - used});
    out.push_back({s->slot, n, true});
    used += n;
  }
  return out;
}

void check_admission(int running, int waiting, int slots, int queue_capacity) {
  if (running + waiting >= slots + queue_capacity) {
    throw QueueFullError(
        fmt::format("the server is busy: {} requests running and {} waiting (the most)", running, waiting), 1);
  }
}

}  // namespace baton
