#include "engine/runtime/stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "engine/gguf/file.h"
#include "engine/model/layer_range_text.h"

namespace baton {

StageConfig Stage::resolve(const Arch& arch, StageConfig c) {
  const ModelDims& d = arch.dims();
  if (c.last_layer < 0) c.last_layer = d.n_layer - 1;
  if (c.first_layer < 0 || c.first_layer > c.last_layer || c.last_layer >= d.n_layer) {
    throw std::invalid_argument(fmt::format("layer range {} is not inside the model's layers {}",
                                            layer_range_text(c.first_layer, c.last_layer),
                                            layer_range_text(0, d.n_layer - 1)));
  }
  if (c.n_ctx <= 0) c.n_ctx = std::min<int64_t>(d.n_ctx_train, StageConfig::kDefaultMaxCtx);
  if (c.n_seq < 1) throw std::invalid_argument(fmt::format("need at least one sequence slot, got {}", c.n_seq));
  if (c.max_batch < 1) throw std::invalid_argument(fmt::format("max batch must be >= 1, got {}", c.max_batch));
  if (c.n_threads < 1) throw std::invalid_argument(fmt::format("thread count must be >= 1, got {}", c.n_threads));
  // A batch holds at most one chunk per sequence, each within the context.
  c.max_batch = std::min(c.max_batch, c.n_ctx * c.n_seq);
  if (c.verify_rows < 0 || c.verify_rows > c.max_batch) {
    throw std::invalid_argument(
        fmt::format("verify rows must be in 0..{} (the batch), got {}", c.max_batch, c.verify_rows));
  }
  const LayerRange range{c.first_layer, c.last_layer};
  if (c.verify_rows > 0 && !arch.kv_truncatable() && c.verify_rows > arch.rollback_max_rows(range, c.n_ctx)) {
    throw std::invalid_argument(fmt::format("{}: a verify forward can be rolled back over at most {} tokens, got {}",
                                            arch.name(), arch.rollback_max_rows(range, c.n_ctx), c.verify_rows));
  }
  for (int l : c.capture_layers) {
    if (!arch.can_capture()) throw std::invalid_argument(arch.name() + ": no hidden-state capture");
    if (!range.contains(l)) {
      throw std::invalid_argument(fmt::format("capture of layer {}: outside the stage's layers {}",
                                              l, layer_range_text(c.first_layer, c.last_layer)));
    }
  }
  return c;
}

WorkspaceShape Stage::workspace_shape(const StageConfig& c) {
  WorkspaceShape s;
  s.max_batch = c.max_batch;
  s.n_ctx = c.n_ctx;
  s.n_threads = c.n_threads;
  s.embedding = c.embedding;
  s.head = c.head;
  s.max_logit_rows = c.all_logits ? c.max_batch : std::max<int64_t>(1, c.verify_rows);
  s.layers = {c.first_layer, c.last_layer};
  return s;
}

uint64_t Stage::workspace_line(const Arch& arch, const StageConfig& c, uint64_t* capture_at, uint64_t* rollback_at) {
  uint64_t at = arch.workspace_bytes(workspace_shape(c));
  const uint64_t capture = uint64_t(c.max_batch) * c.capture_layers.size() * uint64_t(arch.dims().n_embd) * sizeof(float);
  const uint64_t rollback = arch.rollback_floats({c.first_layer, c.last_layer}, c.n_ctx, c.verify_rows) * sizeof(float);
  if (capture + rollback > 0) at = align_up(at);  // the architecture's figure stays exact without them
  if (capture_at) *capture_at = at;
  at += align_up(capture);
  if (rollback_at) *rollback_at = at;
  return at + rollback;
}

namespace {

MemoryPlan make_plan(const Arch& arch, const StageConfig& c, const WeightLayout& layout,
                     const WorkspaceShape& ws, uint64_t ws_bytes) {
  LayerRange range{c.first_layer, c.last_layer};
  MemoryPlan plan;
  plan.add(PlanLine::Weights, layout.bytes,
           fmt::format("{} tensors, layers {}{}{}", layout.n_tensors, layer_range_text(c.first_layer, c.last_layer),
                       c.embedding ? " + embedding" : "", c.head ? " + head" : ""));
  // Per-layer streams (deepseek4) have no single bytes-per-token figure.
  const std::string per_token = arch.kv_stream_widths().empty()
                                    ? std::string(" (per-layer streams)")
                                    : fmt::format(" x {} B", arch.kv_bytes_per_token_per_layer());
  plan.add(PlanLine::KvCache, KvCache::bytes_needed(arch, range, c.n_seq, c.n_ctx),
           fmt::format("{} layers x {} seq x {} ctx{}", range.count(), c.n_seq, c.n_ctx, per_token));
  plan.add(PlanLine::Workspace, ws_bytes,
           fmt::format("batch {}, {} threads{}{}{}", ws.max_batch, ws.n_threads,
                       c.head ? fmt::format(", {} logit rows", ws.max_logit_rows) : "",
                       c.verify_rows ? fmt::format(", verify {} rows", c.verify_rows) : "",
                       c.capture_layers.empty() ? "" : fmt::format(", capture {} layers", c.capture_layers.size())));
  return plan;
}

}  // namespace

MemoryPlan Stage::plan(const GgufFile& f, const StageConfig& config) {
  auto arch = Arch::from_gguf(f);
  StageConfig c = resolve(*arch, config);
  WeightLayout layout = Model::plan(f, *arch, {{c.first_layer, c.last_layer}, c.embedding, c.head});
  return make_plan(*arch, c, layout, workspace_shape(c), workspace_line(*arch, c));
}

Stage::Stage(const GgufFile& f, const StageConfig& config) : Stage(f, config, LoadOptions{}) {}

Stage::Stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load)
    : arch_(Arch::from_gguf(f)),
      config_(resolve(*arch_, config)),
      plan_(),
      // The plan is complete (and every tensor checked) before Model allocates.
      model_(f, [&] {
        WeightLayout layout = Model::plan(f, *arch_, {{config_.first_layer, config_.last_layer}, config_.embedding,
                                                      config_.head});
        plan_ = make_plan(*arch_, config_, layout, workspace_shape(config_), workspace_line(*arch_, config_));
        return layout;
      }(), load, &load_stats_),
      kv_(*arch_, {config_.first_layer, config_.last_layer}, config_.n_seq, config_.n_ctx),
      workspace_(workspace_line(*arch_, config_)),
      pool_(config_.n_threads) {
  workspace_line(*arch_, config_, &capture_at_, &rollback_at_);
}

std::span<const float> Stage::forward(int seq, std::span<const int32_t> tokens) {
  if (!config_.embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  return run(seq, tokens.data(), nullptr, int64_t(tokens.size()), {}).out;
}

ForwardRows Stage::forward_rows(int seq, std::span<const int32_t> tokens, const ForwardOptions& options) {
  if (!config_.embedding) throw std::logic_error("forward_rows: this stage has no embedding");
  return run(seq, tokens.data(), nullptr, int64_t(tokens.size()), options);
}

std::span<const float> Stage::forward(int seq, std::span<const float> activations, int64_t n_tokens) {
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  if (n_tokens < 0 || activations.size() != uint64_t(n_tokens) * uint64_t(boundary_width())) {
    throw std::invalid_argument(fmt::format("stage input: {} floats for {} tokens of width {}", activations.size(),
                                            n_tokens, boundary_width()));
  }
  return run(seq, nullptr, activations.data(), n_tokens, {}).out;
}

void Stage::reset(int seq) {
  kv_.clear(seq);
  if (checkpoint_.seq == seq) checkpoint_.seq = -1;
}

void Stage::truncate(int seq, int64_t n) {
  if (n < 0 || n > kv_.length(seq)) {
    throw std::out_of_range(fmt::format("sequence {} holds {} positions; cannot keep {}", seq, kv_.length(seq), n));
  }
  kv_.set_length(seq, n);
  if (checkpoint_.seq == seq) checkpoint_.seq = -1;
}

void Stage::truncate_seq(int seq, int64_t n) {
  const int64_t have = kv_.length(seq);  // also checks seq
  switch (plan_cut(*arch_, checkpoint_, seq, have, n)) {
    case SpecCut::Nothing:
      return;
    case SpecCut::Reset:
      return reset(seq);
    case SpecCut::Truncate:
      return truncate(seq, n);
    case SpecCut::Restore:
      break;
  }
  const SpecCheckpoint& c = checkpoint_;
  arch_->restore_rollback(kv_, seq, layers(), c.pos0, c.n, n - c.pos0,
                          reinterpret_cast<const float*>(workspace_.data() + rollback_at_));
  // The saved rows stay valid: a later cut inside [pos0, n] restores a
  // superset of these slots with the same values.
  kv_.set_length(seq, n);
}

ForwardRows Stage::run(int seq, const int32_t* tokens, const float* input, int64_t n_tokens, const ForwardOptions& o) {
  const int64_t pos0 = kv_.length(seq);  // also checks seq
  if (n_tokens < 1 || n_tokens > config_.max_batch) {
    throw std::invalid_argument(
        fmt::format("a forward takes 1..{} tokens (the planned batch), got {}; split the input", config_.max_batch, n_tokens));
  }
  if (pos0 + n_tokens > config_.n_ctx) {
    throw std::out_of_range(fmt::format("sequence {} would reach {} tokens; the context is {}", seq, pos0 + n_tokens,
                                        config_.n_ctx));
  }
  ForwardArgs a;
  a.model = &model_;
  a.layers = layers();
  a.embedding = config_.embedding;
  a.head = config_.head;
  a.kv = &kv_;
  a.seq = seq;
  a.pos0 = pos0;
  a.n_tokens = n_tokens;
  a.tokens = tokens;
  a.input = input;
  a.logit_rows = config_.all_logits || o.all_logits ? n_tokens : 1;
  check_forward_options(config_, n_tokens, o);
  float* hidden = reinterpret_cast<float*>(workspace_.data() + capture_at_);
  if (o.capture) {
    a.capture_layers = config_.capture_layers;
    a.capture = hidden;
  }
  a.workspace = workspace_.data();
  a.shape = workspace_shape(config_);
  a.pool = &pool_;
  a.tp = config_.tp;
  // Any forward on seq moves it past what an earlier checkpoint describes.
  if (checkpoint_.seq == seq) checkpoint_.seq = -1;
  if (o.checkpoint) {
    arch_->save_rollback(kv_, seq, layers(), pos0, n_tokens,
                         reinterpret_cast<float*>(workspace_.data() + rollback_at_));
  }
  const float* out = arch_->forward(a);
  kv_.set_length(seq, pos0 + n_tokens);
  if (o.checkpoint) checkpoint_ = {seq, pos0, n_tokens};
  const int64_t rows = config_.head ? a.logit_rows : n_tokens;
  const size_t n_hidden = o.capture ? size_t(n_tokens) * config_.capture_layers.size() * size_t(arch_->dims().n_embd) : 0;
  return {{out, size_t(rows * output_width())}, {hidden, n_hidden}};
}

}  // namespace baton
