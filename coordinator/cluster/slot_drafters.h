// The DSpark drafter of `baton serve` (docs/DSPARK.md, "Drafting in baton
// serve"): one set of drafter weights and one draft source per sequence
// slot, each kept in step with its slot's KV from the rows the target
// captures on every forward. A slot can then draft the moment its sequence
// decodes alone, whatever ran before (a prefill, batched steps, a reused
// prefix). A source that lost step (its slot's KV was cut deeper than the
// drafter's windows roll back) proposes nothing until its slot starts over.
//
// The engine calls it on its scheduler thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/dspark/dspark_source.h"
#include "engine/dspark/dspark_weights.h"

namespace baton {

class GgufFile;
class Model;

class SlotDrafters {
 public:
  // Loads the drafter `shape` describes from `file` (a sidecar or the model
  // file) over the target's host weights, which outlive this.
  SlotDrafters(const GgufFile& file, const DsparkShape& shape, const Model& target, int n_slots, int n_threads,
               float threshold);

  // The slot's KV gained `tokens` at `position`, with their captured rows.
  void committed(int slot, std::span<const int32_t> tokens, int64_t position, std::span<const float> hidden);
  // The slot's KV was cut back to n positions from outside a verify (a new
  // request took the slot, or it was reset).
  void cut(int slot, int64_t n);
  // Guesses after `bonus` at `position`; none when the slot's source is out of step.
  Draft propose(int slot, int32_t bonus, int64_t position, int max_tokens);

 private:
  struct Slot {
    std::unique_ptr<DsparkDraftSource> source;
    bool lost = false;  // out of step with the slot's KV until it is reset
  };
  DsparkWeights weights_;
  ThreadPool pool_;
  std::vector<Slot> slots_;
};

}  // namespace baton
