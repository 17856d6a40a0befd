// A Stage: one contiguous layer range of a model on this machine, with its
// weights, KV cache and workspace, each one planned allocation. The first
// stage of a pipeline holds the embedding and takes token ids; the last holds
// the output head and returns logits; the stages between take and return
// boundary activations. A whole model is the stage [0, n_layer - 1] with both,
// so the same code runs a single node and a pipeline.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/model/arch.h"
#include "engine/runtime/kv_cache.h"
#include "engine/model/loader.h"
#include "engine/base/memory_plan.h"
#include "engine/model/model.h"
#include "kernels/cpu_ops.h"

namespace baton {

class GgufFile;
class TpComm;

struct StageConfig {
  int first_layer = 0;
  int last_layer = -1;     // -1: the model's last layer
  bool embedding = true;   // input is token ids (else boundary activations)
  bool head = true;        // output is logits (else boundary activations)
  int64_t n_ctx = 0;       // 0: min(the model's trained context, kDefaultMaxCtx)
  int n_seq = 1;           // KV sequence slots
  int64_t max_batch = 64;  // most tokens one forward takes (the workspace is sized for it)
  int n_threads = 1;
  bool all_logits = false;  // head: logits for every token of a batch, not just the last
  // A tensor-parallel rank's link to the other ranks of its group (a rank
  // file of `baton split --tp`); null for a whole model. Not owned.
  TpComm* tp = nullptr;
  // The DSpark drafter's sidecar file (`--draft`, engine/dspark/); "": the
  // model file's own drafter, if it has one. Checked at startup; the forward
  // does not draft yet.
  std::string draft_path{};

  static constexpr int64_t kDefaultMaxCtx = 4096;
};

class Stage {
 public:
  // The plan for this file and config without allocating anything (dry run):
  // lines "weights", "kv cache", "workspace". Throws what loading would throw
  // for a bad file or config (missing tensor, unknown arch...).
  static MemoryPlan plan(const GgufFile& f, const StageConfig& config);

  // Plans, then allocates and reads the weights (engine/model/loader.h: load_direct,
  // with `load`'s piece size and progress callback).
  Stage(const GgufFile& f, const StageConfig& config);
  Stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load);

  // Runs the tokens (first stage) or boundary activations (n_tokens rows of
  // boundary_width() floats, other stages) of sequence seq at its next
  // positions. Returns the output rows: logits (n_vocab wide: the last token's
  // row, or one per token with all_logits) on the last stage, else boundary
  // activations (one row per token). The span stays valid until the next call.
  std::span<const float> forward(int seq, std::span<const int32_t> tokens);
  std::span<const float> forward(int seq, std::span<const float> activations, int64_t n_tokens);

  // Positions of seq already in the KV cache; reset() forgets them.
  int64_t position(int seq) const { return kv_.length(seq); }
  void reset(int seq) { kv_.clear(seq); }
  // Keeps the first n positions (n <= position(seq)); the caller checks that
  // the architecture allows it (StageRunner::truncate).
  void truncate(int seq, int64_t n);

  const Arch& arch() const { return *arch_; }
  const StageConfig& config() const { return config_; }
  LayerRange layers() const { return {config_.first_layer, config_.last_layer}; }
  int64_t n_ctx() const { return config_.n_ctx; }
  int64_t n_vocab() const { return arch_->dims().n_vocab; }
  int64_t boundary_width() const { return arch_->boundary_elems_per_token(); }
  int64_t output_width() const { return config_.head ? n_vocab() : boundary_width(); }
  const MemoryPlan& memory_plan() const { return plan_; }
  const LoadStats& load_stats() const { return load_stats_; }
  ThreadPool& pool() { return pool_; }

  // Fills the defaults (last layer, context) and checks the config; every
  // backend's stage resolves its config the same way.
  static StageConfig resolve(const Arch& arch, StageConfig c);

 private:
  static WorkspaceShape workspace_shape(const StageConfig& c);
  std::span<const float> run(int seq, const int32_t* tokens, const float* input, int64_t n_tokens);

  std::unique_ptr<Arch> arch_;
  StageConfig config_;
  MemoryPlan plan_;
  LoadStats load_stats_;  // before model_: the Model constructor fills it
  Model model_;
  KvCache kv_;
  AlignedBuffer workspace_;
  ThreadPool pool_;
};

}  // namespace baton
