// The architecture interface. An Arch is built from a GGUF file's metadata and
// says everything the rest of the engine needs to plan and run a layer range
// without knowing the model family:
//   - the model's dimensions,
//   - the tensors of the embedding, of the output head and of each layer
//     (name, dtype rule, shape), in a fixed slot order it reads back by index,
//   - the KV cache rows it keeps per token and layer,
//   - how many floats cross a stage boundary per token,
//   - the workspace its forward needs for a batch shape,
//   - the forward of a layer range (with the embedding and/or head when the
//     stage has them).
// One file per architecture (engine/arch/NAME.cpp); llama, qwen2 and qwen3
// share the llama-family core in engine/arch/llama_family.{h,cpp}. What the
// node planner needs from an architecture is its ArchPlanner
// (engine/plan/arch_planner.h); the registry (registry.h, the list in
// engine/registry.cpp) names both builders and the architecture's CUDA stage.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/quant.h"

namespace baton {

class GgufFile;
class KvCache;
class Model;
class ThreadPool;
class TpComm;

// An inclusive range of layer indices [first, last].
struct LayerRange {
  int first = 0;
  int last = -1;
  int count() const { return last - first + 1; }
  bool contains(int layer) const { return layer >= first && layer <= last; }
};

// What the loader must find for one slot.
struct TensorSpec {
  std::string name;            // GGUF name, e.g. "blk.3.attn_q.weight"; empty: slot unused here
  std::vector<int64_t> shape;  // ggml order: shape[0] is the row length
  std::optional<DType> type;   // a required dtype (norms, biases: F32); none: any compute dtype
  bool optional = false;       // absent in the file: the slot stays empty
  std::string fallback;        // absent in the file: load this tensor instead (tied output head)
};

struct ModelDims {
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int n_layer = 0;
  int64_t n_ctx_train = 0;  // the context the model was trained for
};

// The batch shape a workspace is sized for.
struct WorkspaceShape {
  int64_t max_batch = 1;       // tokens per forward
  int64_t n_ctx = 0;           // longest sequence attention will see
  int n_threads = 1;           // per-thread scratch
  bool embedding = false;
  bool head = false;
  int64_t max_logit_rows = 1;  // head: logits rows per forward (1, or max_batch for all tokens)
  LayerRange layers;           // the stage's layers; empty (the default): size for any range
};

// One KV stream of a layer: `rows` rows of `width` floats for each sequence.
// An aligned stream starts on a kPlanAlignment boundary (its bytes are
// rounded up), so an architecture can match a plan that aligns each part.
struct KvStreamShape {
  int64_t rows = 0;
  int64_t width = 0;
  bool aligned = false;
};

// One forward over a stage's layer range for n_tokens consecutive tokens of
// one sequence, appending their K/V at positions [pos0, pos0 + n_tokens).
struct ForwardArgs {
  const Model* model = nullptr;
  LayerRange layers;
  bool embedding = false;  // input: token ids
  bool head = false;       // output: logits
  KvCache* kv = nullptr;
  int seq = 0;
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  const int32_t* tokens = nullptr;  // embedding: n_tokens ids (checked against n_vocab)
  const float* input = nullptr;     // no embedding: n_tokens rows of boundary_elems_per_token()
  int64_t logit_rows = 1;           // head: logits for the last logit_rows tokens
  uint8_t* workspace = nullptr;     // workspace_bytes(shape) bytes
  WorkspaceShape shape;             // what the workspace was sized for; must cover this call
  ThreadPool* pool = nullptr;
  // Tensor parallelism: the ranks of the group sum their partial results
  // and gather the head's vocabulary slices through it (null: one rank).
  TpComm* tp = nullptr;
  // Hidden-state capture (speculative decoding's drafter input,
  // docs/SPECULATIVE.md): when `capture` is set, token t's row of
  // capture_layers.size() x n_embd floats gets, for each listed layer (in
  // list order, each inside `layers`), that layer's output averaged over the
  // residual streams. Only where Arch::can_capture().
  std::span<const int> capture_layers;
  float* capture = nullptr;
};

// The checks every architecture's forward makes first: the token count, the
// positions, the threads and the logit rows against the workspace shape and
// the KV cache. Throws std::invalid_argument or std::out_of_range.
void check_forward_args(const ForwardArgs& a);

class Arch {
 public:
  // Builds the architecture named by `general.architecture` through the
  // registry; refuses an unknown name (std::runtime_error naming it and the
  // known ones).
  static std::unique_ptr<Arch> from_gguf(const GgufFile& f);
  static std::vector<std::string> known();

  virtual ~Arch() = default;
  virtual const std::string& name() const = 0;
  virtual const ModelDims& dims() const = 0;
  // One line of hyperparameters for humans.
  virtual std::string describe() const = 0;

  // Slot order is the architecture's own; Model keeps it.
  virtual std::vector<TensorSpec> embedding_tensors() const = 0;
  virtual std::vector<TensorSpec> head_tensors() const = 0;
  virtual std::vector<TensorSpec> layer_tensors(int layer) const = 0;

  // Floats per token of each KV stream a layer keeps (llama: K and V rows).
  // Empty for an architecture whose layers keep different streams (deepseek4).
  virtual std::vector<int64_t> kv_stream_widths() const = 0;
  uint64_t kv_bytes_per_token_per_layer() const;
  // The streams `layer` keeps for one sequence at context n_ctx. The default
  // is one stream of n_ctx rows per kv_stream_widths() entry; an architecture
  // with per-layer streams (sliding windows, compressed rows) overrides it.
  virtual std::vector<KvStreamShape> kv_layer_streams(int layer, int64_t n_ctx) const;
  // True when a sequence's KV can be cut back to any position: every KV row
  // is one position's own (llama's K and V rows), so forgetting the rows
  // past n leaves exactly the state of a sequence of n tokens. False when
  // the state at a position depends on rows the cache no longer holds
  // (deepseek4's window ring and compressor pooling): such a sequence can
  // only be continued from its end or reset (the prefix cache, docs/MEMORY.md).
  virtual bool kv_truncatable() const { return true; }
  // Rolling back a forward (speculative verify, docs/SPECULATIVE.md). For
  // an architecture whose KV cannot be cut anywhere, the state rows that a
  // forward of n tokens at pos0 overwrites and that the sequence needs when
  // only its first `keep` tokens are kept are saved before it runs
  // (save_rollback) and put back after (restore_rollback): then the state is
  // the state of a forward of those `keep` tokens alone. Floats saved for
  // `rows` tokens (0: nothing needed); the most rows one save covers (the
  // shortest ring of the range, whose slots must stay distinct).
  virtual uint64_t rollback_floats(LayerRange layers, int64_t n_ctx, int64_t rows) const {
    (void)layers, (void)n_ctx, (void)rows;
    return 0;
  }
  virtual int64_t rollback_max_rows(LayerRange layers, int64_t n_ctx) const {
    (void)layers;
    return n_ctx;
  }
  virtual void save_rollback(const KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n,
                             float* out) const {
    (void)kv, (void)seq, (void)layers, (void)pos0, (void)n, (void)out;
  }
  virtual void restore_rollback(KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n, int64_t keep,
                                const float* saved) const {
    (void)kv, (void)seq, (void)layers, (void)pos0, (void)n, (void)keep, (void)saved;
  }
  // True when forward fills ForwardArgs::capture.
  virtual bool can_capture() const { return false; }

  // Floats per token that cross a stage boundary (llama: one hidden vector).
  virtual int64_t boundary_elems_per_token() const = 0;

  virtual uint64_t workspace_bytes(const WorkspaceShape& shape) const = 0;

  // Returns a pointer into the workspace: logits (logit_rows x n_vocab) when
  // the stage has the head, else the boundary activations (n_tokens x
  // boundary_elems_per_token()). Allocates nothing.
  virtual const float* forward(const ForwardArgs& args) const = 0;
};

}  // namespace baton
