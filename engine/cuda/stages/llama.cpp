// CudaStage: the weights as the forward runs them, the plan (workspace and
// pinned io layout) and construction. The forward is llama_forward.cpp;
// memory, the step driver and the decode graphs are CudaStageBase's.
#include "engine/cuda/stages/llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "engine/cuda/stages/llama_impl.h"
#include "engine/cuda/tensor_views.h"
#include "engine/gguf/file.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/tp_comm.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matmul_small.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sampling.cuh"

namespace baton {

using cuda::MatrixView;

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;
// cuBLAS and matmul() want 256-byte aligned scratch; every section is.
constexpr uint64_t kSectionAlign = 256;

// The matvec's own preconditions on W (dtype, row length, alignment), as a
// yes/no; the message when no.
std::string matvec_refusal(const MatrixView& w) {
  try {
    cuda::validate_matrix(w, "matvec");
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

}  // namespace

// ------------------------------------------------------------------ layout

namespace {

using LW = LlamaFamilyArch;

CudaStage::Proj make_proj(const Tensor& t, int64_t x_stride, int64_t out_col, bool& any_f32) {
  CudaStage::Proj p;
  p.w = matrix_view(t);
  p.out_col = out_col;
  const std::string why = matvec_refusal(p.w);
  if (t.type == DType::F32) {
    p.cublas_f32 = !why.empty() || x_stride % 4 != 0;
    any_f32 = any_f32 || p.cublas_f32;
  } else if (!cuda::device_dtype_supported(t.type)) {
    throw std::runtime_error(fmt::format("tensor {} has dtype {}, which the CUDA backend has no kernel for", t.name,
                                         dtype_name(t.type)));
  } else if (!why.empty()) {
    throw std::runtime_error(fmt::format("tensor {} cannot run on the CUDA backend: {}", t.name, why));
  }
  p.xq = cuda::matvec_xq_supported(t.type);
  p.small = !p.cublas_f32 && cuda::small_matmul_supported(p.w);
  return p;
}

// Rows of a, b (and c) fused into one projection when they sit back to back
// in the weight buffer with one dtype and row layout: one launch and one pass
// over x instead of two or three.
bool adjacent(const std::vector<const Tensor*>& ts) {
  for (size_t i = 1; i < ts.size(); ++i) {
    const Tensor& a = *ts[i - 1];
    const Tensor& b = *ts[i];
    if (a.type != b.type || a.ne[0] != b.ne[0] || a.row_bytes != b.row_bytes || a.data + a.nbytes != b.data) {
      return false;
    }
  }
  return true;
}

std::vector<CudaStage::Proj> fused(const std::vector<const Tensor*>& ts, int64_t x_stride, bool& any_f32) {
  std::vector<CudaStage::Proj> out;
  if (adjacent(ts)) {
    Tensor all = *ts[0];
    int64_t rows = 0;
    for (const Tensor* t : ts) rows += t->rows();
    all.ne[1] = rows;
    all.ne[2] = all.ne[3] = 1;
    all.nbytes = uint64_t(rows) * all.row_bytes;
    out.push_back(make_proj(all, x_stride, 0, any_f32));
    return out;
  }
  int64_t col = 0;
  for (const Tensor* t : ts) {
    out.push_back(make_proj(*t, x_stride, col, any_f32));
    col += t->rows();
  }
  return out;
}

const float* f32_or_null(const Tensor* t) { return t ? t->f32() : nullptr; }

}  // namespace

CudaStage::Weights CudaStage::Weights::collect(const Model& m, const LlamaHparams& hp, const StageConfig& c) {
  Weights w;
  const int64_t E = hp.n_embd, F = hp.n_ff, ow = int64_t(hp.n_head) * hp.head_dim_v;
  if (c.embedding) {
    const Tensor& emb = *m.embedding(LW::kTokenEmbd);
    w.embedding = matrix_view(emb);
    if (std::string why = matvec_refusal(w.embedding); !why.empty()) {
      throw std::runtime_error(fmt::format("tensor {} cannot be the CUDA embedding table: {}", emb.name, why));
    }
  }
  for (int l = c.first_layer; l <= c.last_layer; ++l) {
    auto t = [&](int slot) { return m.layer(l, slot); };
    Layer L;
    L.attn_norm = t(LW::kAttnNorm)->f32();
    L.ffn_norm = t(LW::kFfnNorm)->f32();
    L.qkv = fused({t(LW::kWq), t(LW::kWk), t(LW::kWv)}, E, w.any_cublas_f32);
    L.wo = make_proj(*t(LW::kWo), ow, 0, w.any_cublas_f32);
    L.gate_up = fused({t(LW::kGate), t(LW::kUp)}, E, w.any_cublas_f32);
    L.down = make_proj(*t(LW::kDown), F, 0, w.any_cublas_f32);
    L.bq = f32_or_null(t(LW::kBq));
    L.bk = f32_or_null(t(LW::kBk));
    L.bv = f32_or_null(t(LW::kBv));
    L.q_norm = f32_or_null(t(LW::kQNorm));
    L.k_norm = f32_or_null(t(LW::kKNorm));
    if (const Tensor* rf = t(LW::kRopeFreqs)) w.rope_freqs = rf;
    w.layers.push_back(std::move(L));
  }
  if (c.head) {
    w.output_norm = m.head(LW::kOutputNorm)->f32();
    w.output = make_proj(*m.head(LW::kOutput), E, 0, w.any_cublas_f32);
  }
  return w;
}

CudaStage::Layout CudaStage::Layout::make(const LlamaHparams& hp, const StageConfig& c, const Weights& w,
                                          const std::vector<int64_t>& kv_widths) {
  Layout L;
  L.E = hp.n_embd;
  L.F = hp.n_ff;
  L.V = hp.n_vocab;
  L.B = c.max_batch;
  // Logit rows: one per sequence of a batch (or every token's, all_logits).
  L.L = c.head ? std::max<int64_t>(c.all_logits ? c.max_batch : 1, std::min<int64_t>(c.max_batch, c.n_seq)) : 0;
  L.qw = int64_t(hp.n_head) * hp.head_dim_k;
  L.kw = int64_t(hp.n_head_kv) * hp.head_dim_k;
  L.vw = int64_t(hp.n_head_kv) * hp.head_dim_v;
  L.ow = int64_t(hp.n_head) * hp.head_dim_v;
  L.qkvw = L.qw + L.kw + L.vw;
  const uint64_t B = uint64_t(L.B), f = sizeof(float);

  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t off = at;
    at = align_up(at + bytes, kSectionAlign);
    return off;
  };
  L.x = take(B * L.E * f);  // residual stream
  L.y = take(B * L.E * f);  // projection output added into x
  L.xn = take(B * L.E * f);
  L.qkv = take(B * L.qkvw * f);
  L.att = take(B * L.ow * f);
  L.gu = take(B * 2 * L.F * f);
  L.ffh = take(B * L.F * f);
  L.logits = take(uint64_t(L.L) * L.V * f);
  L.tp = hp.tp_size;
  L.vocab_count = hp.vocab_count;
  const TpRooms rooms = tp_rooms(L.tp, hp.n_vocab, L.L, B * uint64_t(L.E));
  L.slice = rooms.slice;
  L.tp_mine = take(rooms.block * f);
  L.tp_all = take(uint64_t(L.tp > 1 ? L.tp : 0) * rooms.block * f);
  L.freqs = take(uint64_t(hp.rope_dim / 2) * f);
  // tokens[B], positions[B], pos0, then a batch's seqs[B], out_rows[B], n_pos.
  L.batch_params = 2 * L.B + 1;
  L.params_bytes = (2 * B + 1 + uint64_t(L.batch_params)) * sizeof(int32_t);
  L.params = take(L.params_bytes);
  L.ids = take(uint64_t(std::max<int64_t>(L.L, 1)) * sizeof(int32_t));
  L.argmax_bytes = cuda::argmax_workspace_bytes(L.L);
  L.argmax = take(L.argmax_bytes);
  // Attention splits positions across blocks (flash-decoding) for up to 256
  // query rows; decode is one token, so this is what makes it fast.
  const int64_t split_tokens = std::min<int64_t>(L.B, 256 / hp.n_head);
  L.attn_bytes = split_tokens >= 1 ? cuda::attention_workspace_bytes(split_tokens, hp.n_head, hp.head_dim_v) : 0;
  L.attn = take(L.attn_bytes);
  // Prefill GEMMs: x rounded to 16 bits plus a dequantized F16 tile; and
  // small_matmul's F16 rows and partial sums from 2 rows (Q4_K) on.
  if (L.B > 1) {
    // One section serves both: batches of up to kSmallMatmulMaxTokens rows
    // through small_matmul, larger ones through matmul.
    auto need = [&](const Proj& p) {
      if (p.cublas_f32) return;
      const uint64_t row = uint64_t(p.w.cols) * 2;
      const int64_t cap = std::max<int64_t>(64, int64_t(kMaxTileBytes / row) / 64 * 64);
      if (L.B > cuda::kMatvecMaxTokens && (L.B > cuda::kSmallMatmulMaxTokens || !p.small)) {
        L.mm_bytes = std::max<uint64_t>(
            L.mm_bytes, cuda::matmul_workspace_bytes(p.w.type, p.w.cols, L.B, std::min(p.w.rows, cap)));
      }
      if (p.small) {
        L.mm_bytes = std::max<uint64_t>(
            L.mm_bytes, cuda::small_matmul_workspace_bytes(p.w.rows, p.w.cols,
                                                           std::min(L.B, cuda::kSmallMatmulMaxTokens)));
      }
    };
    for (const auto& l : w.layers) {
      for (const auto& p : l.qkv) need(p);
      need(l.wo);
      for (const auto& p : l.gate_up) need(p);
      need(l.down);
    }
    if (L.L > 1) need(w.output);
  }
  L.mm = take(L.mm_bytes);
  // One buffer serves every projection input in turn (norm output, attention
  // output, SwiGLU output): each is consumed before the next is written.
  bool any_xq = false;
  for (const auto& l : w.layers) {
    for (const auto& p : l.qkv) any_xq = any_xq || p.xq;
    for (const auto& p : l.gate_up) any_xq = any_xq || p.xq;
    any_xq = any_xq || l.wo.xq || l.down.xq;
  }
  any_xq = any_xq || (c.head && w.output.xq);
  if (any_xq && L.E % 32 == 0 && L.ow % 32 == 0 && L.F % 32 == 0) {
    const int64_t rows = std::min<int64_t>(L.B, kXqMaxRows);
    L.xq_bytes = uint64_t(rows) * cuda::xq_row_bytes(std::max({L.E, L.ow, L.F}));
  }
  L.xq = take(L.xq_bytes);
  L.cublas_bytes = L.B > cuda::kMatvecMaxTokens || w.any_cublas_f32 ? kCublasWorkspace : 0;
  L.cublas = take(L.cublas_bytes);
  L.bytes = at;

  uint64_t h = 0;
  auto take_h = [&](uint64_t bytes) {
    const uint64_t off = h;
    h = align_up(h + bytes, kPlanAlignment);
    return off;
  };
  L.h_params = take_h(L.params_bytes);
  L.h_ids = take_h(uint64_t(std::max<int64_t>(L.L, 1)) * sizeof(int32_t));
  L.h_out = take_h((c.head ? uint64_t(L.L) * L.V : B * L.E) * f);
  L.h_in = take_h(c.embedding ? 0 : B * L.E * f);
  L.h_tp_floats = rooms.h_tp_floats;
  L.h_tp_all_floats = rooms.h_tp_all_floats;
  L.h_tp = take_h(L.h_tp_floats * f);
  L.h_tp_all = take_h(L.h_tp_all_floats * f);
  L.io_bytes = h;
  L.kv_bytes = KvCache::bytes_needed({c.first_layer, c.last_layer}, c.n_seq, c.n_ctx, kv_widths);
  return L;
}

namespace {

const LlamaFamilyArch& as_llama(const Arch& a) {
  const auto* l = dynamic_cast<const LlamaFamilyArch*>(&a);
  if (!l) {
    throw std::runtime_error("the CUDA backend runs the llama family (llama, qwen2, qwen3); '" + a.name() +
                             "' is not supported on it yet");
  }
  return *l;
}

void check_dims(const LlamaHparams& hp) {
  if (hp.head_dim_k > 512 || hp.head_dim_v > 512) {
    throw std::runtime_error(fmt::format("the CUDA attention takes heads of at most 512 dims; the model has {}/{}",
                                         hp.head_dim_k, hp.head_dim_v));
  }
  if (hp.rope_dim > 1024) throw std::runtime_error(fmt::format("rope over {} dims (the CUDA rope takes 1024)", hp.rope_dim));
}

MemoryPlan make_plan(const CudaStage::Layout& L, const WeightLayout& wl, const StageConfig& c,
                     const LoadOptions& load, const Arch& arch) {
  MemoryPlan plan;
  add_stage_weights_line(plan, wl, c);
  plan.add(PlanLine::KvCache, L.kv_bytes,
           fmt::format("{} layers x {} seq x {} ctx x {} B, device", c.last_layer - c.first_layer + 1, c.n_seq,
                       c.n_ctx, arch.kv_bytes_per_token_per_layer()));
  plan.add(PlanLine::Workspace, L.bytes,
           fmt::format("batch {}; matmul {:.1f} MiB, cuBLAS {} MiB, attention splits {:.1f} MiB; device", L.B,
                       double(L.mm_bytes) / double(kMiB), L.cublas_bytes / kMiB, double(L.attn_bytes) / double(kMiB)));
  add_stage_host_lines(plan, L.io_bytes, load);
  return plan;
}

}  // namespace

MemoryPlan CudaStage::plan(const GgufFile& f, const StageConfig& config, const LoadOptions& load) {
  auto arch = Arch::from_gguf(f);
  const LlamaFamilyArch& llama = as_llama(*arch);
  check_dims(llama.hparams());
  const StageConfig c = Stage::resolve(*arch, config);
  const WeightLayout wl = Model::plan(f, *arch, {{c.first_layer, c.last_layer}, c.embedding, c.head});
  const Model views(wl, kPlanningBase);
  const Weights w = Weights::collect(views, llama.hparams(), c);
  const Layout L = Layout::make(llama.hparams(), c, w, arch->kv_stream_widths());
  return make_plan(L, wl, c, load, *arch);
}

// ------------------------------------------------------------------ stage

CudaStage::CudaStage(const GgufFile& f, const StageConfig& config, const LoadOptions& load)
    : CudaStageBase(Arch::from_gguf(f)) {
  llama_ = &as_llama(*arch_);
  const LlamaHparams& hp = llama_->hparams();
  check_dims(hp);
  check_tp_link(hp, config.tp);
  config_ = Stage::resolve(*arch_, config);
  // A group of one rank has nothing to exchange: the stage runs as any
  // whole model, one graph a step.
  if (config_.tp && config_.tp->size() == 1) config_.tp = nullptr;
  const WeightLayout wl = Model::plan(f, *arch_, {{config_.first_layer, config_.last_layer}, config_.embedding,
                                                  config_.head});
  per_token_ = decode_weight_bytes(wl);
  {
    // Plan from views at the planning base: same decisions as plan().
    const Model views(wl, kPlanningBase);
    const Weights w = Weights::collect(views, hp, config_);
    layout_ = std::make_unique<Layout>(Layout::make(hp, config_, w, arch_->kv_stream_widths()));
  }
  plan_ = make_plan(*layout_, wl, config_, load, *arch_);
  SharedLayout shared = shared_of(*layout_, layout_->E);
  shared.batch_params = layout_->batch_params;
  open_device(f, wl, shared, load);
  w_ = std::make_unique<Weights>(Weights::collect(*model_, hp, config_));

  // RoPE frequencies exactly as the CPU forms them (LlamaFamilyArch).
  std::vector<float> freqs(size_t(hp.rope_dim / 2));
  rope_inv_freq(freqs.data(), hp.rope_dim, hp.rope_base);
  for (auto& v : freqs) v = float(v / hp.rope_scale);
  if (w_->rope_freqs) {
    std::vector<float> div(freqs.size());
    BATON_CUDA_CHECK(cudaMemcpy(div.data(), w_->rope_freqs->data, div.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < freqs.size(); ++i) freqs[i] = freqs[i] / div[i];
  }
  if (!freqs.empty()) {
    BATON_CUDA_CHECK(cudaMemcpyAsync(workspace_.data() + layout_->freqs, freqs.data(), freqs.size() * sizeof(float),
                                     cudaMemcpyHostToDevice, stream_.get()));
  }
  start();
}

CudaStage::~CudaStage() { close(); }

}  // namespace baton
