// CudaDsparkDrafter: the CPU drafter's steps (engine/dspark/dspark_drafter.cpp)
// as launches. A round is at most block_size (5) rows, so every projection
// takes the decode kernels (matvec_xq on quantized activations where the
// dtype has it, else matvec) and the routed experts the pair kernels.
#include "engine/cuda/dspark_drafter.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "engine/arch/deepseek4.h"
#include "engine/dspark/dspark_device.h"
#include "engine/dspark/dspark_weights.h"
#include "engine/cuda/graph_profile.h"
#include "engine/cuda/tensor_views.h"
#include "engine/gguf/file.h"
#include "engine/runtime/backend.h"
#include "kernels/cuda/ds4_hc.cuh"
#include "kernels/cuda/ds4_norm_rope.cuh"
#include "kernels/cuda/ds4_router.cuh"
#include "kernels/cuda/ds4_attention.cuh"
#include "kernels/cuda/dspark.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_xq.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace baton {

namespace {

constexpr int64_t kFp8Block = 64;
constexpr int64_t kChunk = cuda::kMatvecMaxTokens;  // context rows per pass

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

// Byte offsets of the workspace's sections (floats unless named).
struct CudaDsparkDrafter::Impl {
  uint64_t x = 0, flat = 0, mix = 0, h = 0, y = 0, q_lat = 0, q = 0, kvb = 0, att = 0, o_lat = 0, router = 0;
  uint64_t ids = 0, wts = 0, moe_out = 0, sg = 0, su = 0, sh_out = 0, xq = 0, moe_ws = 0, moe_ws_bytes = 0;
  uint64_t hc_ws = 0, hc_ws_bytes = 0, cat = 0, hn = 0, logits = 0, bias = 0, conf = 0, prev = 0, params = 0;
  uint64_t argmax_ws = 0, argmax_ws_bytes = 0, ctx = 0, main_x = 0, freqs = 0;
  // Pinned io: the round's inputs (params[3 * rows], the bonus) and outputs
  // (conf[B], prev[B + 1], logits[B x V]); pinned, so the copies are the
  // stream's and the host does not wait on them.
  uint64_t h_params = 0, h_bonus = 0, h_conf = 0, h_prev = 0, h_logits = 0;
  cuda::Ds4HcShape hs;
};

DsparkDeviceWeights::DsparkDeviceWeights(const GgufFile& drafter_file, const DsparkShape& shape,
                                         const Tensor& embedding, const Tensor& head, const LoadOptions& load)
    : shape_(shape), embd_(embedding), out_(head) {
  const Deepseek4Shape b = shape.stage_block();
  const int64_t E = b.n_embd, V = b.n_vocab;
  for (const Tensor* t : {&embd_, &out_}) {
    if (t->ne[0] != E || t->ne[1] != V) {
      throw std::runtime_error(fmt::format("the GPU drafter needs the target's whole {} ([{}, {}]); the stage holds [{}, {}]",
                                           t->name, E, V, t->ne[0], t->ne[1]));
    }
  }
  check_decode_matrix(out_);
  make_stage_stream();  // the device's context, before the first allocation
  w_ = std::make_unique<DsparkWeights>(drafter_file, shape_, [&](const std::vector<LoadItem>& items, uint64_t bytes) {
    dev_ = DeviceBuffer(bytes, "DSpark drafter weights");
    PinnedStagingSink sink(dev_.data(), dev_.size(), load.slots, load.slot_bytes);
    load_staged(drafter_file, items, sink, load);
    return dev_.data();
  });
  const int S = shape_.n_stages;
  for (int k = 0; k < S; ++k) {
    for (const char* m : {"hc_attn_fn.weight", "hc_ffn_fn.weight", "attn_q_a.weight", "attn_q_b.weight",
                          "attn_kv.weight", "attn_output_a.weight", "attn_output_b.weight", "ffn_gate_inp.weight",
                          "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"}) {
      check_decode_matrix(w_->stage(k, m));
    }
  }
  check_decode_matrix(w_->stage(0, "main_proj.weight"));
  for (const char* m : {"hc_head_fn.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                        "confidence_head.proj.weight"}) {
    check_decode_matrix(w_->stage(S - 1, m));
  }
}

DsparkDeviceWeights::~DsparkDeviceWeights() = default;

namespace {
std::atomic<bool> g_draft_graphs{true};  // set_draft_graphs
}  // namespace

void set_draft_graphs(bool on) { g_draft_graphs.store(on); }

CudaDsparkDrafter::CudaDsparkDrafter(std::shared_ptr<const DsparkDeviceWeights> weights)
    : weights_(std::move(weights)),
      shape_(weights_->shape()),
      b_(shape_.stage_block()),
      w_(&weights_->views()),
      embd_(weights_->embedding()),
      out_(weights_->head()),
      at_(std::make_unique<Impl>()) {
  const int64_t E = b_.n_embd, V = b_.n_vocab;
  const int S = shape_.n_stages;
  use_graph_ = g_draft_graphs.load();
  stream_ = make_stage_stream();
  // The windows, then the workspace of one round.
  rows_ = shape_.kv_rows();
  const int64_t hd = b_.head_dim;
  ring_ = DeviceBuffer(uint64_t(S * rows_ * hd) * sizeof(float), "DSpark drafter windows");
  BATON_CUDA_CHECK(cudaMemset(ring_.data(), 0, ring_.size()));
  Impl& a = *at_;
  a.hs = ds4_hc_shape(b_);
  const int64_t B = shape_.block_size, HC = b_.hc_width(), MIX = b_.hc_mix(), HD = int64_t(b_.n_head) * hd;
  const int64_t QR = b_.q_lora_rank, GO = int64_t(b_.o_groups) * b_.o_lora_rank, NE = b_.n_expert;
  const int64_t K = b_.n_expert_used, SF = b_.n_ff_exp * std::max(1, b_.n_expert_shared);
  const int64_t F = shape_.feature_width(), R = shape_.markov_rank, rows = std::max<int64_t>(B, kChunk);
  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t o = at;
    at += align_up(bytes, 256);
    return o;
  };
  auto floats = [&](int64_t n) { return take(uint64_t(n) * sizeof(float)); };
  a.x = floats(B * HC);
  a.flat = floats(B * HC);
  a.mix = floats(B * MIX);
  a.h = floats(B * E);
  a.y = floats(B * E);
  a.q_lat = floats(B * QR);
  a.q = floats(B * HD);
  a.kvb = floats(rows * hd);
  a.att = floats(B * HD);
  a.o_lat = floats(B * GO);
  a.router = floats(B * NE);
  a.ids = take(uint64_t(B * K) * 4);
  a.wts = floats(B * K);
  a.moe_out = floats(B * E);
  a.sg = floats(B * SF);
  a.su = floats(B * SF);
  a.sh_out = floats(B * E);
  a.xq = take(cuda::xq_row_bytes(std::max({HC, F, HD, GO, SF, E, QR, E + R})) * uint64_t(rows));
  uint64_t moe_bytes = 0;
  for (int k = 0; k < S; ++k) {
    cuda::MoeWeights m{expert_matrix(w_->stage(k, "ffn_gate_exps.weight")), expert_matrix(w_->stage(k, "ffn_up_exps.weight")),
                       expert_matrix(w_->stage(k, "ffn_down_exps.weight")), INFINITY};
    moe_bytes = std::max<uint64_t>(moe_bytes, cuda::moe_xq_supported(m) ? cuda::moe_xq_workspace_bytes(m, B, int(K))
                                                                        : cuda::moe_decode_workspace_bytes(m, B, int(K)));
  }
  a.moe_ws_bytes = moe_bytes;
  a.moe_ws = take(moe_bytes);
  a.hc_ws_bytes = cuda::ds4_hc_pre_workspace_bytes(a.hs, B);
  a.hc_ws = take(a.hc_ws_bytes);
  a.cat = floats(B * (E + R));
  a.hn = floats(B * E);
  a.logits = floats(B * V);
  a.bias = floats(V);
  a.conf = floats(B);
  a.prev = take(uint64_t(B + 1) * 4);
  a.params = take(uint64_t(3 * rows) * 4);  // positions[rows], -positions[rows], tokens[rows]
  a.argmax_ws_bytes = cuda::argmax_workspace_bytes(1);
  a.argmax_ws = take(a.argmax_ws_bytes);
  a.ctx = floats(kChunk * F);
  a.main_x = floats(kChunk * E);
  const std::vector<float> freqs = ds4_rope_freqs(int(b_.rope_dim), shape_.rope_base, 1.0, 0, 0, 0);
  a.freqs = floats(int64_t(freqs.size()));
  ws_ = DeviceBuffer(at, "DSpark drafter workspace");
  BATON_CUDA_CHECK(cudaMemset(ws_.data(), 0, ws_.size()));  // the argmax slots start zero
  BATON_CUDA_CHECK(cudaMemcpy(ws_.data() + a.freqs, freqs.data(), freqs.size() * sizeof(float), cudaMemcpyHostToDevice));
  uint64_t io = 0;
  auto take_io = [&](uint64_t bytes) {
    const uint64_t o = io;
    io += align_up(bytes, 256);
    return o;
  };
  a.h_params = take_io(uint64_t(3 * rows) * 4);
  a.h_bonus = take_io(4);
  a.h_conf = take_io(uint64_t(B) * 4);
  a.h_prev = take_io(uint64_t(B + 1) * 4);
  a.h_logits = take_io(uint64_t(B * V) * 4);
  io_ = PinnedBuffer(io, "DSpark drafter io");
}

CudaDsparkDrafter::~CudaDsparkDrafter() {
  if (stream_) cudaStreamSynchronize(stream_.get());
}

void CudaDsparkDrafter::project(const Tensor& t, const float* x, int64_t n, int64_t x_stride, float* out,
                                int64_t out_stride) {
  const cuda::MatrixView m = matrix_view(t);
  cudaStream_t st = stream_.get();
  if (cuda::matvec_xq_supported(t.type) && m.cols % 32 == 0) {
    void* xq = ws_.data() + at_->xq;
    cuda::quantize_xq(x, m.cols, n, x_stride, xq, st);
    cuda::matvec_xq(m, xq, n, out, out_stride, st);
  } else {
    cuda::matvec(m, x, n, x_stride, out, out_stride, st);
  }
}

void CudaDsparkDrafter::append_context(const float* rows, const int64_t* positions, int64_t n) {
  const int64_t E = b_.n_embd, F = shape_.feature_width(), hd = b_.head_dim, rd = b_.rope_dim;
  check_positions(positions, n);
  const Impl& a = *at_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = ws_.data();
  const float eps = float(b_.rms_eps);
  // Only the last rows_ positions can stay in the rings.
  const int64_t skip = std::max<int64_t>(0, n - rows_);
  std::vector<int32_t> pos(static_cast<size_t>(kChunk));
  for (int64_t i0 = skip; i0 < n; i0 += kChunk) {
    const int64_t m = std::min(kChunk, n - i0), p0 = n_ctx_ + i0;
    for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = int32_t(p0 + i);
    int32_t* d_pos = reinterpret_cast<int32_t*>(ws + a.params);
    // Pageable copies: each returns once its source is read.
    BATON_CUDA_CHECK(cudaMemcpyAsync(d_pos, pos.data(), uint64_t(m) * 4, cudaMemcpyHostToDevice, st));
    BATON_CUDA_CHECK(cudaMemcpyAsync(floats_at(a.ctx), rows + i0 * F, uint64_t(m * F) * sizeof(float), cudaMemcpyHostToDevice, st));
    float* mx = floats_at(a.main_x);
    project(w_->stage(0, "main_proj.weight"), floats_at(a.ctx), m, F, mx, E);
    cuda::rmsnorm(mx, E, w_->stage(0, "main_norm.weight").f32(), mx, E, m, E, eps, st);
    for (int k = 0; k < shape_.n_stages; ++k) {
      float* kv = floats_at(a.kvb);
      project(w_->stage(k, "attn_kv.weight"), mx, m, E, kv, hd);
      cuda::ds4_norm_rope(kv, m, hd, 1, int(hd), int(rd), w_->stage(k, "attn_kv_a_norm.weight").f32(), eps, d_pos,
                          floats_at(a.freqs), st);
      cuda::dspark_fp8_round(kv, m, hd, hd - rd, kFp8Block, st);
      float* ring = reinterpret_cast<float*>(ring_.data()) + k * rows_ * hd;
      cuda::ds4_window_store(kv, m, hd, p0, ring, rows_, st);
    }
  }
  n_ctx_ += n;
  BATON_CUDA_CHECK(cudaStreamSynchronize(st));
}

void CudaDsparkDrafter::attention(int k) {
  const Impl& a = *at_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = ws_.data();
  auto t = [&](const char* rest) -> const Tensor& { return w_->stage(k, rest); };
  const int H = b_.n_head, G = b_.o_groups;
  const int64_t B = shape_.block_size, E = b_.n_embd, hd = b_.head_dim, rd = b_.rope_dim, QR = b_.q_lora_rank;
  const int64_t HD = int64_t(H) * hd, OR = b_.o_lora_rank;
  const float eps = float(b_.rms_eps);
  const int32_t* d_pos = reinterpret_cast<const int32_t*>(ws + a.params);
  const int32_t* d_neg = d_pos + std::max<int64_t>(B, kChunk);
  float *h = floats_at(a.h), *q_lat = floats_at(a.q_lat), *q = floats_at(a.q), *kvb = floats_at(a.kvb), *att = floats_at(a.att), *o_lat = floats_at(a.o_lat);
  project(t("attn_q_a.weight"), h, B, E, q_lat, QR);
  cuda::rmsnorm(q_lat, QR, t("attn_q_a_norm.weight").f32(), q_lat, QR, B, QR, eps, st);
  project(t("attn_q_b.weight"), q_lat, B, QR, q, HD);
  project(t("attn_kv.weight"), h, B, E, kvb, hd);
  cuda::Ds4NormRopeRows qr, kr;
  qr.x = q, qr.token_stride = HD, qr.n_heads = H;
  kr.x = kvb, kr.token_stride = hd, kr.n_heads = 1, kr.w = t("attn_kv_a_norm.weight").f32();
  cuda::ds4_norm_rope2(qr, kr, B, int(hd), int(rd), eps, d_pos, floats_at(a.freqs), st);
  cuda::dspark_fp8_round(kvb, B, hd, hd - rd, kFp8Block, st);
  cuda::DsparkAttentionParams p;
  p.n_head = H;
  p.head_dim = int(hd);
  p.scale = float(1.0 / std::sqrt(double(hd)));
  p.q = q;
  p.q_stride = HD;
  p.kv_new = kvb;
  p.ring = reinterpret_cast<const float*>(ring_.data()) + k * rows_ * hd;
  p.ring_rows = rows_;
  p.position = d_pos;  // the block's first position: the window ends before it
  p.window = shape_.window();
  p.sinks = t("attn_sinks.weight").f32();
  p.n_rows = B;
  p.out = att;
  p.out_stride = HD;
  cuda::dspark_attention(p, st);
  // V carried the keys' rotation: undone at the query's position.
  cuda::rope(att + hd - rd, B, HD, H, int(hd), int(rd), d_neg, floats_at(a.freqs), RopeMode::Normal, st);
  const Tensor& oa = t("attn_output_a.weight");
  const int64_t gw = HD / G;
  for (int g = 0; g < G; ++g) {
    Tensor slice = oa;
    slice.data = static_cast<const uint8_t*>(oa.data) + uint64_t(g) * uint64_t(OR) * oa.row_bytes;
    slice.ne[1] = OR;
    slice.ne[2] = slice.ne[3] = 1;
    project(slice, att + g * gw, B, HD, o_lat + g * OR, int64_t(G) * OR);
  }
  project(t("attn_output_b.weight"), o_lat, B, int64_t(G) * OR, floats_at(a.y), E);
}

void CudaDsparkDrafter::moe(int k) {
  const Impl& a = *at_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = ws_.data();
  auto t = [&](const char* rest) -> const Tensor& { return w_->stage(k, rest); };
  const int64_t B = shape_.block_size, E = b_.n_embd, SF = b_.n_ff_exp * b_.n_expert_shared;
  const int K = b_.n_expert_used;
  const float clamp = b_.swiglu_clamp.empty() || b_.swiglu_clamp[0] <= 0 ? INFINITY : b_.swiglu_clamp[0];
  float *h = floats_at(a.h), *router = floats_at(a.router), *wts = floats_at(a.wts), *out = floats_at(a.moe_out);
  int32_t* ids = reinterpret_cast<int32_t*>(ws + a.ids);
  project(t("ffn_gate_inp.weight"), h, B, E, router, b_.n_expert);
  cuda::Ds4RouterParams rp;
  rp.n_expert = b_.n_expert;
  rp.n_used = K;
  rp.norm = b_.expert_weights_norm;
  rp.scale = float(b_.expert_weights_scale);
  const Tensor* bias = w_->stage_opt(k, "exp_probs_b.bias");
  rp.bias = bias ? bias->f32() : nullptr;
  cuda::ds4_router(rp, router, B, ids, wts, st);
  const cuda::MoeWeights m{expert_matrix(t("ffn_gate_exps.weight")), expert_matrix(t("ffn_up_exps.weight")),
                           expert_matrix(t("ffn_down_exps.weight")), clamp};
  if (cuda::moe_xq_supported(m) && E % 32 == 0) {
    void* xq = ws + a.xq;
    cuda::quantize_xq(h, E, B, E, xq, st);
    cuda::moe_decode_xq(m, xq, B, ids, wts, K, out, E, ws + a.moe_ws, a.moe_ws_bytes, st);
  } else {
    cuda::moe_decode(m, h, B, E, ids, wts, K, out, E, ws + a.moe_ws, a.moe_ws_bytes, st);
  }
  const float* mix = floats_at(a.mix);
  float* x = floats_at(a.x);
  if (SF == 0) {
    cuda::ds4_hc_post(a.hs, x, out, mix, B, x, st);
    return;
  }
  float *sg = floats_at(a.sg), *su = floats_at(a.su), *sh = floats_at(a.sh_out);
  project(t("ffn_gate_shexp.weight"), h, B, E, sg, SF);
  project(t("ffn_up_shexp.weight"), h, B, E, su, SF);
  cuda::swiglu_clamped(sg, su, sg, B * SF, clamp, st);
  project(t("ffn_down_shexp.weight"), sg, B, SF, sh, E);
  cuda::ds4_hc_post_add(a.hs, x, out, sh, mix, B, x, st);
}

void CudaDsparkDrafter::stage_forward(int k) {
  const Impl& a = *at_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = ws_.data();
  auto t = [&](const char* rest) -> const Tensor& { return w_->stage(k, rest); };
  const int64_t B = shape_.block_size;
  float *x = floats_at(a.x), *mix = floats_at(a.mix), *h = floats_at(a.h);
  cuda::ds4_hc_pre(a.hs, matrix_view(t("hc_attn_fn.weight")), x, B, t("hc_attn_scale.weight").f32(),
                   t("hc_attn_base.weight").f32(), t("attn_norm.weight").f32(), mix, h, ws + a.hc_ws, a.hc_ws_bytes,
                   st);
  attention(k);
  cuda::ds4_hc_post(a.hs, x, floats_at(a.y), mix, B, x, st);
  cuda::ds4_hc_pre(a.hs, matrix_view(t("hc_ffn_fn.weight")), x, B, t("hc_ffn_scale.weight").f32(),
                   t("hc_ffn_base.weight").f32(), t("ffn_norm.weight").f32(), mix, h, ws + a.hc_ws, a.hc_ws_bytes,
                   st);
  moe(k);  // ends with the HC-post
}

// The round's launches between its input copies (positions, tokens, the
// bonus) and its output copies: nothing in them depends on the host, so
// one capture serves every round of this context.
void CudaDsparkDrafter::enqueue_round() {
  const int n = b_.n_hc;
  const int64_t B = shape_.block_size, E = b_.n_embd, HC = b_.hc_width(), V = b_.n_vocab, R = shape_.markov_rank;
  const float eps = float(b_.rms_eps);
  const Impl& a = *at_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = ws_.data();
  const int64_t rows = std::max<int64_t>(B, kChunk);
  const int32_t* d_params = reinterpret_cast<const int32_t*>(ws + a.params);
  int32_t* d_prev = reinterpret_cast<int32_t*>(ws + a.prev);
  float* x = floats_at(a.x);
  const cuda::MatrixView emb = matrix_view(embd_);
  for (int s = 0; s < n; ++s) cuda::get_rows(emb, d_params + 2 * rows, B, x + s * E, HC, st);
  for (int k = 0; k < shape_.n_stages; ++k) stage_forward(k);

  // hc_head: h_i (before the norm) into the first E floats of cat row i.
  const int last = shape_.n_stages - 1;
  auto t = [&](const char* rest) -> const Tensor& { return w_->stage(last, rest); };
  float *flat = floats_at(a.flat), *mix = floats_at(a.mix), *cat = floats_at(a.cat), *hn = floats_at(a.hn), *logits = floats_at(a.logits);
  const int64_t CW = E + R;
  cuda::rmsnorm(x, HC, nullptr, flat, HC, B, HC, eps, st);
  project(t("hc_head_fn.weight"), flat, B, HC, mix, n);
  cuda::dspark_hc_head(mix, n, x, B, n, E, t("hc_head_scale.weight").f32(), t("hc_head_base.weight").f32(),
                       float(b_.hc_eps), cat, CW, st);
  cuda::rmsnorm(cat, CW, t("norm.weight").f32(), hn, E, B, E, eps, st);
  project(out_, hn, B, E, logits, V);
  // Row by row: confidence and Markov bias from the previous token, then
  // this row's draft token (the next row's previous one).
  const cuda::MatrixView w1 = matrix_view(t("markov_head.markov_w1.weight"));
  for (int64_t r = 0; r < B; ++r) {
    float* c = cat + r * CW;
    cuda::get_rows(w1, d_prev + r, 1, c + E, CW, st);
    project(t("confidence_head.proj.weight"), c, 1, CW, floats_at(a.conf) + r, 1);
    project(t("markov_head.markov_w2.weight"), c + E, 1, CW, floats_at(a.bias), V);
    cuda::add_inplace(logits + r * V, floats_at(a.bias), V, st);
    cuda::argmax(logits + r * V, 1, V, V, d_prev + r + 1, st, ws + a.argmax_ws, a.argmax_ws_bytes);
  }
}

GraphExecHandle CudaDsparkDrafter::capture_round() {
  cudaStream_t st = stream_.get();
  BATON_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_round();
  } catch (...) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(st, &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t g = nullptr;
  BATON_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  if (err == cudaSuccess && stage_profiling()) {
    // `baton bench --profile --draft-rounds N`: where the round's time goes.
    // The round is idempotent for its inputs (copied in before the capture),
    // so the passes and the disabled-node replays leave nothing behind that
    // the round's own launch does not recompute.
    std::fprintf(stderr, "DSpark draft round, node by node:\n%s\nDSpark draft round, marginal cost of each kernel:\n%s\n",
                 cuda::profile_graph(g, exec, st, 5).c_str(), cuda::marginal_costs(g, st).c_str());
  }
  cudaGraphDestroy(g);
  BATON_CUDA_CHECK(err);
  return GraphExecHandle(exec);
}

DsparkDraft CudaDsparkDrafter::draft(int32_t bonus, int64_t pos0, float threshold, int max_tokens) {
  const int64_t B = shape_.block_size, V = b_.n_vocab;
  check_draft(bonus, pos0);
  const Impl& a = *at_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = ws_.data();
  // Positions n .. n + B - 1, their negatives, the block's tokens; prev[0] = bonus.
  // The last round's copies were waited for, so the pinned inputs are free.
  const int64_t rows = std::max<int64_t>(B, kChunk);
  uint8_t* io = io_.data();
  int32_t* params = reinterpret_cast<int32_t*>(io + a.h_params);
  std::fill(params, params + 3 * rows, 0);
  for (int64_t r = 0; r < B; ++r) {
    params[r] = int32_t(pos0 + r);
    params[rows + r] = -int32_t(pos0 + r);
    params[2 * rows + r] = r == 0 ? bonus : int32_t(shape_.noise_token_id);
  }
  *reinterpret_cast<int32_t*>(io + a.h_bonus) = bonus;
  int32_t* d_params = reinterpret_cast<int32_t*>(ws + a.params);
  int32_t* d_prev = reinterpret_cast<int32_t*>(ws + a.prev);
  BATON_CUDA_CHECK(cudaMemcpyAsync(d_params, params, uint64_t(3 * rows) * 4, cudaMemcpyHostToDevice, st));
  BATON_CUDA_CHECK(cudaMemcpyAsync(d_prev, io + a.h_bonus, 4, cudaMemcpyHostToDevice, st));
  if (use_graph_ && !round_graph_) {
    // A capture the driver refuses costs speed, not the drafts: this
    // context queues its rounds instead, and says so once.
    try {
      round_graph_ = capture_round();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "DSpark drafter: the round could not be captured as a CUDA graph (%s); queuing it\n",
                   e.what());
      use_graph_ = false;
    }
  }
  if (use_graph_) {
    BATON_CUDA_CHECK(cudaGraphLaunch(round_graph_.get(), st));
  } else {
    enqueue_round();
  }
  const int64_t limit = std::min<int64_t>(B, std::max(1, max_tokens));
  BATON_CUDA_CHECK(cudaMemcpyAsync(io + a.h_conf, floats_at(a.conf), uint64_t(B) * 4, cudaMemcpyDeviceToHost, st));
  BATON_CUDA_CHECK(cudaMemcpyAsync(io + a.h_prev, d_prev, uint64_t(B + 1) * 4, cudaMemcpyDeviceToHost, st));
  if (return_logits_) {
    BATON_CUDA_CHECK(
        cudaMemcpyAsync(io + a.h_logits, floats_at(a.logits), uint64_t(limit * V) * 4, cudaMemcpyDeviceToHost, st));
  }
  BATON_CUDA_CHECK(cudaStreamSynchronize(st));

  // The CPU drafter's stop rule over the rows computed.
  const float* conf = reinterpret_cast<const float*>(io + a.h_conf);
  const int32_t* prev = reinterpret_cast<const int32_t*>(io + a.h_prev);
  const float* lg = reinterpret_cast<const float*>(io + a.h_logits);
  DsparkDraft out;
  for (int64_t r = 0; r < limit; ++r) {
    const float c = sigmoid(conf[r]);
    out.confidence.push_back(c);
    const bool low = c < threshold;
    if (low && r > 0) break;
    out.tokens.push_back(prev[r + 1]);
    if (return_logits_) out.logits.insert(out.logits.end(), lg + r * V, lg + (r + 1) * V);
    if (low) break;
  }
  return out;
}

std::shared_ptr<const DsparkDeviceWeights> dspark_device_weights(const StageRunner& target,
                                                                 const GgufFile& drafter_file,
                                                                 const DsparkShape& shape, const LoadOptions& load) {
  const Model* m = target.device_model();
  if (!m) return nullptr;
  const Tensor* embd = m->embedding(Deepseek4Arch::kTokenEmbd);
  const Tensor* head = m->head(Deepseek4Arch::kOutput);
  if (!embd || !head) {
    throw std::runtime_error("the GPU drafter needs the target's token embedding and output head in the same stage");
  }
  return std::make_shared<const DsparkDeviceWeights>(drafter_file, shape, *embd, *head, load);
}

std::unique_ptr<DsparkNetwork> dspark_device_network(std::shared_ptr<const DsparkDeviceWeights> weights) {
  if (!weights) throw std::invalid_argument("dspark_device_network: no weights");
  return std::make_unique<CudaDsparkDrafter>(std::move(weights));
}

std::unique_ptr<DsparkNetwork> dspark_device_network(const StageRunner& target, const GgufFile& drafter_file,
                                                     const DsparkShape& shape, const LoadOptions& load) {
  std::shared_ptr<const DsparkDeviceWeights> w = dspark_device_weights(target, drafter_file, shape, load);
  return w ? dspark_device_network(std::move(w)) : nullptr;
}

}  // namespace baton
