// CudaStage's forward: the llama-family layer (engine/cuda/stages/llama.h
// lists its launches) as kernel launches on the stage's stream, one step
// function per block: the attention block, the FFN block, the head.
//
// A tensor-parallel rank (config_.tp) runs the same steps on its slice and
// adds the group's exchanges (docs/TENSOR_PARALLEL.md): the output
// projection's and ffn_down's partial rows in y are summed over the ranks
// in place, before the fused add + norm adds y into x as always; the head
// projects the rank's vocabulary rows and gathers every rank's into the
// logit rows, which the argmax then reads whole.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/cuda/stages/llama.h"
#include "engine/cuda/stages/llama_impl.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matmul_small.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace baton {

// One forward of n tokens of seq, or of a batch of n rows of several
// sequences (seq < 0: each row's sequence and position are step
// parameters): the workspace sections it works in and the steps, each
// queued on the stage's stream in the order they are called.
struct CudaStage::Forward {
  Forward(CudaStage& stage, int seq, int64_t n, int64_t pos0, bool graph);

  // Fused add of `pending` (the last projection's output, not yet added
  // into x; null: none) + RMS norm, Q|K|V with RoPE and the KV append,
  // attention, the output projection into y.
  void attention_block(const Weights::Layer& w, int layer, const float* pending);
  // Fused add of y + RMS norm, gate|up, SwiGLU, down into y.
  void ffn_block(const Weights::Layer& w);
  // Fused add of `pending` + the output norm, the output projection of the
  // logit rows, their argmax, the greedy ids out to the pinned io.
  void head(const float* pending);

  // The quantized-activation buffer when one of ps takes it, else null.
  uint8_t* xq_for(const Proj* ps, size_t count) const;
  void qkv_rope(const Weights::Layer& w, uint8_t* xq, float* kc, float* vc);
  void attend(const Weights::Layer& w, float* kc, float* vc);

  CudaStage& st;
  const Layout& L;
  const LlamaHparams& hp;
  const int seq;
  const int64_t n, pos0;
  const bool graph;
  const bool batch;      // seq < 0
  int64_t n_out = 1;     // batch: logit rows (the rows out_rows names)
  cudaStream_t s;
  uint8_t* ws;
  float *x, *y, *xn, *qkv, *att, *gu, *ffh;
  const float* freqs;
  int32_t *d_tokens, *d_positions, *d_pos0;
  int32_t *d_seqs, *d_out_rows, *d_n_pos;  // a batch's step parameters
  float eps;
  // Quantized activations for the integer-dot matvec (decode and short
  // prompts), written by the kernel that produces each projection input.
  uint8_t* xq_buf;
};

CudaStage::Forward::Forward(CudaStage& stage, int seq_, int64_t n_, int64_t pos0_, bool graph_)
    : st(stage),
      L(*stage.layout_),
      hp(stage.llama_->hparams()),
      seq(seq_),
      n(n_),
      pos0(pos0_),
      graph(graph_),
      batch(seq_ < 0) {
  s = st.stream_.get();
  ws = st.workspace_.data();
  auto f = [&](uint64_t off) { return reinterpret_cast<float*>(ws + off); };
  x = f(L.x), y = f(L.y), xn = f(L.xn), qkv = f(L.qkv), att = f(L.att), gu = f(L.gu), ffh = f(L.ffh);
  freqs = f(L.freqs);
  d_tokens = reinterpret_cast<int32_t*>(ws + L.params);
  d_positions = d_tokens + L.B;
  d_pos0 = d_tokens + 2 * L.B;
  d_seqs = d_pos0 + 1;
  d_out_rows = d_seqs + L.B;
  d_n_pos = d_out_rows + L.B;
  eps = hp.rms_eps;
  xq_buf = L.xq_bytes > 0 && n <= kXqMaxRows ? ws + L.xq : nullptr;
}

uint8_t* CudaStage::Forward::xq_for(const Proj* ps, size_t count) const {
  return std::any_of(ps, ps + count, [](const Proj& p) { return p.xq; }) ? xq_buf : nullptr;
}

void CudaStage::enqueue(int seq, int64_t n, int64_t pos0, bool graph) {
  Forward fw(*this, seq, n, pos0, graph);
  run_layers(fw);
}

void CudaStage::enqueue_batch(int64_t n, int64_t n_out, bool graph) {
  Forward fw(*this, -1, n, 0, graph);
  fw.n_out = n_out;
  run_layers(fw);
}

void CudaStage::run_layers(Forward& fw) {
  const int64_t n = fw.n;
  enqueue_params();
  // Without the embedding the input rows are already in x: run() copies host
  // rows there, a link writes device rows there (device_input()). Keeping
  // that copy out of the graph lets one decode graph serve both.
  if (config_.embedding) cuda::get_rows(w_->embedding, fw.d_tokens, n, fw.x, layout_->E, fw.s);
  const float* pending = nullptr;
  for (size_t i = 0; i < w_->layers.size(); ++i) {
    const Weights::Layer& w = w_->layers[i];
    fw.attention_block(w, config_.first_layer + int(i), pending);
    fw.ffn_block(w);
    pending = fw.y;
  }
  if (config_.head) {
    fw.head(pending);
  } else {
    cuda::add_inplace(fw.x, pending, n * layout_->E, fw.s);
  }
}

void CudaStage::Forward::attention_block(const Weights::Layer& w, int layer, const float* pending) {
  const int64_t E = L.E;
  uint8_t* xq = xq_for(w.qkv.data(), w.qkv.size());
  cuda::add_rmsnorm(x, E, pending, E, w.attn_norm, xn, E, n, E, eps, s, xq);
  // A batch addresses sequence 0's rows and offsets each row by its sequence.
  float* kc = st.kv_stream(layer, batch ? 0 : seq, 0);
  float* vc = st.kv_stream(layer, batch ? 0 : seq, 1);
  qkv_rope(w, xq, kc, vc);
  attend(w, kc, vc);
}

void CudaStage::Forward::qkv_rope(const Weights::Layer& w, uint8_t* xq, float* kc, float* vc) {
  const int64_t E = L.E;
  const RopeMode rope = st.llama_->variant().rope;
  // One decode token of a plain llama layer (no biases or q/k norms,
  // interleaved RoPE pairs, integer-dot weights): RoPE and the KV append
  // run in the projection's epilogue, one launch instead of two.
  const bool fuse_rope = n == 1 && !batch && xq && !w.bq && !w.bk && !w.bv && !w.q_norm && !w.k_norm &&
                         rope == RopeMode::Normal && hp.head_dim_k % 2 == 0 &&
                         std::all_of(w.qkv.begin(), w.qkv.end(), [](const Proj& p) { return p.xq; });
  if (fuse_rope) {
    cuda::QkvRope r;
    r.q_rows = L.qw, r.k_rows = L.kw, r.v_rows = L.vw;
    r.head_dim = hp.head_dim_k, r.rot_dim = hp.rope_dim;
    r.inv_freq = freqs, r.pos = d_positions, r.cache_pos = d_pos0;
    r.k_cache = kc, r.v_cache = vc;
    for (const Proj& p : w.qkv) {
      r.first_row = p.out_col;
      cuda::matvec_xq_rope(p.w, xq, qkv + p.out_col, r, s);
    }
    return;
  }
  for (const Proj& p : w.qkv) st.project(p, xn, xq, n, E, qkv, L.qkvw);
  if (w.bq) cuda::add_bias_rows(qkv, n, L.qkvw, w.bq, L.qw, s);
  if (w.bk) cuda::add_bias_rows(qkv + L.qw, n, L.qkvw, w.bk, L.kw, s);
  if (w.bv) cuda::add_bias_rows(qkv + L.qw + L.kw, n, L.qkvw, w.bv, L.vw, s);
  if (w.q_norm) cuda::head_rmsnorm(qkv, n, L.qkvw, hp.n_head, hp.head_dim_k, w.q_norm, eps, s);
  if (w.k_norm) cuda::head_rmsnorm(qkv + L.qw, n, L.qkvw, hp.n_head_kv, hp.head_dim_k, w.k_norm, eps, s);
  // Q and K heads are adjacent in the row: one rope over n_head +
  // n_head_kv heads, which also appends the rotated K and the V row to
  // the cache.
  cuda::RopeAppend app;
  app.first_k_head = hp.n_head;
  app.v = qkv + L.qw + L.kw;
  app.vw = L.vw;
  app.k_cache = kc;
  app.v_cache = vc;
  if (batch) {
    app.row_seq = d_seqs;
    app.seq_stride = st.seq_stride();
  } else {
    app.pos0 = d_pos0;
  }
  cuda::rope(qkv, n, L.qkvw, hp.n_head + hp.n_head_kv, hp.head_dim_k, hp.rope_dim, d_positions, freqs, rope, app, s);
}

void CudaStage::Forward::attend(const Weights::Layer& w, float* kc, float* vc) {
  cuda::AttentionParams ap;
  ap.n_head = hp.n_head;
  ap.n_head_kv = hp.n_head_kv;
  ap.head_dim_k = hp.head_dim_k;
  ap.head_dim_v = hp.head_dim_v;
  ap.scale = float(1.0 / std::sqrt(double(hp.head_dim_k)));
  ap.q = qkv;
  ap.q_stride = L.qkvw;
  ap.n_tokens = n;
  ap.pos0 = graph ? st.config_.n_ctx - n : pos0;
  ap.pos0_device = graph ? d_pos0 : nullptr;
  ap.k_cache = kc;
  ap.v_cache = vc;
  if (batch) {
    ap.pos0 = 0;
    ap.pos0_device = nullptr;
    ap.row_seq = d_seqs;
    ap.row_pos = d_positions;
    ap.seq_stride = st.seq_stride();
    ap.n_pos_device = d_n_pos;
    ap.max_positions = st.config_.n_ctx;
  }
  ap.out = att;
  ap.out_stride = L.ow;
  // The attention kernels quantize their output for the output projection.
  uint8_t* xq = hp.head_dim_v % 32 == 0 ? xq_for(&w.wo, 1) : nullptr;
  ap.xq = xq;
  cuda::attention(ap, ws + L.attn, L.attn_bytes, s);
  st.project(w.wo, att, xq, n, L.ow, y, L.E);
  if (st.config_.tp) st.tp_sum(y, size_t(n * L.E));  // each rank's heads' share of the projection
}

void CudaStage::Forward::ffn_block(const Weights::Layer& w) {
  const int64_t E = L.E, F = L.F;
  uint8_t* xq = xq_for(w.gate_up.data(), w.gate_up.size());
  cuda::add_rmsnorm(x, E, y, E, w.ffn_norm, xn, E, n, E, eps, s, xq);
  for (const Proj& p : w.gate_up) st.project(p, xn, xq, n, E, gu, 2 * F);
  xq = xq_for(&w.down, 1);
  cuda::swiglu_rows(gu, gu + F, 2 * F, ffh, n, F, s, xq);
  st.project(w.down, ffh, xq, n, F, y, E);
  if (st.config_.tp) st.tp_sum(y, size_t(n * E));  // each rank's n_ff columns' share
}

void CudaStage::Forward::head(const float* pending) {
  const Weights& W = *st.w_;
  const int64_t E = L.E;
  const int64_t rows = batch ? n_out : st.config_.all_logits ? n : 1;
  // A batch whose chunks all continue a prompt asks for no logits (the
  // driver returns none); a group's ranks all skip the gather alike.
  if (rows == 0) return;
  float* logits = reinterpret_cast<float*>(ws + L.logits);
  int32_t* ids = reinterpret_cast<int32_t*>(ws + L.ids);
  uint8_t* xq = xq_for(&W.output, 1);
  // A rank's projection writes its vocabulary rows apart, to be gathered.
  const bool tp = st.config_.tp != nullptr;
  float* out = tp ? reinterpret_cast<float*>(ws + L.tp_mine) : logits;
  const int64_t out_stride = tp ? L.vocab_count : L.V;
  if (batch) {
    // The rows that ask for logits, gathered into y (free once the norm
    // has added it into x), quantized there for the matvec when it takes them.
    cuda::add_rmsnorm(x, E, pending, E, W.output_norm, xn, E, n, E, eps, s, nullptr);
    cuda::get_rows({DType::F32, xn, n, E, uint64_t(E) * sizeof(float)}, d_out_rows, rows, y, E, s);
    xq = rows <= kXqMaxRows ? xq : nullptr;
    if (xq) cuda::quantize_xq(y, E, rows, E, xq, s);
    st.project(W.output, y, xq, rows, E, out, out_stride);
  } else {
    cuda::add_rmsnorm(x, E, pending, E, W.output_norm, xn, E, n, E, eps, s, xq);
    st.project(W.output, xn + (n - rows) * E, xq ? xq + uint64_t(n - rows) * cuda::xq_row_bytes(E) : nullptr, rows,
               E, out, out_stride);
  }
  if (tp) st.tp_gather_logits(out, reinterpret_cast<float*>(ws + L.tp_all), rows, logits);
  cuda::argmax(logits, rows, L.V, L.V, ids, s, ws + L.argmax, L.argmax_bytes);
  BATON_CUDA_CHECK(cudaMemcpyAsync(st.io_.data() + L.h_ids, ids, uint64_t(rows) * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, s));
}

int64_t CudaStage::seq_stride() const { return config_.n_ctx * (layout_->kw + layout_->vw); }

float* CudaStage::kv_stream(int layer, int seq, int s) const {
  const Layout& L = *layout_;
  const int64_t block = int64_t(layer - config_.first_layer) * config_.n_seq + seq;
  const int64_t per_block = config_.n_ctx * (L.kw + L.vw);
  float* base = reinterpret_cast<float*>(kv_.data()) + block * per_block;
  return s == 0 ? base : base + config_.n_ctx * L.kw;
}

void CudaStage::project(const Proj& p, const float* x, const void* xq, int64_t n, int64_t x_stride, float* out,
                        int64_t out_stride) {
  const Layout& L = *layout_;
  float* o = out + p.out_col;
  const bool small = p.small && n >= small_matmul_min_rows(p.w) && n <= cuda::kSmallMatmulMaxTokens;
  if (!small && xq && p.xq && n <= kXqMaxRows) {
    cuda::matvec_xq(p.w, xq, n, o, out_stride, stream_.get());
  } else if (p.cublas_f32) {
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(p.w.rows), int(n), int(p.w.cols), &one,
                             static_cast<const float*>(p.w.data), int(p.w.row_bytes / sizeof(float)), x, int(x_stride),
                             &zero, o, int(out_stride)),
                 "cublasSgemm (F32 weights)");
  } else if (small) {
    // A batch of a few to 64 rows: W read once, no F16 copy of it
    // (bench_cuda_kernels matmul: 1.3-2x faster than matmul at 8-64 rows).
    cuda::small_matmul(p.w, x, n, x_stride, o, out_stride, workspace_.data() + L.mm, L.mm_bytes, stream_.get());
  } else if (n <= cuda::kMatvecMaxTokens) {
    cuda::matvec(p.w, x, n, x_stride, o, out_stride, stream_.get());
  } else {
    cuda::matmul(cublas_.get(), p.w, x, n, x_stride, o, out_stride, workspace_.data() + L.mm, L.mm_bytes,
                 stream_.get());
  }
}

}  // namespace baton
