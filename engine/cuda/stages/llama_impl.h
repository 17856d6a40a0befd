// The parts of CudaStage that its two source files share: one weight
// projection as the forward runs it, every tensor of the stage in that form,
// and the byte layout of its workspace and pinned io buffer. Private to
// engine/cuda/stages/llama*.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cuda/stages/llama.h"
#include "kernels/cuda/common.cuh"

namespace baton {

// Rows up to which a projection may take the integer-dot matvec. It keeps
// 16-bit activations (1.5e-5 of sum |w x|) where small_matmul rounds x to
// F16 (about 1e-3), so dtypes whose small_matmul is only somewhat faster
// (the WMMA path: they cross at 4-5 rows on speed alone) keep the matvec's
// precision up to here, which the CPU comparisons of the CUDA stage hold
// them to.
inline constexpr int64_t kXqMaxRows = 8;

// Rows from which small_matmul takes a projection. Q4_K's register-fed
// kernel is 3.7x faster than the matvec at 8 rows and faster from 2
// (docs/CUDA.md), so Q4_K, the files people run, takes the F16 rounding
// from 2 rows, as the engines that batch with 8- or 16-bit activations do.
inline int64_t small_matmul_min_rows(const cuda::MatrixView& w) {
  return w.type == DType::Q4_K ? 2 : kXqMaxRows + 1;
}

struct CudaStage::Proj {
  cuda::MatrixView w;
  bool cublas_f32 = false;  // F32 rows the matvec cannot take: a float32 cuBLAS GEMM
  bool xq = false;          // decode through the integer-dot matvec (quantized activations)
  bool small = false;       // batches of up to kSmallMatmulMaxTokens rows through small_matmul
  int64_t out_col = 0;      // first column of the output row it writes
};

struct CudaStage::Weights {
  struct Layer {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    std::vector<Proj> qkv;      // one fused projection, or Q, K, V
    Proj wo;
    std::vector<Proj> gate_up;  // one fused projection, or gate, up
    Proj down;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  };
  cuda::MatrixView embedding{};
  const float* output_norm = nullptr;
  Proj output{};
  std::vector<Layer> layers;
  const Tensor* rope_freqs = nullptr;  // optional, the same tensor for every layer
  bool any_cublas_f32 = false;

  // From the Model's views (device pointers, or a planning base). Refuses a
  // dtype or shape the CUDA kernels cannot run, naming the tensor.
  static Weights collect(const Model& m, const LlamaHparams& hp, const StageConfig& c);
};

struct CudaStage::Layout {
  // Dimensions.
  int64_t E = 0, F = 0, V = 0, B = 0, L = 0;  // L: logit rows (1, or B with all_logits; 0 without the head)
  int64_t qw = 0, kw = 0, vw = 0, ow = 0, qkvw = 0;
  // Device workspace sections (byte offsets) and sizes.
  uint64_t x = 0, y = 0, xn = 0, qkv = 0, att = 0, gu = 0, ffh = 0, logits = 0, freqs = 0, params = 0, ids = 0;
  uint64_t argmax = 0, argmax_bytes = 0;  // split argmax slots (zeroed at build, left zero by each call)
  uint64_t attn = 0, attn_bytes = 0, mm = 0, mm_bytes = 0, cublas = 0, cublas_bytes = 0, bytes = 0;
  uint64_t xq = 0, xq_bytes = 0;  // quantized activations of up to kXqMaxRows rows (matvec_xq)
  uint64_t params_bytes = 0;  // int32 tokens[B], positions[B], pos0, then batch_params
  int64_t batch_params = 0;   // int32 seqs[B], out_rows[B], n_pos (SharedLayout::batch_params)
  // Pinned host io sections.
  uint64_t h_params = 0, h_ids = 0, h_out = 0, h_in = 0, io_bytes = 0;
  uint64_t kv_bytes = 0;
  // A tensor-parallel rank (tp > 1): the head computes its vocabulary rows
  // into tp_mine (rows of vocab_count floats, the block padded with zeros
  // to rows x slice, slice the group's widest), every rank's blocks are
  // gathered into tp_all, and scattered into the logit rows from there.
  // h_tp and h_tp_all are the pinned rooms of a host group's exchanges
  // (SharedLayout): the sums' B x E rows, a gather's blocks.
  int tp = 1;
  int64_t vocab_count = 0, slice = 0;
  uint64_t tp_mine = 0, tp_all = 0;
  uint64_t h_tp = 0, h_tp_floats = 0, h_tp_all = 0, h_tp_all_floats = 0;

  static Layout make(const LlamaHparams& hp, const StageConfig& c, const Weights& w,
                     const std::vector<int64_t>& kv_widths);
};

}  // namespace baton
