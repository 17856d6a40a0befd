// The draft sources of `baton serve` (docs/DSPARK.md, "Drafting in baton
// serve"): one per sequence slot, each kept in step with its slot's KV from
// the rows the target commits on every forward (with the rows it captured,
// which a DSpark drafter reads). A slot can then draft the moment its
// sequence decodes alone, whatever ran before (a prefill, batched steps, a
// reused prefix). A source that lost step (its slot's KV was cut deeper than
// it can roll back) proposes nothing until its slot starts over.
//
// The engine calls it on its scheduler thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/spec/speculative.h"

namespace baton {

class GgufFile;
class Model;
class StageRunner;
struct DsparkShape;
struct LoadOptions;

class SlotDrafters {
 public:
  // Makes a fresh source for a slot whose sequence starts over.
  using Factory = std::function<std::unique_ptr<DraftSource>()>;

  SlotDrafters(int n_slots, Factory make);

  // Sources of the DSpark drafter `shape` describes: its weights loaded once
  // from `file` (a sidecar or the model file) and shared, over the target's
  // host weights, which outlive every source.
  static Factory dspark(const GgufFile& file, const DsparkShape& shape, const Model& target, int n_threads,
                        float threshold);
  // The same with the network on the GPU of a CUDA target: the weights
  // loaded to the device once (beside the target's embedding and head),
  // each source its own windows and round workspace there.
  static Factory dspark_device(const GgufFile& file, const DsparkShape& shape, const StageRunner& target,
                               const LoadOptions& load, float threshold);

  // The slot's KV gained `tokens` at `position`, with their captured rows
  // (empty when the stage captures none).
  void committed(int slot, std::span<const int32_t> tokens, int64_t position, std::span<const float> hidden);
  // The slot's KV was cut back to n positions from outside a verify (a new
  // request took the slot, or it was reset).
  void cut(int slot, int64_t n);
  // Guesses after `bonus` at `position`; none when the slot's source is out of step.
  Draft propose(int slot, int32_t bonus, int64_t position, int max_tokens);

 private:
  struct Slot {
    std::unique_ptr<DraftSource> source;
    int64_t length = 0;  // positions it has seen committed
    bool lost = false;   // out of step with the slot's KV until it starts over
  };
  Factory make_;
  std::vector<Slot> slots_;
};

}  // namespace baton
