#include "coordinator/cluster/slot_drafters.h"

#include <stdexcept>
#include <string>

#include "engine/dspark/dspark_device.h"
#include "engine/dspark/dspark_source.h"
#include "engine/dspark/dspark_weights.h"
#include "net/log.h"

namespace baton {

SlotDrafters::SlotDrafters(int n_slots, Factory make) : make_(std::move(make)), slots_(size_t(n_slots)) {
  for (Slot& s : slots_) s.source = make_();
}

SlotDrafters::Factory SlotDrafters::dspark(const GgufFile& file, const DsparkShape& shape, const Model& target,
                                           int n_threads, float threshold) {
  // What every slot's source reads; the factory keeps it alive.
  struct Shared {
    Shared(const GgufFile& f, const DsparkShape& s, int n) : weights(f, s), pool(n < 1 ? 1 : n) {}
    DsparkWeights weights;
    ThreadPool pool;
  };
  auto shared = std::make_shared<Shared>(file, shape, n_threads);
  return [shared, &target, threshold] {
    auto source = std::make_unique<DsparkDraftSource>(shared->weights, target, shared->pool, threshold);
    source->set_return_logits(false);  // serve samples every verify row as a plain step
    return source;
  };
}

SlotDrafters::Factory SlotDrafters::dspark_device(const GgufFile& file, const DsparkShape& shape,
                                                  const StageRunner& target, const LoadOptions& load, float threshold) {
  std::shared_ptr<const DsparkDeviceWeights> weights = dspark_device_weights(target, file, shape, load);
  if (!weights) throw std::runtime_error("the GPU drafter needs a stage whose weights are on a GPU");
  return [weights, threshold] {
    auto source = std::make_unique<DsparkDraftSource>(dspark_device_network(weights), threshold);
    source->set_return_logits(false);
    return source;
  };
}

void SlotDrafters::committed(int slot, std::span<const int32_t> tokens, int64_t position,
                             std::span<const float> hidden) {
  Slot& s = slots_.at(size_t(slot));
  if (s.lost) return;
  if (position > s.length) {
    s.lost = true;  // positions whose rows it never saw
    return;
  }
  try {
    s.source->committed(tokens, position, hidden);
    s.length = position + int64_t(tokens.size());
  } catch (const std::invalid_argument& e) {
    // A cut back beyond what the source can roll back: the slot decodes
    // without drafts until it starts over.
    net::log(net::LogLevel::debug, "drafter of slot " + std::to_string(slot) + ": " + e.what());
    s.lost = true;
  }
}

void SlotDrafters::cut(int slot, int64_t n) {
  Slot& s = slots_.at(size_t(slot));
  if (n == 0) {
    if (!s.source->restart()) s.source = make_();  // a GPU drafter keeps its device memory
    s.length = 0;
    s.lost = false;
  } else if (n != s.length) {
    committed(slot, {}, n, {});  // no rows: only the cut back (or lost, beyond what it saw)
  }
}

Draft SlotDrafters::propose(int slot, int32_t bonus, int64_t position, int max_tokens) {
  Slot& s = slots_.at(size_t(slot));
  if (s.lost || position != s.length) return {};
  return s.source->propose(bonus, position, max_tokens);
}

}  // namespace baton
