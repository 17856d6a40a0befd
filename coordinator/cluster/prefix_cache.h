// The prefix cache of both engines (docs/MEMORY.md, "Prefix cache"): a
// sequence slot whose request ended keeps its KV on every stage and, here,
// the tokens that KV holds. A new request takes the free slot whose kept
// tokens share the longest prefix with its prompt and starts its prefill
// after that prefix; without such a slot it takes the least recently used
// free one, whose kept rows it overwrites. No memory beyond the planned KV
// slots is used: eviction is a slot being taken.
//
// The engines call it on their scheduler thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace baton {

struct PrefixPolicy {
  bool enabled = true;
  // Arch::kv_truncatable: the kept KV may be cut back to any position. When
  // false a slot is reused only whole (the prompt begins with all its
  // tokens), or not at all.
  bool truncatable = true;
  // The least prefix worth reusing: a shorter match leaves the choice to LRU.
  int64_t min_match = 4;
};

// Prompt tokens a slot holding the KV of `kept` lets a request skip: their
// common prefix, at most prompt.size() - 1 (the last prompt token is always
// computed, for its logits); when the KV cannot be cut, all of kept or
// nothing; 0 below policy.min_match or when disabled.
int64_t reusable_prefix(std::span<const int32_t> kept, std::span<const int32_t> prompt, const PrefixPolicy& policy);

class PrefixCache {
 public:
  PrefixCache(int n_slots, PrefixPolicy policy);

  struct Choice {
    int slot = -1;      // -1: no free slot
    int64_t reuse = 0;  // prompt tokens whose KV the slot holds already
  };
  // The free slot for `prompt` (free[i]: slot i holds no request): the one
  // that reuses the most (the least recently used among equals), else the
  // least recently used. Disabled: the first free slot, reusing nothing.
  Choice choose(std::span<const int32_t> prompt, const std::vector<bool>& free) const;

  // A request took `slot` reusing `reuse` tokens: the slot keeps only those.
  void take(int slot, int64_t reuse);
  // Tokens whose KV the slot's request has written (prompt chunks, fed decode tokens).
  void append(int slot, std::span<const int32_t> tokens);
  // The slot's request ended with its KV intact: the slot keeps it, as the
  // most recently used.
  void release(int slot);
  // The slot's KV is lost or unknown (reset, a failed step, a lost worker):
  // it keeps nothing, and is the first free slot taken without a match.
  void forget(int slot);
  void forget_all();

  const std::vector<int32_t>& tokens(int slot) const { return slots_[size_t(slot)].tokens; }
  const PrefixPolicy& policy() const { return policy_; }

 private:
  struct Slot {
    std::vector<int32_t> tokens;  // the tokens whose KV the slot holds, in position order
    uint64_t last_used = 0;       // release order (0: never released)
  };
  PrefixPolicy policy_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

}  // namespace baton
