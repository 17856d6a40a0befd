// DeepSeek V4 (`deepseek4`) on the CPU, in exact (full precision) numerics:
// the arithmetic of the HuggingFace `transformers` DeepseekV4 model, so a
// randomly initialised one of those is an oracle for it. Hyperparameters and
// the tensor table come from Deepseek4Shape (every number from the
// `deepseek4.*` keys); this file adds the slot order the forward reads back,
// the per-layer KV streams and the forward of a layer range:
//
//   x: n_hc streams of n_embd per token (the hyper-connection state; also what
//      crosses a stage boundary)
//   per layer, twice (attention, then MoE):
//     pre, post, comb = HC weights from RMS(flat x) (comb: Sinkhorn, doubly
//                       stochastic)
//     y = sublayer(RMSNorm(sum_s pre[s] x[s]))
//     x'[k] = post[k] y + sum_j comb[j][k] x[j]
//   head: RMSNorm(sum_s w[s] x[s]) -> logits, w from output_hc_*.
//
// The pieces live in deepseek4.cpp (tables, KV, workspace, HC, head,
// driver), deepseek4_attn.cpp (attention, compressors, indexer) and
// deepseek4_moe.cpp (routing and experts); the node planner's lines in
// deepseek4_plan.cpp. See docs/DEEPSEEK4.md.
//
// A tensor-parallel rank file (docs/TENSOR_PARALLEL.md) is read as a smaller
// model: its heads, output groups and expert width are 1/N of the whole. With
// ForwardArgs::tp, each layer's attention output and MoE output are summed
// over the ranks before the hyper-connection post step, and the head's
// vocabulary slices are gathered into full logit rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "engine/model/deepseek4_shape.h"
#include "engine/model/model.h"
#include "kernels/cpu_ops.h"

namespace baton {

class KvCache;
class Model;

// The hyper-connection weights of one token from its n_hc*(n_hc+2) mix
// values (mix = hc_fn . RMS(flat x)): pre[n_hc], post[n_hc], comb[n_hc][n_hc]
// (row j = input stream, column k = output stream), written over `mix` in
// that order. comb is a row softmax plus eps, then Sinkhorn: a column
// normalisation and (iters - 1) row-then-column normalisations.
void ds4_hc_weights(float* mix, int n_hc, const float* scale, const float* base, int sinkhorn_iters, float eps);

// Router of one token: scores[e] = sqrt(softplus(logits[e])) (in place);
// picks n_used experts into ids (hash: the given ids; else the top n_used of
// scores + bias, ties to the lower id) and their weights = scores of the
// picked experts, normalised to sum 1 when `norm`, times `scale`.
void ds4_route(float* scores, int n_expert, const float* bias, const int32_t* hash_ids, int n_used, bool norm,
               float scale, int32_t* ids, float* weights);

// Expert e of a stacked expert tensor ([in, rows, n_expert]): its rows
// [e * rows, (e + 1) * rows) as one matrix.
WeightView ds4_expert(const Tensor& t, int e);

// One token's n streams (n rows of E) weighted into one row:
// out[d] = sum_s w[s] * x[s][d], summed in stream order.
void ds4_hc_collapse(const float* w, const float* x, int n, int64_t E, float* out);

// YaRN inverse frequencies (transformers' formula; factor <= 1 or orig_ctx <= 0:
// plain base^(-2i/dim)) for rot_dim rotated dims.
std::vector<float> ds4_rope_freqs(int rot_dim, double base, double factor, double beta_fast, double beta_slow,
                                  int64_t orig_ctx);

class Deepseek4Arch : public Arch {
 public:
  enum LayerSlot {
    kHcAttnFn, kHcAttnScale, kHcAttnBase,  // [n_hc*E, mix], [3] F32, [mix] F32
    kHcFfnFn, kHcFfnScale, kHcFfnBase,
    kAttnNorm,                             // [E] F32
    kQA, kQANorm, kQB,                     // [E, q_rank], [q_rank] F32, [q_rank, H*hd]
    kKv, kKvNorm,                          // [E, hd], [hd] F32
    kSinks,                                // [H] F32
    kOutA, kOutB,                          // [H*hd/G, G*o_rank], [G*o_rank, E]
    kFfnNorm,                              // [E] F32
    kGateInp,                              // [E, n_expert]
    kTid2Eid,                              // [n_used, V] I32, hash layers only
    kExpProbsB,                            // [n_expert] F32, optional, top-k layers only
    kGateExps, kUpExps, kDownExps,         // [E, ff, n_expert], [E, ff, n_expert], [ff, E, n_expert]
    kGateShexp, kUpShexp, kDownShexp,      // [E, sh*ff], [E, sh*ff], [sh*ff, E]
    kCompApe, kCompKv, kCompGate, kCompNorm,  // compressed layers: [lanes*hd, r], [E, lanes*hd] x2, [hd] F32
    kIdxQB, kIdxProj,                      // indexed layers: [q_rank, ih*id], [E, ih]
    kIdxApe, kIdxKv, kIdxGate, kIdxNorm,   // [2*id, r], [E, 2*id] x2, [id] F32
    kLayerSlots
  };
  enum EmbeddingSlot { kTokenEmbd };
  enum HeadSlot { kOutHcBase, kOutHcFn, kOutHcScale, kOutputNorm, kOutput };
  // KV streams of a layer (see kv_layer_streams).
  enum KvStream { kWindow, kCompRows, kCompState, kIdxRows, kIdxState };

  explicit Deepseek4Arch(const GgufFile& f);

  const std::string& name() const override { return name_; }
  const ModelDims& dims() const override { return dims_; }
  std::string describe() const override { return s_.describe(); }
  const Deepseek4Shape& shape() const { return s_; }
  // A rank file's rank (baton.tp.rank; 0 for a whole model); its group's
  // size is shape().tp_size.
  int tp_rank() const { return tp_rank_; }

  std::vector<TensorSpec> embedding_tensors() const override;
  std::vector<TensorSpec> head_tensors() const override;
  std::vector<TensorSpec> layer_tensors(int layer) const override;
  std::vector<int64_t> kv_stream_widths() const override { return {}; }
  std::vector<KvStreamShape> kv_layer_streams(int layer, int64_t n_ctx) const override;
  // The window ring overwrites old raw rows and the compressors pool rows
  // as they arrive: no earlier position's state survives.
  bool kv_truncatable() const override { return false; }
  // Rollback (deepseek4_spec.cpp): per layer, the window ring's slots and
  // the compressors' state slots (kv and gate rows; the indexer's too) of the
  // forward's positions. Compressed and index rows need nothing: a row is
  // read only once its window is complete, and a window completed by a
  // rejected token is pooled again when the kept tokens complete it.
  uint64_t rollback_floats(LayerRange layers, int64_t n_ctx, int64_t rows) const override;
  int64_t rollback_max_rows(LayerRange layers, int64_t n_ctx) const override;
  void save_rollback(const KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n,
                     float* out) const override;
  void restore_rollback(KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n, int64_t keep,
                        const float* saved) const override;
  // One ring a rollback saves and restores: position p's row of `width`
  // floats sits at slot p % slots, `offset` floats into the layer's stream
  // `stream` (the state streams hold a kv ring, then a gate ring). The
  // saved rows of a forward of n tokens are, ring after ring in this order,
  // the n rows of its positions, `saved_at` * n floats into the buffer.
  // The CPU (rollback_copy) and the CUDA stage (engine/cuda/stages/ds4_spec.cpp)
  // both walk this list, so they save the same slots in the same layout.
  struct RollbackRing {
    int layer = 0;
    KvStream stream = kWindow;
    int64_t offset = 0, slots = 0, width = 0;
    int64_t saved_at = 0;  // floats of the earlier rings' rows, per saved row
  };
  std::vector<RollbackRing> rollback_rings(LayerRange layers, int64_t n_ctx) const;
  bool can_capture() const override { return true; }
  int64_t boundary_elems_per_token() const override { return s_.boundary_elems_per_token(); }
  uint64_t workspace_bytes(const WorkspaceShape& shape) const override;
  const float* forward(const ForwardArgs& args) const override;

  // The workspace of one forward (offsets in bytes; see engine/model/deepseek4_shape.cpp
  // for the layout this must match).
  struct Ws {
    uint64_t x, hc_tmp, mix, h, h_out, scores, rows;                    // persistent
    uint64_t q_lat, q, att, kv_new, o_lat, comp, iq, iw, icomp, itop, iscore;  // attention
    uint64_t router, ids, wts, gate_up, shared, out;                   // moe
    uint64_t logits, tp_mine, tp_all;                                   // head (tp_*: a rank's slice, gathered)
    uint64_t bytes;
    int64_t score_stride;  // floats of one thread's attention scores
  };
  Ws ws_layout(const WorkspaceShape& shape) const;

 private:
  // State shared by the pieces of one forward.
  struct Run {
    const ForwardArgs* a;
    const Ws* L;
    float* ws(uint64_t off) const { return reinterpret_cast<float*>(a->workspace + off); }
  };
  float clamp_of(int layer) const;
  void hc_pre(const Run& r, int layer, bool ffn) const;   // x -> h (normed sublayer input), mix = weights
  void hc_post(const Run& r) const;                       // x = post * h_out + comb^T x
  void attention(const Run& r, int layer) const;          // h -> h_out
  void compress(const Run& r, int layer, bool indexer, const float* kv, const float* gate, int64_t stride) const;
  void select_rows(const Run& r, int layer) const;        // indexer top-k -> itop
  void moe(const Run& r, int layer) const;                // h -> h_out
  void head(const Run& r, float* logits) const;
  void capture(const Run& r, int layer) const;            // mean of x's streams -> ForwardArgs::capture
  // (save) copies the ring slots of the forward's positions to `buf`, or
  // (restore) puts back those of positions pos0 + keep and later.
  void rollback_copy(KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n, int64_t keep, float* buf,
                     bool restore) const;

  int tp_rank_ = 0;  // a rank file's rank (baton.tp.rank); its size is s_.tp_size
  std::string name_ = "deepseek4";
  Deepseek4Shape s_;
  ModelDims dims_;
  std::vector<float> freqs_main_;      // sliding-only layers: rope_base
  std::vector<float> freqs_compress_;  // compressed layers, compressors, indexer: compress base with YaRN
};

}  // namespace baton
