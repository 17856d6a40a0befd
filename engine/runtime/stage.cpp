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
  return c;
}

WorkspaceShape Stage::workspace_shape(const StageConfig& c) {
  WorkspaceShape s;
  s.max_batch = c.max_batch;
  s.n_ctx = c.n_ctx;
  s.n_threads = c.n_threads;
  s.embedding = c.embedding;
  s.head = c.head;
  s.max_logit_rows = c.all_logits ? c.max_batch : 1;
  s.layers = {c.first_layer, c.last_layer};
  return s;
}

namespace {

MemoryPlan make_plan(const Arch& arch, const StageConfig& c, const WeightLayout& layout,
                     const WorkspaceShape& ws) {
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
  plan.add(PlanLine::Workspace, arch.workspace_bytes(ws),
           fmt::format("batch {}, {} threads{}", ws.max_batch, ws.n_threads,
                       c.head ? fmt::format(", {} logit rows", ws.max_logit_rows) : ""));
  return plan;
}

}  // namespace

MemoryPlan Stage::plan(const GgufFile& f, const StageConfig& config) {
  auto arch = Arch::from_gguf(f);
  StageConfig c = resolve(*arch, config);
  WeightLayout layout = Model::plan(f, *arch, {{c.first_layer, c.last_layer}, c.embedding, c.head});
  return make_plan(*arch, c, layout, workspace_shape(c));
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
        plan_ = make_plan(*arch_, config_, layout, workspace_shape(config_));
        return layout;
      }(), load, &load_stats_),
      kv_(*arch_, {config_.first_layer, config_.last_layer}, config_.n_seq, config_.n_ctx),
      workspace_(arch_->workspace_bytes(workspace_shape(config_))),
      pool_(config_.n_threads) {}

std::span<const float> Stage::forward(int seq, std::span<const int32_t> tokens) {
  if (!config_.embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  return run(seq, tokens.data(), nullptr, int64_t(tokens.size()));
}

std::span<const float> Stage::forward(int seq, std::span<const float> activations, int64_t n_tokens) {
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  if (n_tokens < 0 || activations.size() != uint64_t(n_tokens) * uint64_t(boundary_width())) {
    throw std::invalid_argument(fmt::format("stage input: {} floats for {} tokens of width {}", activations.size(),
                                            n_tokens, boundary_width()));
  }
  return run(seq, nullptr, activations.data(), n_tokens);
}

void Stage::truncate(int seq, int64_t n) {
  if (n < 0 || n > kv_.length(seq)) {
    throw std::out_of_range(fmt::format("sequence {} holds {} positions; cannot keep {}", seq, kv_.length(seq), n));
  }
  kv_.set_length(seq, n);
}

std::span<const float> Stage::run(int seq, const int32_t* tokens, const float* input, int64_t n_tokens) {
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
  a.logit_rows = config_.all_logits ? n_tokens : 1;
  a.workspace = workspace_.data();
  a.shape = workspace_shape(config_);
  a.pool = &pool_;
  a.tp = config_.tp;
  const float* out = arch_->forward(a);
  kv_.set_length(seq, pos0 + n_tokens);
  const int64_t rows = config_.head ? a.logit_rows : n_tokens;
  return {out, size_t(rows * output_width())};
}

}  // namespace baton
