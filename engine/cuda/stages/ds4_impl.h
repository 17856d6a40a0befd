// The parts of CudaDs4Stage that its two source files share: the device
// matrices of the stage and the byte layout of its workspace, KV cache and
// pinned io buffer. Private to engine/cuda/stages/ds4*.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cuda/stages/ds4.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ds4_spec.cuh"
#include "kernels/cuda/moe.cuh"

namespace baton {

// A weight matrix as the forward multiplies it: decode through the
// dequantizing matvec (or its integer-dot twin, xq), prefill through cuBLAS.
struct CudaDs4Stage::Mat {
  cuda::MatrixView w{};  // data null: absent
  bool xq = false;       // matvec_xq takes it (decode reads quantized activations)
  bool small = false;    // small_matmul takes it (batches of 9..kSmallMatmulMaxTokens rows)
};

// Batches of up to this many rows run the routed experts per (token, expert)
// pair (moe_decode_xq / moe_decode) rather than grouped through cuBLAS: the
// grouped path dequantizes every expert it touches to F16, which at a few
// rows per expert costs far more than reading each pair's expert rows.
inline constexpr int64_t kMoePairRows = 64;

// Batches of at least this many rows run experts without an integer-dot pair
// kernel (the Q4 files' Q4_K) by the expert (moe_grouped: each touched expert
// once, int8 tensor cores). Measured on one Flash layer (H100,
// bench/results/kernels_moe_grouped_h100.log): grouped 0.88x the float pair
// kernel at 32 rows, 1.18x at 64; for the Q2 files' IQ2_XXS / Q2_K the
// integer-dot pair kernel stays faster up to 64 rows (grouped 0.48x at 8,
// 0.85x at 64), so they keep it (docs/DEEPSEEK4.md, "Short batches by the
// expert").
inline constexpr int64_t kMoeGroupedMinRows = 40;
// Rows up to which the attention's grouped output_a runs on the integer-dot
// kernel, 8 rows per read of the weights (ds4_grouped_matvec_xq); longer
// batches take the per-group projections (tensor cores).
inline constexpr int64_t kOutAXqMaxRows = 64;

struct CudaDs4Stage::Weights {
  struct Layer {
    int ratio = 0;
    bool indexed = false;
    Mat hc_fn[2];  // [0] attention, [1] MoE
    const float *hc_scale[2] = {}, *hc_base[2] = {}, *norm[2] = {};
    Mat qa, qb, kv;
    const float *qa_norm = nullptr, *kv_norm = nullptr, *sinks = nullptr;
    std::vector<Mat> out_a;  // one per output group: its o_lora_rank rows
    Mat out_b;
    Mat gate_inp;
    const int32_t* tid2eid = nullptr;  // hash layers
    const float* exp_probs_b = nullptr;
    cuda::MoeWeights moe;
    Mat sh_gate, sh_up, sh_down;
    Mat comp_kv, comp_gate;
    cuda::MatrixView comp_ape{};
    const float* comp_norm = nullptr;
    Mat idx_qb, idx_proj, idx_kv, idx_gate;
    cuda::MatrixView idx_ape{};
    const float* idx_norm = nullptr;
    // Pairs stored back to back with one dtype (the file's usual order), as
    // one matrix: a decode token's two products in one launch; data null
    // when the pair is not adjacent.
    Mat out_a_all;                     // every group's rows
    Mat comp_kvg, idx_kvg, sh_gu;      // kv|gate, kv|gate, gate|up
  };
  cuda::MatrixView embedding{};
  std::vector<Layer> layers;
  Mat out_hc_fn, output;
  const float *out_hc_scale = nullptr, *out_hc_base = nullptr, *output_norm = nullptr;

  // From the Model's views (device pointers, or a planning base). Refuses a
  // dtype or shape the CUDA kernels cannot run, naming the tensor.
  static Weights collect(const Model& m, const Deepseek4Shape& s, const StageConfig& c);
};

// One layer's KV streams (Deepseek4Arch::KvStream order) inside the kv line.
struct KvLayer {
  std::vector<uint64_t> offset;  // bytes from a (layer, seq) block to each stream
  std::vector<int64_t> rows;
  uint64_t block = 0;            // bytes per (layer, seq)
  uint64_t base = 0;             // bytes from the line to the layer's seq 0 block
};

struct CudaDs4Stage::Layout {
  // Dimensions (Deepseek4Shape), B the planned batch, LR the logit rows.
  int64_t E = 0, HC = 0, MIX = 0, B = 0, LR = 0, V = 0, H = 0, hd = 0, HD = 0, QR = 0, G = 0, OR = 0;
  int64_t NE = 0, K = 0, SF = 0, ih = 0, id = 0, top_k = 0, score_stride = 0;
  // Workspace sections (byte offsets, 256-byte aligned).
  uint64_t x = 0, flat = 0, mix = 0, h = 0, y = 0, params = 0, freqs_main = 0, freqs_comp = 0, xq = 0, xq_bytes = 0;
  uint64_t q_lat = 0, q = 0, att = 0, kv_new = 0, o_lat = 0, comp = 0, icomp = 0, iq = 0, iw = 0, itop = 0,
           iscore = 0, attn = 0, attn_bytes = 0;
  uint64_t router = 0, ids = 0, wts = 0, shared = 0, moe_out = 0, sh_out = 0, offsets = 0, sorted = 0, slot_of = 0,
           moe = 0, moe_bytes = 0;
  uint64_t logits = 0, argmax = 0, mm = 0, mm_bytes = 0, cublas = 0, cublas_bytes = 0, bytes = 0;
  uint64_t head_in = 0;  // a batch's logit rows of the HC state, gathered (LR rows)
  uint64_t argmax_ws = 0, argmax_ws_bytes = 0;  // split argmax slots (zeroed at build, left zero by each call)
  // Pinned io: params are int32 tokens[B], positions[B], -positions[B], pos0,
  // then a batch's seqs[B], out_rows[B], n_pos (batch_params of them).
  int64_t batch_params = 0;
  uint64_t h_params = 0, h_ids = 0, h_offsets = 0, h_out = 0, h_in = 0, io_bytes = 0;
  std::vector<KvLayer> kv;
  uint64_t kv_bytes = 0;
  // A tensor-parallel rank (tp > 1): the head computes its vocabulary rows
  // into tp_mine (rows of vocab_count floats, room for LR x ceil(V / tp)),
  // every rank's blocks are gathered into tp_all and scattered into the
  // logit rows from there. h_tp and h_tp_all are the pinned rooms of a host
  // group's exchanges (SharedLayout): the sums' B x E rows, the gather's
  // blocks. All empty for a whole model.
  int tp = 1;
  int64_t vocab_count = 0;
  uint64_t tp_mine = 0, tp_all = 0;
  uint64_t h_tp = 0, h_tp_floats = 0, h_tp_all = 0, h_tp_all_floats = 0;
  // Speculative decoding (ds4_spec.cpp), every room empty unless planned
  // (StageConfig::capture_layers, verify_rows): in the workspace, after the
  // rest, the captured rows (B x capture layers x E floats), the
  // checkpoint's saved rows (Deepseek4Arch::rollback_floats of verify_rows)
  // and the table of the rings it copies; in the pinned io the captured
  // rows on their way to the host.
  uint64_t capture = 0, capture_bytes = 0, rollback = 0, rollback_bytes = 0, rings = 0, h_capture = 0;
  std::vector<cuda::RingRows> ring_rows;  // the table, uploaded to `rings` at construction

  static Layout make(const Deepseek4Arch& arch, const StageConfig& c, const Weights& w);
  // The rooms above, placed after the rest by make() once the KV layout is known.
  void plan_spec(const Deepseek4Arch& arch, const StageConfig& c);
};

}  // namespace baton
