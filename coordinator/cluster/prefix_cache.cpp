#include "coordinator/cluster/prefix_cache.h"

#include <algorithm>
#include <stdexcept>

namespace baton {

int64_t reusable_prefix(std::span<const int32_t> kept, std::span<const int32_t> prompt, const PrefixPolicy& policy) {
  if (!policy.enabled || prompt.empty()) return 0;
  const auto mismatch = std::mismatch(kept.begin(), kept.end(), prompt.begin(), prompt.end());
  const auto common = int64_t(mismatch.first - kept.begin());
  int64_t reuse = std::min(common, int64_t(prompt.size()) - 1);
  if (!policy.truncatable && reuse != int64_t(kept.size())) reuse = 0;
  return reuse >= std::max<int64_t>(policy.min_match, 1) ? reuse : 0;
}

PrefixCache::PrefixCache(int n_slots, PrefixPolicy policy) : policy_(policy), slots_(size_t(std::max(n_slots, 0))) {}

PrefixCache::Choice PrefixCache::choose(std::span<const int32_t> prompt, const std::vector<bool>& free) const {
  Choice best;
  uint64_t best_used = 0;
  for (size_t i = 0; i < slots_.size() && i < free.size(); ++i) {
    if (!free[i]) continue;
    if (!policy_.enabled) return {int(i), 0};
    const int64_t reuse = reusable_prefix(slots_[i].tokens, prompt, policy_);
    const uint64_t used = slots_[i].last_used;
    if (best.slot < 0 || reuse > best.reuse || (reuse == best.reuse && used < best_used)) {
      best = {int(i), reuse};
      best_used = used;
    }
  }
  return best;
}

void PrefixCache::take(int slot, int64_t reuse) {
  Slot& s = slots_.at(size_t(slot));
  if (reuse < 0 || reuse > int64_t(s.tokens.size())) throw std::out_of_range("prefix cache: reuse past the kept tokens");
  s.tokens.resize(size_t(reuse));
}

void PrefixCache::append(int slot, std::span<const int32_t> tokens) {
  if (!policy_.enabled) return;
  Slot& s = slots_.at(size_t(slot));
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
}

void PrefixCache::release(int slot) { slots_.at(size_t(slot)).last_used = ++clock_; }

void PrefixCache::forget(int slot) {
  Slot& s = slots_.at(size_t(slot));
  s.tokens.clear();
  s.last_used = 0;  // an empty slot is the first to take
}

void PrefixCache::forget_all() {
  for (Slot& s : slots_) s.tokens.clear();
}

}  // namespace baton
