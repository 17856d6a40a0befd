// The DSpark drafter as the speculative loop's draft source (engine/spec/,
// docs/SPECULATIVE.md): the loop's committed rows become the drafter's
// context rows, and each proposal is one draft round.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "engine/dspark/dspark_drafter.h"
#include "engine/spec/speculative.h"

namespace baton {

class Model;

class DsparkDraftSource final : public DraftSource {
 public:
  // Loads the drafter `shape` describes from `drafter_file` (its sidecar or
  // the model file itself) and shares the target's token embedding and head
  // from `target`, a whole deepseek4 model in host memory, which outlives
  // this source. The stage must capture the drafter's target layers
  // (StageConfig::capture_layers = drafter_capture_layers of the same file).
  DsparkDraftSource(const GgufFile& drafter_file, const DsparkShape& shape, const Model& target, int n_threads,
                    float threshold);
  // The same beside a target whose weights are not in host memory (a CUDA
  // stage: StageRunner::host_model() is null): the source reads its own host
  // copy of the target's token embedding and output head from
  // `target_file` (target_ends_bytes), and drafts on the CPU from the rows
  // the stage captures and copies back.
  DsparkDraftSource(const GgufFile& drafter_file, const DsparkShape& shape, const GgufFile& target_file,
                    int n_threads, float threshold);
  // Bytes of that copy: the target file's embedding and head as laid out.
  static uint64_t target_ends_bytes(const GgufFile& target_file);
  ~DsparkDraftSource() override;
  // A source over weights and threads that others share (`baton serve` keeps
  // one source per sequence slot): `weights`, `pool` and `target` outlive it.
  DsparkDraftSource(const DsparkWeights& weights, const Model& target, ThreadPool& pool, float threshold);
  // A source over a network built elsewhere (the GPU's:
  // engine/dspark/dspark_device.h).
  DsparkDraftSource(std::unique_ptr<DsparkNetwork> network, float threshold);

  Draft propose(int32_t bonus, int64_t position, int max_tokens) override;
  void committed(std::span<const int32_t> tokens, int64_t position, std::span<const float> hidden) override;
  bool restart() override {
    drafter_->reset();
    return true;
  }

  const DsparkNetwork& drafter() const { return *drafter_; }
  // Proposals without the draft's logits (DsparkNetwork::set_return_logits).
  void set_return_logits(bool on) { drafter_->set_return_logits(on); }

 private:
  DsparkDraftSource(const GgufFile& drafter_file, const DsparkShape& shape, std::unique_ptr<Model> target_ends,
                    int n_threads, float threshold);
  std::unique_ptr<Model> target_ends_;  // the host copy, when the target has none
  std::unique_ptr<DsparkWeights> own_weights_;  // the owning constructors'
  std::unique_ptr<ThreadPool> own_pool_;
  std::unique_ptr<DsparkNetwork> drafter_;
  float threshold_;
};

}  // namespace baton
