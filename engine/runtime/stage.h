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
#include <vector>

#include "engine/model/arch.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/spec_checkpoint.h"
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
  // Speculative decoding (docs/SPECULATIVE.md). verify_rows: the most tokens
  // of a verify forward (ForwardOptions: logits for every row, and a
  // checkpoint that truncate_seq cuts back into); 0: none. At most
  // max_batch, and where the KV cannot be cut anywhere at most what one
  // rollback covers (Arch::rollback_max_rows). capture_layers: the layers
  // whose output a forward can capture for a drafter, each inside the range
  // (Arch::can_capture). Both are planned in the workspace line.
  int64_t verify_rows = 0;
  std::vector<int> capture_layers = {};
  // The DSpark drafter's sidecar file (`--draft`, engine/dspark/); "": the
  // model file's own drafter, if it has one. Checked at startup; `baton run`
  // drafts with it (docs/DSPARK.md).
  std::string draft_path{};

  static constexpr int64_t kDefaultMaxCtx = 4096;
};

// Per-call choices of Stage::forward_rows.
struct ForwardOptions {
  bool all_logits = false;  // logits for every token (at most verify_rows, or any with all_logits)
  bool checkpoint = false;  // keep what truncate_seq needs to cut back into this forward (<= verify_rows tokens)
  bool capture = false;     // the hidden rows of StageConfig::capture_layers, one per token
};

// What forward_rows returns; both spans stay valid until the next forward.
struct ForwardRows {
  std::span<const float> out;     // logits (last stage) or boundary activations, as forward()
  std::span<const float> hidden;  // capture: n_tokens x capture_layers.size() x n_embd; else empty
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

  // forward() with per-call options (speculative verify: every row's
  // logits, a checkpoint, the hidden rows a drafter reads).
  ForwardRows forward_rows(int seq, std::span<const int32_t> tokens, const ForwardOptions& options);

  // Positions of seq already in the KV cache; reset() forgets them.
  int64_t position(int seq) const { return kv_.length(seq); }
  void reset(int seq);
  // Keeps the first n positions (n <= position(seq)); the caller checks that
  // the architecture allows it (StageRunner::truncate).
  void truncate(int seq, int64_t n);
  // Keeps the first n positions of seq, leaving exactly the state of a
  // sequence that ran only those: anywhere where the architecture's KV can
  // be cut (Arch::kv_truncatable); otherwise 0, position(seq), or a position
  // inside the sequence's last forward when that forward was checkpointed
  // and nothing ran on seq since (a verify's accepted tokens). Throws
  // std::out_of_range (beyond the positions) or std::invalid_argument
  // (outside the checkpoint) otherwise, saying what could be kept.
  void truncate_seq(int seq, int64_t n);

  const Arch& arch() const { return *arch_; }
  const KvCache& kv() const { return kv_; }  // for tests and diagnostics
  const StageConfig& config() const { return config_; }
  LayerRange layers() const { return {config_.first_layer, config_.last_layer}; }
  int64_t n_ctx() const { return config_.n_ctx; }
  int64_t n_vocab() const { return arch_->dims().n_vocab; }
  int64_t boundary_width() const { return arch_->boundary_elems_per_token(); }
  int64_t output_width() const { return config_.head ? n_vocab() : boundary_width(); }
  const MemoryPlan& memory_plan() const { return plan_; }
  const LoadStats& load_stats() const { return load_stats_; }
  // The weights in host memory (a drafter shares the embedding and the head).
  const Model& model() const { return model_; }
  ThreadPool& pool() { return pool_; }

  // Fills the defaults (last layer, context) and checks the config; every
  // backend's stage resolves its config the same way.
  static StageConfig resolve(const Arch& arch, StageConfig c);

 private:
  static WorkspaceShape workspace_shape(const StageConfig& c);
  // Bytes of the workspace line: the architecture's workspace, then the
  // capture rows, then the rollback rows (offsets in *capture_at, *rollback_at).
  static uint64_t workspace_line(const Arch& arch, const StageConfig& c, uint64_t* capture_at = nullptr,
                                 uint64_t* rollback_at = nullptr);
  ForwardRows run(int seq, const int32_t* tokens, const float* input, int64_t n_tokens, const ForwardOptions& o);

  std::unique_ptr<Arch> arch_;
  StageConfig config_;
  MemoryPlan plan_;
  LoadStats load_stats_;  // before model_: the Model constructor fills it
  Model model_;
  KvCache kv_;
  AlignedBuffer workspace_;
  ThreadPool pool_;
  uint64_t capture_at_ = 0, rollback_at_ = 0;  // offsets in workspace_ (set in the constructor's body)
  SpecCheckpoint checkpoint_;  // the last checkpointed forward (spec_checkpoint.h)
};

}  // namespace baton
