#include "engine/dspark/dspark_source.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "engine/model/arch.h"
#include "engine/model/model.h"

namespace baton {

namespace {

const Tensor& target_tensor(const Tensor* t, const char* name) {
  if (!t) throw std::runtime_error(fmt::format("the DSpark drafter needs the target's {}: the stage has none", name));
  return *t;
}

// The target's embedding and head alone (no layer: Model::plan's empty range).
WeightLayout target_ends_layout(const GgufFile& f) {
  const std::unique_ptr<Arch> arch = Arch::from_gguf(f);
  return Model::plan(f, *arch, StageParts{LayerRange{0, -1}, true, true});
}

// The drafter shares the target's token embedding and output head.
std::unique_ptr<DsparkDrafter> make_drafter(const DsparkWeights& weights, const Model& target, ThreadPool& pool) {
  return std::make_unique<DsparkDrafter>(
      weights, target_tensor(target.embedding(Deepseek4Arch::kTokenEmbd), "token_embd.weight"),
      target_tensor(target.head(Deepseek4Arch::kOutput), "output.weight"), pool);
}

}  // namespace

DsparkDraftSource::DsparkDraftSource(const GgufFile& drafter_file, const DsparkShape& shape, const Model& target,
                                     int n_threads, float threshold)
    : own_weights_(std::make_unique<DsparkWeights>(drafter_file, shape)),
      own_pool_(std::make_unique<ThreadPool>(n_threads < 1 ? 1 : n_threads)),
      threshold_(threshold) {
  drafter_ = make_drafter(*own_weights_, target, *own_pool_);
}

DsparkDraftSource::DsparkDraftSource(const DsparkWeights& weights, const Model& target, ThreadPool& pool,
                                     float threshold)
    : threshold_(threshold) {
  drafter_ = make_drafter(weights, target, pool);
}

DsparkDraftSource::DsparkDraftSource(std::unique_ptr<DsparkNetwork> network, float threshold)
    : drafter_(std::move(network)), threshold_(threshold) {}

DsparkDraftSource::DsparkDraftSource(const GgufFile& drafter_file, const DsparkShape& shape,
                                     const GgufFile& target_file, int n_threads, float threshold)
    : DsparkDraftSource(drafter_file, shape, std::make_unique<Model>(target_file, target_ends_layout(target_file)),
                        n_threads, threshold) {}

// The Model stays where make_unique put it: the drafter's views into it
// survive the move of the pointer.
DsparkDraftSource::DsparkDraftSource(const GgufFile& drafter_file, const DsparkShape& shape,
                                     std::unique_ptr<Model> target_ends, int n_threads, float threshold)
    : DsparkDraftSource(drafter_file, shape, *target_ends, n_threads, threshold) {
  target_ends_ = std::move(target_ends);
}

DsparkDraftSource::~DsparkDraftSource() = default;

uint64_t DsparkDraftSource::target_ends_bytes(const GgufFile& target_file) {
  return target_ends_layout(target_file).bytes;
}

Draft DsparkDraftSource::propose(int32_t bonus, int64_t position, int max_tokens) {
  // The drafter needs a context row before the bonus token (position >= 1).
  if (position < 1 || position != drafter_->n_context()) return {};
  DsparkDraft d = drafter_->draft(bonus, position, threshold_, max_tokens);
  return {std::move(d.tokens), std::move(d.logits)};
}

void DsparkDraftSource::committed(std::span<const int32_t> tokens, int64_t position, std::span<const float> hidden) {
  const int64_t n = int64_t(tokens.size()), w = drafter_->feature_width();
  if (int64_t(hidden.size()) != n * w) {
    throw std::logic_error(fmt::format("DSpark: {} committed rows came with {} captured floats, not {} x {}", n,
                                       hidden.size(), n, w));
  }
  // Rows beyond what the target kept (a cut back) are forgotten first.
  if (position < drafter_->n_context()) drafter_->truncate(position);
  std::vector<int64_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), position);
  drafter_->append_context(hidden.data(), positions.data(), n);
}

}  // namespace baton
