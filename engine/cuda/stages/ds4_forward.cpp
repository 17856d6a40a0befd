// CudaDs4Stage's forward: the CPU arch's steps (engine/arch/deepseek4*.cpp)
// as kernel launches on the stage's stream. Per layer: HC-pre, attention,
// HC-post, HC-pre, MoE, HC-post; the HC state x stays in the workspace for
// the whole forward.
//
// A tensor-parallel rank (config_.tp, docs/TENSOR_PARALLEL.md) runs the
// same steps on its slice (its heads and output groups, its rows of every
// expert and of the shared expert, its vocabulary rows) and adds the
// group's exchanges: attn_output_b's partial rows in y and the MoE's (routed
// + shared) in moe_out are summed over the ranks in place before the HC
// post step reads them, and the head gathers every rank's logits before
// the argmax. Every rank then runs the same HC steps on the same bits.
//
// Numerics: activations and reductions are float32 as on the CPU; the
// projections of up to kMatvecMaxTokens tokens read Q8_0/Q4_K weights with
// activations quantized to 16 bits (matvec_xq, max|x| / 65024 per value)
// and other dtypes with float activations (matvec); longer batches round
// activations to F16 for cuBLAS (matmul; docs/DEEPSEEK4.md gives the
// accuracy this holds).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/runtime/backend.h"
#include "engine/cuda/stages/ds4.h"
#include "engine/cuda/stages/ds4_impl.h"
#include "engine/cuda/tensor_views.h"
#include "kernels/cuda/ds4_attention.cuh"
#include "kernels/cuda/ds4_attn_tc.cuh"
#include "kernels/cuda/ds4_compressor.cuh"
#include "kernels/cuda/ds4_grouped_matvec.cuh"
#include "kernels/cuda/ds4_hc.cuh"
#include "kernels/cuda/ds4_indexer.cuh"
#include "kernels/cuda/ds4_indexer_tc.cuh"
#include "kernels/cuda/ds4_norm_rope.cuh"
#include "kernels/cuda/ds4_router.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matmul_small.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/moe_xq.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace baton {

using A = Deepseek4Arch;

namespace {

// Long batches run the attention and the indexer scores on the tensor cores
// (ds4_attn_tc.cuh, ds4_indexer_tc.cuh) where the shape allows.
bool tc_prefill(int64_t n) { return n > cuda::kMatvecMaxTokens; }

// set_stage_profiling(true) (`baton bench --profile`): the GPU time of each phase of a prefill forward
// (batches over 8 tokens) on stderr, from events recorded between the
// phases; the forward then waits for the GPU. A diagnostic (the events are
// created once and kept); off, a phase boundary costs one branch.
enum Phase { kHc, kProj, kCompress, kIndexer, kAttn, kOutProj, kRoute, kExperts, kShared, kHead, kPhases };
const char* const kPhaseNames[kPhases] = {"hc",     "projections", "compressors", "indexer",       "attention",
                                          "output", "router",      "experts",     "shared expert", "head"};
struct PhaseTimer {
  bool on = false;
  size_t used = 0;
  std::vector<cudaEvent_t> ev;
  std::vector<int> phase;
  void mark(cudaStream_t st, int p) {
    if (used == ev.size()) {
      cudaEvent_t e;
      BATON_CUDA_CHECK(cudaEventCreate(&e));
      ev.push_back(e);
      phase.push_back(0);
    }
    phase[used] = p;
    BATON_CUDA_CHECK(cudaEventRecord(ev[used++], st));
  }
  // queued_ms: the host's time to queue the forward (launch overhead).
  void report(cudaStream_t st, int64_t n, double queued_ms) {
    BATON_CUDA_CHECK(cudaStreamSynchronize(st));
    double ms[kPhases] = {}, total = 0;
    for (size_t i = 1; i < used; ++i) {
      float t = 0;
      BATON_CUDA_CHECK(cudaEventElapsedTime(&t, ev[i - 1], ev[i]));
      ms[phase[i]] += t, total += t;
    }
    std::string line = fmt::format("ds4 forward of {} rows: {:.1f} ms (queued in {:.1f} ms);", n, total, queued_ms);
    for (int p = 0; p < kPhases; ++p) line += fmt::format(" {} {:.1f}", kPhaseNames[p], ms[p]);
    std::fprintf(stderr, "%s\n", line.c_str());
    used = 0;
  }
};
PhaseTimer& timer() {
  static PhaseTimer t;
  t.on = stage_profiling();
  return t;
}
// Whether this forward is timed: prefill forwards and batches of several
// sequences (set by run_forward; the stage's thread only).
thread_local bool t_timed = false;
void mark(cudaStream_t st, int p) {
  if (t_timed) timer().mark(st, p);
}

}  // namespace

void CudaDs4Stage::project(const Mat& m, const float* x, const void* xq, int64_t n, int64_t x_stride, float* out,
                           int64_t out_stride) {
  const Layout& L = *layout_;
  if (xq && m.xq && n <= cuda::kMatvecMaxTokens) {
    cuda::matvec_xq(m.w, xq, n, out, out_stride, stream_.get());
  } else if (n <= cuda::kMatvecMaxTokens) {
    cuda::matvec(m.w, x, n, x_stride, out, out_stride, stream_.get());
  } else if (m.small && n <= cuda::kSmallMatmulMaxTokens) {
    // A batch of 9..64 rows (several sequences' decode tokens): W read once,
    // no F16 copy of it.
    cuda::small_matmul(m.w, x, n, x_stride, out, out_stride, workspace_.data() + L.mm, L.mm_bytes, stream_.get());
  } else {
    cuda::matmul(cublas_.get(), m.w, x, n, x_stride, out, out_stride, workspace_.data() + L.mm, L.mm_bytes,
                 stream_.get());
  }
}

const void* CudaDs4Stage::quantize_for(std::initializer_list<const Mat*> mats, const float* x, int64_t width, int64_t n,
                                       int64_t x_stride) {
  if (n > cuda::kMatvecMaxTokens || width % 32 != 0) return nullptr;
  if (std::none_of(mats.begin(), mats.end(), [](const Mat* m) { return m->w.data && m->xq; })) return nullptr;
  uint8_t* xq = workspace_.data() + layout_->xq;
  cuda::quantize_xq(x, width, n, x_stride, xq, stream_.get());
  return xq;
}

void CudaDs4Stage::enqueue(int seq, int64_t n, int64_t pos0, bool graph) {
  run_forward({Chunk{seq, 0, n, pos0}}, n, config_.all_logits || call_.all_logits ? n : 1, /*batch=*/false, graph);
}

void CudaDs4Stage::enqueue_batch(int64_t n, int64_t n_out, bool graph) {
  // The rows run_batch() put in the pinned parameters: tokens[B],
  // positions[B], -positions[B], pos0, seqs[B], ...; a sequence's rows are
  // adjacent and in position order. A captured batch (graph) is one decode
  // row per sequence, whose kernels read the rows' sequences and positions
  // from the device, so the graph serves any sequences and positions.
  const int64_t B = layout_->B;
  const int32_t* hp = reinterpret_cast<const int32_t*>(io_.data() + layout_->h_params);
  const int32_t* pos = hp + B;
  const int32_t* seqs = hp + 3 * B + 1;
  std::vector<Chunk> chunks;
  for (int64_t r = 0; r < n; ++r) {
    if (chunks.empty() || chunks.back().seq != seqs[r]) chunks.push_back(Chunk{seqs[r], r, 0, pos[r]});
    ++chunks.back().n;
  }
  run_forward(chunks, n, n_out, /*batch=*/true, graph);
}

void CudaDs4Stage::run_forward(const std::vector<Chunk>& chunks, int64_t n, int64_t n_out, bool batch, bool graph) {
  t_timed = timer().on && !graph && (n > cuda::kMatvecMaxTokens || batch);
  const auto queue_start = std::chrono::steady_clock::now();
  const Layout& L = *layout_;
  const Deepseek4Shape& s = ds4_->shape();
  const Weights& W = *w_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = workspace_.data();
  auto f = [&](uint64_t off) { return reinterpret_cast<float*>(ws + off); };
  float *x = f(L.x), *flat = f(L.flat), *mix = f(L.mix), *h = f(L.h);
  int32_t* d_tokens = reinterpret_cast<int32_t*>(ws + L.params);
  const cuda::Ds4HcShape hs = ds4_hc_shape(s);
  const float eps = float(s.rms_eps);

  const std::vector<Span> spans = spans_of(chunks);
  enqueue_params();
  if (config_.embedding) {
    // Every stream starts as the token's embedding.
    for (int k = 0; k < s.n_hc; ++k) cuda::get_rows(W.embedding, d_tokens, n, x + k * L.E, L.HC, st);
  } else {
    enqueue_input_rows(n);
  }
  // Returns whether the comb weights were forked onto side_ (joined by
  // join_comb before the HC-post reads them).
  auto hc_pre = [&](const Weights::Layer& w, int k) -> bool {
    if (n <= cuda::kMatvecMaxTokens && cuda::ds4_hc_pre_split_supported(w.hc_fn[k].w.type, hs.n_embd) &&
        cuda::ds4_hc_pre_split_workspace_bytes(hs, n) <= uint64_t(L.B * L.HC) * sizeof(float)) {
      // The mix product split over ~width / 128 blocks (partials in flat,
      // unused by a decode step otherwise), then the weights and h; the
      // Sinkhorn rounds of the comb weights (one warp's dependent chain)
      // run on the side stream while the sublayer, which needs only h, runs.
      const bool defer = cuda::ds4_hc_comb_deferrable(hs);
      cuda::ds4_hc_pre_split(hs, w.hc_fn[k].w, x, n, w.hc_scale[k], w.hc_base[k], w.norm[k], mix, h, flat,
                             uint64_t(L.B * L.HC) * sizeof(float), st, defer);
      if (defer) {
        BATON_CUDA_CHECK(cudaEventRecord(fork_.get(), st));
        BATON_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), fork_.get(), 0));
        cuda::ds4_hc_comb(hs, mix, n, w.hc_scale[k], w.hc_base[k], side_.get());
        BATON_CUDA_CHECK(cudaEventRecord(join_.get(), side_.get()));
      }
      return defer;
    }
    if (n <= cuda::kMatvecMaxTokens) {
      // Float matvec on the raw state; the weights kernel applies the RMS.
      project(w.hc_fn[k], x, nullptr, n, L.HC, mix, L.MIX);
      cuda::ds4_hc_weights_input_raw(hs, mix, x, n, w.hc_scale[k], w.hc_base[k], w.norm[k], h, st);
      return false;
    }
    // cuBLAS rounds its input to F16: give it the normalised state.
    cuda::rmsnorm(x, L.HC, nullptr, flat, L.HC, n, L.HC, eps, st);
    project(w.hc_fn[k], flat, nullptr, n, L.HC, mix, L.MIX);
    cuda::ds4_hc_weights_input(hs, mix, x, n, w.hc_scale[k], w.hc_base[k], w.norm[k], h, st);
    return false;
  };
  auto join_comb = [&](bool forked) {
    if (forked) BATON_CUDA_CHECK(cudaStreamWaitEvent(st, join_.get(), 0));
  };
  mark(st, kHead);
  for (int l = config_.first_layer; l <= config_.last_layer; ++l) {
    const Weights::Layer& w = W.layers[size_t(l - config_.first_layer)];
    const bool forked_a = hc_pre(w, 0);
    mark(st, kHc);
    attention(spans, l, n, graph);
    join_comb(forked_a);
    // A rank's sums come after the join, so that the side stream is back
    // in stream_ wherever the decode graph is cut.
    if (config_.tp) tp_sum(f(L.y), size_t(n * L.E));  // its output groups' share of attn_output_b
    cuda::ds4_hc_post(hs, x, f(L.y), mix, n, x, st);
    const bool forked_f = hc_pre(w, 1);
    mark(st, kHc);
    const float* shared = moe(l, n);  // the shared expert's output when not yet added
    mark(st, kShared);
    join_comb(forked_f);
    if (config_.tp) {
      // Its slice of every expert: routed + shared, then one sum (the CPU
      // forward's order).
      if (shared) cuda::add_inplace(f(L.moe_out), shared, n * L.E, st);
      shared = nullptr;
      tp_sum(f(L.moe_out), size_t(n * L.E));
    }
    if (shared) {
      cuda::ds4_hc_post_add(hs, x, f(L.moe_out), shared, mix, n, x, st);
    } else {
      cuda::ds4_hc_post(hs, x, f(L.moe_out), mix, n, x, st);
    }
    mark(st, kHc);
    // The layer's output, for a drafter: asked for, or any single token of a
    // stage that captures (the decode graph then holds the capture, so a
    // drafting engine's plain steps replay it: ds4_spec.cpp).
    if (call_.capture || (n == 1 && !config_.capture_layers.empty())) capture_rows(l, n);
  }
  if (config_.head) head(n, n_out, batch);
  mark(st, kHead);
  if (t_timed) {
    const std::chrono::duration<double, std::milli> queued = std::chrono::steady_clock::now() - queue_start;
    timer().report(st, n, queued.count());
  }
}

std::vector<CudaDs4Stage::Span> CudaDs4Stage::spans_of(const std::vector<Chunk>& chunks) {
  // A batch's single tokens (decode rows) go through each kernel together;
  // prompt chunks one by one.
  std::vector<Span> spans;
  for (const Chunk& c : chunks) {
    const bool row = c.n == 1 && chunks.size() > 1;
    if (row && !spans.empty() && spans.back().rows && spans.back().c.r0 + spans.back().c.n == c.r0) {
      Chunk& b = spans.back().c;
      ++b.n;
      b.pos0 = std::max(b.pos0, c.pos0);
      continue;
    }
    spans.push_back({c, row});
  }
  return spans;
}

void CudaDs4Stage::attention(const std::vector<Span>& spans, int l, int64_t n, bool graph) {
  const Layout& L = *layout_;
  const Deepseek4Shape& s = ds4_->shape();
  const Weights::Layer& w = w_->layers[size_t(l - config_.first_layer)];
  cudaStream_t st = stream_.get();
  uint8_t* ws = workspace_.data();
  auto f = [&](uint64_t off) { return reinterpret_cast<float*>(ws + off); };
  const int32_t* d_pos = reinterpret_cast<const int32_t*>(ws + L.params) + L.B;
  const int32_t* d_neg = d_pos + L.B;
  const int32_t* d_pos0 = d_pos + 2 * L.B;
  // In a decode graph (one sequence) the kernels read the position from
  // d_pos0; the host value is the largest it can be, which sizes their grids.
  // Decode rows of several sequences read each row's position from d_pos;
  // in a batch graph their bound is the largest position a row can have.
  auto dev_pos0 = [&](const Span& sp) -> const int32_t* { return graph && !sp.rows ? d_pos0 : nullptr; };
  auto bound_of = [&](const Span& sp) {
    if (!graph) return sp.c.pos0;
    return sp.rows ? config_.n_ctx - 1 : config_.n_ctx - sp.c.n;
  };
  // One sequence's single token: the norm + RoPE launch stores its window row.
  const bool single = spans.size() == 1 && !spans[0].rows && n == 1;
  const float eps = float(s.rms_eps);
  const int64_t E = L.E, hd = L.hd, HD = L.HD, QR = L.QR, rd = s.rope_dim;
  const float* freqs = f(w.ratio > 0 ? L.freqs_comp : L.freqs_main);
  const float* freqs_comp = f(L.freqs_comp);
  float *h = f(L.h), *q_lat = f(L.q_lat), *q = f(L.q), *att = f(L.att), *kv_new = f(L.kv_new);

  // Every projection of h first, while the quantized h is in the xq buffer.
  const void* xh = quantize_for({&w.qa, &w.kv, &w.comp_kv, &w.comp_gate, &w.idx_kv, &w.idx_gate, &w.idx_proj}, h, E,
                                n, E);
  project(w.qa, h, xh, n, E, q_lat, QR);
  project(w.kv, h, xh, n, E, kv_new, hd);
  const int64_t cw = int64_t(s.compressor_lanes(l)) * hd;
  float* ckv = f(L.comp);
  float* cg = ckv + L.B * cw;
  // One token: adjacent pairs in one launch, outputs side by side.
  const bool one = n == 1;
  if (one && w.comp_kvg.w.data) cg = ckv + cw;
  if (w.ratio > 0) {
    if (one && w.comp_kvg.w.data) {
      project(w.comp_kvg, h, xh, n, E, ckv, 2 * cw);
    } else {
      project(w.comp_kv, h, xh, n, E, ckv, cw);
      project(w.comp_gate, h, xh, n, E, cg, cw);
    }
  }
  const int64_t id = L.id, iw2 = 2 * L.id;
  float* ikv = f(L.icomp);
  float* ig = one && w.idx_kvg.w.data ? ikv + iw2 : ikv + L.B * iw2;
  float* iwts = f(L.iw);
  if (w.indexed) {
    if (one && w.idx_kvg.w.data) {
      project(w.idx_kvg, h, xh, n, E, ikv, 2 * iw2);
    } else {
      project(w.idx_kv, h, xh, n, E, ikv, iw2);
      project(w.idx_gate, h, xh, n, E, ig, iw2);
    }
    project(w.idx_proj, h, xh, n, E, iwts, L.ih);
  }

  // Queries: normed latent (the indexer reads it too), per-head RMS, RoPE.
  const void* xl = nullptr;
  if (n <= cuda::kMatvecMaxTokens && QR % 32 == 0 && (w.qb.xq || (w.indexed && w.idx_qb.xq))) {
    // The norm and the quantization for matvec_xq in one launch.
    xl = ws + L.xq;
    cuda::add_rmsnorm(q_lat, QR, nullptr, 0, w.qa_norm, q_lat, QR, n, QR, eps, st, ws + L.xq);
  } else {
    cuda::rmsnorm(q_lat, QR, w.qa_norm, q_lat, QR, n, QR, eps, st);
  }
  project(w.qb, q_lat, xl, n, QR, q, HD);
  const int64_t window = layout_->kv[size_t(l - config_.first_layer)].rows[A::kWindow];
  const bool fuse = n <= cuda::kMatvecMaxTokens;  // decode: norm + RoPE in one launch
  if (fuse) {
    // Query heads and the shared K = V row in one launch; one token also
    // stores its row into the window ring there (the slot it takes has left
    // the window).
    cuda::Ds4NormRopeRows qr, kr;
    qr.x = q, qr.token_stride = HD, qr.n_heads = int(L.H);
    kr.x = kv_new, kr.token_stride = hd, kr.n_heads = 1, kr.w = w.kv_norm;
    if (single) kr.ring = kv_stream(l, spans[0].c.seq, A::kWindow), kr.window = window;
    cuda::ds4_norm_rope2(qr, kr, n, int(hd), int(rd), eps, d_pos, freqs, st);
  } else {
    cuda::rmsnorm(q, hd, nullptr, q, hd, n * L.H, hd, eps, st);
    cuda::rope(q + hd - rd, n, HD, int(L.H), int(hd), int(rd), d_pos, freqs, RopeMode::Normal, st);
    // The shared K = V row.
    cuda::rmsnorm(kv_new, hd, w.kv_norm, kv_new, hd, n, hd, eps, st);
    cuda::rope(kv_new + hd - rd, n, hd, 1, int(hd), int(rd), d_pos, freqs, RopeMode::Normal, st);
  }

  mark(st, kProj);
  // The indexer's queries and weights are row-wise: all rows at once.
  const float iscale = float(1.0 / std::sqrt(double(id) * double(L.ih)));
  float* iq = f(L.iq);
  if (w.indexed) {
    project(w.idx_qb, q_lat, xl, n, QR, iq, L.ih * id);
    cuda::rope(iq + id - rd, n, L.ih * id, int(L.ih), int(id), int(rd), d_pos, freqs_comp, RopeMode::Normal, st);
    if (!fuse) cuda::ds4_scale(iwts, n * L.ih, iscale, st);  // decode: applied as the indexer reads w
  }
  // The rest reads and writes each sequence's own streams, span by span.
  const int32_t* d_seqs = d_pos0 + 1;
  const KvLayer& kvl = layout_->kv[size_t(l - config_.first_layer)];
  for (const Span& sp : spans) {
    const Chunk& c = sp.c;
    const int64_t r = c.r0, nc = c.n, bound = bound_of(sp);
    const int32_t* P = dev_pos0(sp);
    cuda::Ds4Rows rows;
    if (sp.rows) rows = {d_seqs + r, d_pos + r, int64_t(kvl.block / sizeof(float))};
    const int seq = sp.rows ? 0 : c.seq;  // rows: sequence 0's streams, offset per row
    float* ring = kv_stream(l, seq, A::kWindow);
    // One compressor step; the attention's rows and the indexer's differ only
    // in their lanes, width, projections and KV streams.
    auto compress = [&](int lanes, int64_t dim, const float* kv, const float* gate, int64_t stride,
                        const cuda::MatrixView& ape, const float* norm, int state_stream, int rows_stream) {
      cuda::Ds4CompressParams cp;
      cp.ratio = w.ratio;
      cp.lanes = lanes;
      cp.dim = dim;
      cp.rope_dim = int(rd);
      cp.eps = eps;
      cp.kv = kv + r * stride;
      cp.gate = gate + r * stride;
      cp.stride = stride;
      cp.ape = ape;
      cp.norm = norm;
      cp.inv_freq = freqs_comp;
      cp.state = kv_stream(l, seq, state_stream);
      cp.rows = kv_stream(l, seq, rows_stream);
      cp.pos0 = bound;
      cp.n_tokens = nc;
      cp.pos0_dev = P;
      cp.batch = rows;
      cuda::ds4_compress(cp, st);
    };
    if (w.ratio > 0) {
      compress(s.compressor_lanes(l), hd, ckv, cg, cw, w.comp_ape, w.comp_norm, A::kCompState, A::kCompRows);
    }
    mark(st, kCompress);
    int32_t* itop = reinterpret_cast<int32_t*>(ws + L.itop) + r * L.top_k;
    if (w.indexed) {
      compress(2, id, ikv, ig, iw2, w.idx_ape, w.idx_norm, A::kIdxState, A::kIdxRows);
      cuda::Ds4IndexerParams ip;
      ip.n_head = int(L.ih);
      ip.head_dim = int(id);
      ip.ratio = w.ratio;
      ip.top_k = int(L.top_k);
      ip.q = iq + r * L.ih * id;
      ip.w = iwts + r * L.ih;
      ip.w_scale = fuse ? iscale : 1.0f;
      ip.rows = kv_stream(l, seq, A::kIdxRows);
      ip.batch = rows;
      ip.pos0 = bound;
      ip.n_tokens = nc;
      ip.scores = f(L.iscore) + r * L.score_stride;
      ip.score_stride = L.score_stride;
      ip.itop = itop;
      ip.pos0_dev = P;
      if (!sp.rows && tc_prefill(nc) && cuda::ds4_indexer_scores_tc_supported(ip)) {
        cuda::ds4_indexer_scores_tc(ip, st);
        cuda::ds4_indexer_topk(ip, st);
      } else {
        cuda::ds4_indexer_select(ip, st);
      }
    }
    mark(st, kIndexer);

    // Attention over the window rows and the visible compressed rows.
    cuda::Ds4AttentionParams ap;
    ap.n_head = int(L.H);
    ap.head_dim = int(hd);
    ap.scale = float(1.0 / std::sqrt(double(hd)));
    ap.q = q + r * HD;
    ap.q_stride = HD;
    ap.kv_new = kv_new + r * hd;
    ap.ring = ring;
    ap.window = window;
    ap.comp_rows = w.ratio > 0 ? kv_stream(l, seq, A::kCompRows) : nullptr;
    ap.ratio = w.ratio;
    ap.itop = w.indexed ? itop : nullptr;
    ap.top_k = int(L.top_k);
    ap.sinks = w.sinks;
    ap.pos0 = bound;
    ap.n_tokens = nc;
    ap.out = att + r * HD;
    ap.out_stride = HD;
    ap.pos0_dev = P;
    ap.batch = rows;
    const bool tc = !sp.rows && tc_prefill(nc) && cuda::ds4_attention_tc_supported(ap);
    if (tc) {
      cuda::ds4_attention_tc(ap, st);  // long chunks: per-token products on the tensor cores
    } else {
      // V carried the keys' rotation: undone at the query's position by the
      // kernel that writes the output.
      ap.rope_pos = d_neg + r;
      ap.rope_freq = freqs;
      ap.rope_dim = int(rd);
      cuda::ds4_attention(ap, ws + L.attn, L.attn_bytes, st);
    }
    // A single decode token (every decode graph) was stored by the norm + RoPE launch.
    if (sp.rows) {
      cuda::ds4_window_store_rows(kv_new + r * hd, nc, hd, rows, ring, window, st);
    } else if (!single) {
      cuda::ds4_window_store(kv_new + r * hd, nc, hd, c.pos0, ring, window, st);
    }
    // V carried the keys' rotation: undo it at the query's position.
    if (tc) {
      cuda::rope(att + r * HD + hd - rd, nc, HD, int(L.H), int(hd), int(rd), d_neg + r, freqs, RopeMode::Normal, st);
    }
    mark(st, kAttn);
  }

  // Grouped output: group g's heads through its o_lora_rank rows of output_a.
  const int64_t gw = HD / L.G, GO = L.G * L.OR;
  float* o_lat = f(L.o_lat);
  if (n <= kOutAXqMaxRows && gw % 32 == 0 && w.out_a_all.xq &&
      cuda::ds4_grouped_matvec_xq_supported(w.out_a_all.w, L.G)) {
    // Decode steps and short batches, 8 rows at a time: each row's G slices
    // quantized as G rows; each group's rows of output_a against its own
    // slice of every row, all groups in one launch, written straight into
    // o_lat (group g at g * OR). The float matvec one group at a time
    // costs 5.6 ms of an 8-row Flash step on the H200 (docs/DEEPSEEK4.md).
    uint8_t* xq = ws + L.xq;
    for (int64_t r0 = 0; r0 < n; r0 += cuda::kMatvecMaxTokens) {
      const int64_t nr = std::min<int64_t>(cuda::kMatvecMaxTokens, n - r0);
      cuda::quantize_xq(att + r0 * HD, gw, nr * L.G, gw, xq, st);
      cuda::ds4_grouped_matvec_xq(w.out_a_all.w, L.G, xq, nr, o_lat + r0 * GO, GO, st);
    }
  } else if (n == 1 && w.out_a[0].xq && gw % 32 == 0) {
    uint8_t* xq = ws + L.xq;
    cuda::quantize_xq(att, gw, L.G, gw, xq, st);
    for (int64_t g = 0; g < L.G; ++g) {
      cuda::matvec_xq(w.out_a[size_t(g)].w, xq + uint64_t(g) * cuda::xq_row_bytes(gw), 1, o_lat + g * L.OR, GO, st);
    }
  } else {
    for (int64_t g = 0; g < L.G; ++g) project(w.out_a[size_t(g)], att + g * gw, nullptr, n, HD, o_lat + g * L.OR, GO);
  }
  const void* xo = quantize_for({&w.out_b}, o_lat, GO, n, GO);
  project(w.out_b, o_lat, xo, n, GO, f(L.y), E);
  mark(st, kOutProj);
}

const float* CudaDs4Stage::moe(int l, int64_t n) {
  const Layout& L = *layout_;
  const Deepseek4Shape& s = ds4_->shape();
  const Weights::Layer& w = w_->layers[size_t(l - config_.first_layer)];
  cudaStream_t st = stream_.get();
  uint8_t* ws = workspace_.data();
  auto f = [&](uint64_t off) { return reinterpret_cast<float*>(ws + off); };
  const int64_t E = L.E, SF = L.SF;
  float *h = f(L.h), *router = f(L.router), *wts = f(L.wts), *out = f(L.moe_out);
  int32_t* ids = reinterpret_cast<int32_t*>(ws + L.ids);

  const void* xh = quantize_for({&w.gate_inp, &w.sh_gate, &w.sh_up}, h, E, n, E);
  project(w.gate_inp, h, xh, n, E, router, L.NE);
  cuda::Ds4RouterParams rp;
  rp.n_expert = int(L.NE);
  rp.n_used = int(L.K);
  rp.norm = s.expert_weights_norm;
  rp.scale = float(s.expert_weights_scale);
  rp.bias = w.exp_probs_b;
  if (w.tid2eid) {
    rp.tokens = reinterpret_cast<const int32_t*>(ws + L.params);
    rp.tid2eid = w.tid2eid;
    rp.n_vocab = L.V;
  }
  cuda::ds4_router(rp, router, n, ids, wts, st);

  const bool xq_pairs = cuda::moe_xq_supported(w.moe) && E % 32 == 0;
  if (!xq_pairs && n >= kMoeGroupedMinRows && n <= kMoePairRows && n * L.K <= cuda::kGroupedMaxPairs &&
      cuda::moe_grouped_supported(w.moe) && L.moe_bytes >= cuda::moe_grouped_workspace_bytes(w.moe, n, int(L.K))) {
    // Each touched expert once for all of its rows, on the tensor cores (the
    // pairs grouped on the device, no host round trip): faster than the float
    // pair kernel from kMoeGroupedMinRows rows.
    mark(st, kRoute);
    const void* xe = xh;
    if (xe == nullptr) {
      cuda::quantize_xq(h, E, n, E, ws + L.xq, st);
      xe = ws + L.xq;
    }
    cuda::moe_grouped(w.moe, xe, n, ids, wts, int(L.K), out, E, ws + L.moe, L.moe_bytes, st);
    mark(st, kExperts);
  } else if (n <= kMoePairRows && xq_pairs &&
      L.moe_bytes >= cuda::moe_xq_workspace_bytes(w.moe, n, int(L.K))) {
    // Integer-dot experts on the quantized h (the shared expert's, when there is one).
    const void* xe = xh;
    if (xe == nullptr) {
      cuda::quantize_xq(h, E, n, E, ws + L.xq, st);
      xe = ws + L.xq;
    }
    mark(st, kRoute);
    cuda::moe_decode_xq(w.moe, xe, n, ids, wts, int(L.K), out, E, ws + L.moe, L.moe_bytes, st);
    mark(st, kExperts);
  } else if (n <= kMoePairRows && L.moe_bytes >= cuda::moe_decode_workspace_bytes(w.moe, n, int(L.K))) {
    mark(st, kRoute);
    cuda::moe_decode(w.moe, h, n, E, ids, wts, int(L.K), out, E, ws + L.moe, L.moe_bytes, st);
    mark(st, kExperts);
  } else {
    // Grouped GEMMs: the group sizes come back to the host first.
    cuda::MoeGroups g;
    g.offsets = reinterpret_cast<int32_t*>(ws + L.offsets);
    g.sorted = reinterpret_cast<int32_t*>(ws + L.sorted);
    g.slot_of = reinterpret_cast<int32_t*>(ws + L.slot_of);
    cuda::moe_group(ids, n, int(L.K), L.NE, g, st);
    int32_t* host_offsets = reinterpret_cast<int32_t*>(io_.data() + L.h_offsets);
    BATON_CUDA_CHECK(cudaMemcpyAsync(host_offsets, g.offsets, uint64_t(L.NE + 1) * 4, cudaMemcpyDeviceToHost, st));
    sync();
    mark(st, kRoute);
    cuda::moe_prefill(cublas_.get(), w.moe, h, n, E, g, host_offsets, wts, int(L.K), out, E, ws + L.moe, L.moe_bytes,
                      st);
    mark(st, kExperts);
  }
  if (SF == 0) return nullptr;
  float* sg = f(L.shared);
  float* su = sg + L.B * SF;
  if (n == 1 && w.sh_gu.w.data) {
    su = sg + SF;
    project(w.sh_gu, h, xh, n, E, sg, 2 * SF);
  } else {
    project(w.sh_gate, h, xh, n, E, sg, SF);
    project(w.sh_up, h, xh, n, E, su, SF);
  }
  const bool fuse = n <= cuda::kMatvecMaxTokens;  // decode: fewer launches, same arithmetic
  const void* xs = nullptr;
  if (fuse && w.sh_down.xq && SF % 32 == 0) {
    // The activation and its quantization in one launch (gate and up rows
    // are SF apart in both layouts above).
    xs = ws + L.xq;
    cuda::ds4_swiglu_xq_clamped(sg, su, sg, SF, n, w.moe.clamp, ws + L.xq, st);
  } else {
    cuda::swiglu_clamped(sg, su, sg, n * SF, w.moe.clamp, st);
    xs = quantize_for({&w.sh_down}, sg, SF, n, SF);
  }
  float* sh = f(L.sh_out);
  project(w.sh_down, sg, xs, n, SF, sh, E);
  if (fuse) return sh;  // added by the HC-post that reads out
  cuda::add_inplace(out, sh, n * E, st);
  return nullptr;
}

void CudaDs4Stage::head(int64_t n, int64_t n_out, bool batch) {
  const Layout& L = *layout_;
  const Deepseek4Shape& s = ds4_->shape();
  const Weights& W = *w_;
  cudaStream_t st = stream_.get();
  uint8_t* ws = workspace_.data();
  auto f = [&](uint64_t off) { return reinterpret_cast<float*>(ws + off); };
  const int64_t rows = n_out;
  if (rows == 0) return;  // a batch of prompt chunks that are not yet done
  const float* xr = f(L.x) + (n - rows) * L.HC;
  if (batch) {
    // The rows that ask for logits (out_rows), gathered.
    const int32_t* out_rows = reinterpret_cast<const int32_t*>(ws + L.params) + 4 * L.B + 1;
    float* g = f(L.head_in);
    cuda::get_rows({DType::F32, f(L.x), n, L.HC, uint64_t(L.HC) * sizeof(float)}, out_rows, rows, g, L.HC, st);
    xr = g;
  }
  float *flat = f(L.flat), *mix = f(L.mix), *h = f(L.h), *logits = f(L.logits);
  cuda::rmsnorm(xr, L.HC, nullptr, flat, L.HC, rows, L.HC, float(s.rms_eps), st);
  project(W.out_hc_fn, flat, nullptr, rows, L.HC, mix, L.MIX);
  cuda::ds4_head_input(ds4_hc_shape(s), mix, L.MIX, xr, rows, W.out_hc_scale, W.out_hc_base, W.output_norm, h, st);
  const void* xq = quantize_for({&W.output}, h, L.E, rows, L.E);
  // A rank projects its vocabulary rows apart, then gathers every rank's.
  const bool tp = config_.tp != nullptr;
  float* out = tp ? f(L.tp_mine) : logits;
  project(W.output, h, xq, rows, L.E, out, tp ? L.vocab_count : L.V);
  if (tp) tp_gather_logits(out, f(L.tp_all), rows, logits);
  int32_t* ids = reinterpret_cast<int32_t*>(ws + L.argmax);
  cuda::argmax(logits, rows, L.V, L.V, ids, st, ws + L.argmax_ws, L.argmax_ws_bytes);
  BATON_CUDA_CHECK(cudaMemcpyAsync(io_.data() + L.h_ids, ids, uint64_t(rows) * 4, cudaMemcpyDeviceToHost, st));
}

}  // namespace baton
