#include "coordinator/cluster/slot_drafters.h"

#include <stdexcept>

#include "net/log.h"

namespace baton {

SlotDrafters::SlotDrafters(const GgufFile& file, const DsparkShape& shape, const Model& target, int n_slots,
                           int n_threads, float threshold)
    : weights_(file, shape), pool_(n_threads < 1 ? 1 : n_threads), slots_(size_t(n_slots)) {
  for (Slot& s : slots_) s.source = std::make_unique<DsparkDraftSource>(weights_, target, pool_, threshold);
}

void SlotDrafters::committed(int slot, std::span<const int32_t> tokens, int64_t position,
                             std::span<const float> hidden) {
  Slot& s = slots_.at(size_t(slot));
  if (s.lost) return;
  try {
    s.source->committed(tokens, position, hidden);
  } catch (const std::invalid_argument& e) {
    // Rows out of order or a rollback beyond the windows: the slot decodes
    // without drafts until it starts over.
    net::log(net::LogLevel::debug, std::string("drafter of slot ") + std::to_string(slot) + ": " + e.what());
    s.lost = true;
  }
}

void SlotDrafters::cut(int slot, int64_t n) {
  Slot& s = slots_.at(size_t(slot));
  if (n == 0) {
    s.source->reset();
    s.lost = false;
    return;
  }
  if (s.lost) return;
  const int64_t have = s.source->drafter().n_context();
  if (n > have) {
    s.lost = true;  // positions whose rows it never saw
  } else if (n < have) {
    committed(slot, {}, n, {});  // no rows: only the cut back
  }
}

Draft SlotDrafters::propose(int slot, int32_t bonus, int64_t position, int max_tokens) {
  Slot& s = slots_.at(size_t(slot));
  if (s.lost) return {};
  return s.source->propose(bonus, position, max_tokens);
}

}  // namespace baton
