// CudaDs4Stage: the device matrices, the plan (workspace, KV streams, pinned
// io) and construction. The forward itself is in ds4_forward.cpp; the
// step driver and the decode graphs are CudaStageBase's.
#include "engine/cuda/stages/ds4.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "engine/cuda/stages/ds4_impl.h"
#include "engine/cuda/tensor_views.h"
#include "engine/gguf/file.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/tp_comm.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matmul_small.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/moe_xq.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/sampling.cuh"

namespace baton {

using cuda::MatrixView;
using A = Deepseek4Arch;

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;
// The decode attention splits a (token, head)'s rows across at most 256
// blocks (ds4_attention.cu); the planned partials cover splits x tokens <= 256,
// beyond which the kernel runs unsplit (same result).
constexpr int64_t kAttnSplitRecords = 256;

CudaDs4Stage::Mat make_mat(const Tensor& t) {
  check_decode_matrix(t);
  CudaDs4Stage::Mat m;
  m.w = matrix_view(t);
  m.xq = cuda::matvec_xq_supported(t.type) && t.ne[0] % 32 == 0;
  m.small = cuda::small_matmul_supported(m.w);
  return m;
}

// Rows [r0, r0 + n) of a matrix.
CudaDs4Stage::Mat rows_of(CudaDs4Stage::Mat m, int64_t r0, int64_t n) {
  m.w.data = static_cast<const uint8_t*>(m.w.data) + uint64_t(r0) * m.w.row_bytes;
  m.w.rows = n;
  return m;
}

// a and b as one matrix when b's rows follow a's in memory with the same
// dtype and row layout; else an absent Mat.
CudaDs4Stage::Mat joined(const CudaDs4Stage::Mat& a, const CudaDs4Stage::Mat& b) {
  const auto& x = a.w;
  const auto& y = b.w;
  if (!x.data || !y.data || x.type != y.type || x.cols != y.cols || x.row_bytes != y.row_bytes ||
      static_cast<const uint8_t*>(x.data) + uint64_t(x.rows) * x.row_bytes != y.data) {
    return {};
  }
  CudaDs4Stage::Mat m = a;
  m.w.rows = x.rows + y.rows;
  return m;
}

float clamp_of(const Deepseek4Shape& s, int layer) {
  if (s.swiglu_clamp.empty()) return INFINITY;
  const float c = s.swiglu_clamp[size_t(layer)];
  return c > 0 ? c : INFINITY;
}

}  // namespace

// ------------------------------------------------------------------ weights

CudaDs4Stage::Weights CudaDs4Stage::Weights::collect(const Model& m, const Deepseek4Shape& s, const StageConfig& c) {
  Weights w;
  if (c.embedding) {
    const Tensor& emb = *m.embedding(A::kTokenEmbd);
    w.embedding = matrix_view(emb);
    try {
      cuda::validate_matrix(w.embedding, "get_rows");
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(fmt::format("tensor {} cannot be the CUDA embedding table: {}", emb.name, e.what()));
    }
  }
  const int64_t OR = s.o_lora_rank;
  for (int l = c.first_layer; l <= c.last_layer; ++l) {
    auto t = [&](int slot) { return m.layer(l, slot); };
    Layer L;
    L.ratio = s.compress_ratio(l);
    L.indexed = s.has_indexer(l);
    for (int k = 0; k < 2; ++k) {
      L.hc_fn[k] = make_mat(*t(k ? A::kHcFfnFn : A::kHcAttnFn));
      L.hc_scale[k] = t(k ? A::kHcFfnScale : A::kHcAttnScale)->f32();
      L.hc_base[k] = t(k ? A::kHcFfnBase : A::kHcAttnBase)->f32();
      L.norm[k] = t(k ? A::kFfnNorm : A::kAttnNorm)->f32();
    }
    L.qa = make_mat(*t(A::kQA));
    L.qa_norm = t(A::kQANorm)->f32();
    L.qb = make_mat(*t(A::kQB));
    L.kv = make_mat(*t(A::kKv));
    L.kv_norm = t(A::kKvNorm)->f32();
    L.sinks = t(A::kSinks)->f32();
    const Mat out_a = make_mat(*t(A::kOutA));
    for (int g = 0; g < s.o_groups; ++g) L.out_a.push_back(rows_of(out_a, int64_t(g) * OR, OR));
    L.out_b = make_mat(*t(A::kOutB));
    L.gate_inp = make_mat(*t(A::kGateInp));
    if (s.is_hash_layer(l)) L.tid2eid = reinterpret_cast<const int32_t*>(t(A::kTid2Eid)->data);
    if (const Tensor* b = t(A::kExpProbsB)) L.exp_probs_b = b->f32();
    L.moe.gate = expert_matrix(*t(A::kGateExps));
    L.moe.up = expert_matrix(*t(A::kUpExps));
    L.moe.down = expert_matrix(*t(A::kDownExps));
    L.moe.clamp = clamp_of(s, l);
    for (const Tensor* e : {t(A::kGateExps), t(A::kUpExps), t(A::kDownExps)}) {
      if (!cuda::device_dtype_supported(e->type)) {
        throw std::runtime_error(fmt::format("tensor {} has dtype {}, which the CUDA backend has no kernel for",
                                             e->name, dtype_name(e->type)));
      }
    }
    if (s.n_expert_shared > 0) {
      L.sh_gate = make_mat(*t(A::kGateShexp));
      L.sh_up = make_mat(*t(A::kUpShexp));
      L.sh_down = make_mat(*t(A::kDownShexp));
    }
    if (L.ratio > 0) {
      L.comp_kv = make_mat(*t(A::kCompKv));
      L.comp_gate = make_mat(*t(A::kCompGate));
      L.comp_ape = matrix_view(*t(A::kCompApe));
      L.comp_norm = t(A::kCompNorm)->f32();
    }
    if (L.indexed) {
      L.idx_qb = make_mat(*t(A::kIdxQB));
      L.idx_proj = make_mat(*t(A::kIdxProj));
      L.idx_kv = make_mat(*t(A::kIdxKv));
      L.idx_gate = make_mat(*t(A::kIdxGate));
      L.idx_ape = matrix_view(*t(A::kIdxApe));
      L.idx_norm = t(A::kIdxNorm)->f32();
    }
    for (const MatrixView* ape : {&L.comp_ape, &L.idx_ape}) {
      if (ape->data && ape->type != DType::F32 && ape->type != DType::F16) {
        throw std::runtime_error(fmt::format("layer {}: the CUDA compressor takes F32 or F16 ape, not {}", l,
                                             dtype_name(ape->type)));
      }
    }
    L.out_a_all = out_a;
    L.comp_kvg = joined(L.comp_kv, L.comp_gate);
    L.idx_kvg = joined(L.idx_kv, L.idx_gate);
    L.sh_gu = joined(L.sh_gate, L.sh_up);
    w.layers.push_back(std::move(L));
  }
  if (c.head) {
    w.out_hc_fn = make_mat(*m.head(A::kOutHcFn));
    w.out_hc_scale = m.head(A::kOutHcScale)->f32();
    w.out_hc_base = m.head(A::kOutHcBase)->f32();
    w.output_norm = m.head(A::kOutputNorm)->f32();
    w.output = make_mat(*m.head(A::kOutput));
  }
  return w;
}

// ------------------------------------------------------------------ layout

CudaDs4Stage::Layout CudaDs4Stage::Layout::make(const Deepseek4Arch& arch, const StageConfig& c, const Weights& w) {
  const Deepseek4Shape& s = arch.shape();
  Layout L;
  L.E = s.n_embd;
  L.HC = s.hc_width();
  L.MIX = s.hc_mix();
  L.B = c.max_batch;
  // Logit rows: one per sequence of a batch (or every token's, all_logits).
  // A verify forward: every one of its rows.
  L.LR = c.head ? std::max({c.all_logits ? c.max_batch : int64_t(1), std::min<int64_t>(c.max_batch, c.n_seq),
                            c.verify_rows})
                : 0;
  L.V = s.n_vocab;
  L.H = s.n_head;
  L.hd = s.head_dim;
  L.HD = int64_t(s.n_head) * s.head_dim;
  L.QR = s.q_lora_rank;
  L.G = s.o_groups;
  L.OR = s.o_lora_rank;
  L.NE = s.n_expert;
  L.K = s.n_expert_used;
  L.SF = s.n_ff_exp * s.n_expert_shared;
  L.ih = s.idx_n_head;
  L.id = s.idx_head_dim;
  L.top_k = s.idx_top_k;
  L.score_stride = (c.n_ctx + Deepseek4Shape::kIndexedRatio - 1) / Deepseek4Shape::kIndexedRatio;
  const uint64_t B = uint64_t(L.B), f = 4;
  const int64_t small = std::min<int64_t>(L.B, cuda::kMatvecMaxTokens);
  const int64_t pair_rows = std::min<int64_t>(L.B, kMoePairRows);

  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t off = at;
    at = align_up(at + bytes, 256);  // cuBLAS, matmul and moe_prefill want 256-byte aligned scratch
    return off;
  };
  L.x = take(B * L.HC * f);
  L.flat = take(B * L.HC * f);
  L.mix = take(B * L.MIX * f);
  L.h = take(B * L.E * f);
  L.y = take(B * L.E * f);
  L.batch_params = 2 * L.B + 1;
  L.params = take((3 * B + 1 + uint64_t(L.batch_params)) * 4);
  L.freqs_main = take(uint64_t(s.rope_dim / 2) * f);
  L.freqs_comp = take(uint64_t(s.rope_dim / 2) * f);
  L.xq_bytes = std::max({uint64_t(small) * cuda::xq_row_bytes(align_up(std::max({L.E, L.QR, L.G * L.OR, L.SF}), 32)),
                         uint64_t(small * L.G) * cuda::xq_row_bytes(align_up(L.HD / L.G, 32)),
                         uint64_t(pair_rows) * cuda::xq_row_bytes(align_up(L.E, 32))});  // the experts' input
  L.xq = take(L.xq_bytes);
  // Attention and MoE phases share one region (each is done before the next
  // starts); the head's logits come after both.
  const uint64_t phase = at;
  int max_lanes = 0;
  bool indexed = false;
  for (int l = c.first_layer; l <= c.last_layer; ++l) {
    if (s.compress_ratio(l) > 0) max_lanes = std::max(max_lanes, s.compressor_lanes(l));
    indexed = indexed || s.has_indexer(l);
  }
  L.q_lat = take(B * L.QR * f);
  L.q = take(B * L.HD * f);
  L.att = take(B * L.HD * f);
  L.kv_new = take(B * L.hd * f);
  L.o_lat = take(B * L.G * L.OR * f);
  L.comp = take(B * 2 * uint64_t(max_lanes) * L.hd * f);
  if (indexed) {
    L.icomp = take(B * 4 * L.id * f);
    L.iq = take(B * L.ih * L.id * f);
    L.iw = take(B * L.ih * f);
    L.itop = take(B * L.top_k * 4);
    L.iscore = take(B * L.score_stride * f);
  }
  L.attn_bytes = uint64_t(kAttnSplitRecords) * L.H * (L.hd + 32) * f;
  L.attn = take(L.attn_bytes);
  const uint64_t attention_end = at;
  at = phase;
  L.router = take(B * L.NE * f);
  L.ids = take(B * L.K * 4);
  L.wts = take(B * L.K * f);
  L.shared = take(B * 2 * L.SF * f);
  L.moe_out = take(B * L.E * f);
  L.sh_out = take(B * L.E * f);
  L.offsets = take(uint64_t(L.NE + 1) * 4);
  L.sorted = take(B * L.K * 4);
  L.slot_of = take(B * L.K * 4);
  for (const auto& l : w.layers) {
    L.moe_bytes = std::max<uint64_t>(L.moe_bytes, cuda::moe_decode_workspace_bytes(l.moe, pair_rows, L.K));
    if (cuda::moe_xq_supported(l.moe)) {
      L.moe_bytes = std::max<uint64_t>(L.moe_bytes, cuda::moe_xq_workspace_bytes(l.moe, pair_rows, L.K));
    }
    if (pair_rows >= kMoeGroupedMinRows && pair_rows * L.K <= cuda::kGroupedMaxPairs &&
        !cuda::moe_xq_supported(l.moe) && cuda::moe_grouped_supported(l.moe)) {
      L.moe_bytes = std::max<uint64_t>(L.moe_bytes, cuda::moe_grouped_workspace_bytes(l.moe, pair_rows, L.K));
    }
    if (L.B > cuda::kMatvecMaxTokens) {
      L.moe_bytes = std::max<uint64_t>(L.moe_bytes, cuda::moe_prefill_workspace_bytes(l.moe, L.B, L.K));
    }
  }
  L.moe = take(L.moe_bytes);
  const uint64_t moe_end = at;
  at = std::max(attention_end, moe_end);
  L.logits = take(uint64_t(L.LR) * L.V * f);
  // A rank's head slice and the gathered blocks (nothing for a whole model).
  L.tp = s.tp_size;
  L.vocab_count = s.tp_vocab_count;
  const TpRooms rooms = tp_rooms(L.tp, L.V, L.LR, B * uint64_t(L.E));
  L.tp_mine = take(rooms.block * f);
  L.tp_all = take(uint64_t(L.tp > 1 ? L.tp : 0) * rooms.block * f);
  L.head_in = take(uint64_t(L.LR) * L.HC * f);
  L.argmax = take(uint64_t(std::max<int64_t>(L.LR, 1)) * 4);
  L.argmax_ws_bytes = cuda::argmax_workspace_bytes(L.LR);
  L.argmax_ws = take(L.argmax_ws_bytes);
  // Prefill GEMMs: x rounded to 16 bits plus a dequantized F16 tile.
  auto need = [&](const Mat& m, int64_t n) {
    if (!m.w.data || n <= cuda::kMatvecMaxTokens) return;
    if (m.small) {
      L.mm_bytes = std::max<uint64_t>(
          L.mm_bytes, cuda::small_matmul_workspace_bytes(m.w.rows, m.w.cols, std::min(n, cuda::kSmallMatmulMaxTokens)));
      if (n <= cuda::kSmallMatmulMaxTokens) return;
    }
    const uint64_t row = uint64_t(m.w.cols) * 2;
    const int64_t cap = std::max<int64_t>(64, int64_t(kMaxTileBytes / row) / 64 * 64);
    L.mm_bytes = std::max<uint64_t>(L.mm_bytes,
                                    cuda::matmul_workspace_bytes(m.w.type, m.w.cols, n, std::min(m.w.rows, cap)));
  };
  for (const auto& l : w.layers) {
    for (const Mat* m : {&l.hc_fn[0], &l.hc_fn[1], &l.qa, &l.qb, &l.kv, &l.out_b, &l.gate_inp, &l.sh_gate, &l.sh_up,
                         &l.sh_down, &l.comp_kv, &l.comp_gate, &l.idx_qb, &l.idx_proj, &l.idx_kv, &l.idx_gate}) {
      need(*m, L.B);
    }
    for (const Mat& m : l.out_a) need(m, L.B);
  }
  need(w.out_hc_fn, L.B);
  need(w.output, L.LR);
  L.mm = take(L.mm_bytes);
  L.cublas_bytes = L.B > cuda::kMatvecMaxTokens ? kCublasWorkspace : 0;
  L.cublas = take(L.cublas_bytes);
  L.bytes = at;

  uint64_t h = 0;
  auto take_h = [&](uint64_t bytes) {
    const uint64_t off = h;
    h = align_up(h + bytes, kPlanAlignment);
    return off;
  };
  L.h_params = take_h((3 * B + 1 + uint64_t(L.batch_params)) * 4);
  L.h_ids = take_h(uint64_t(std::max<int64_t>(L.LR, 1)) * 4);
  L.h_offsets = take_h(uint64_t(L.NE + 1) * 4);
  L.h_out = take_h((c.head ? uint64_t(L.LR) * L.V : B * L.HC) * f);
  L.h_in = take_h(c.embedding ? 0 : B * L.HC * f);
  L.h_tp_floats = rooms.h_tp_floats;
  L.h_tp_all_floats = rooms.h_tp_all_floats;
  L.h_tp = take_h(L.h_tp_floats * f);
  L.h_tp_all = take_h(L.h_tp_all_floats * f);
  L.io_bytes = h;

  // KV streams as KvCache lays them out: [layer][seq][stream], every stream
  // on a kPlanAlignment boundary.
  uint64_t kv_at = 0;
  for (int l = c.first_layer; l <= c.last_layer; ++l) {
    KvLayer kl;
    uint64_t off = 0;
    for (const KvStreamShape& st : arch.kv_layer_streams(l, c.n_ctx)) {
      off = align_up(off);
      kl.offset.push_back(off);
      kl.rows.push_back(st.rows);
      off += align_up(uint64_t(st.rows) * uint64_t(st.width) * 4);
    }
    kl.block = off;
    kl.base = kv_at;
    kv_at += off * uint64_t(c.n_seq);
    L.kv.push_back(std::move(kl));
  }
  L.kv_bytes = kv_at;
  const uint64_t cpu_kv = KvCache::bytes_needed(arch, {c.first_layer, c.last_layer}, c.n_seq, c.n_ctx);
  if (L.kv_bytes != cpu_kv) {
    throw std::logic_error(fmt::format("deepseek4 CUDA kv layout {} B differs from the CPU plan's {} B", L.kv_bytes,
                                       cpu_kv));
  }
  L.plan_spec(arch, c);
  return L;
}

namespace {

const Deepseek4Arch& as_ds4(const Arch& a) {
  const auto* d = dynamic_cast<const Deepseek4Arch*>(&a);
  if (!d) throw std::logic_error("CudaDs4Stage runs deepseek4 only, not '" + a.name() + "'");
  return *d;
}

void check_dims(const Deepseek4Shape& s) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("the CUDA deepseek4 stage needs " + what);
  };
  need(s.head_dim % 32 == 0 && s.head_dim <= 512, fmt::format("heads of a multiple of 32 up to 512 dims (has {})", s.head_dim));
  need(s.idx_head_dim % 32 == 0 && s.idx_head_dim <= 512,
       fmt::format("indexer keys of a multiple of 32 up to 512 dims (has {})", s.idx_head_dim));
  need(s.n_hc <= 8, fmt::format("at most 8 hyper-connection streams (has {})", s.n_hc));
  need(s.rope_dim <= 1024 && s.rope_dim % 2 == 0, "an even rope dimension up to 1024");
  need(s.n_embd % 4 == 0, "n_embd to be a multiple of 4");
  need((s.n_head * s.head_dim) % s.o_groups == 0, "heads that split evenly into output groups");
  need(s.n_expert_used <= 32 && s.n_expert <= 4096, "at most 32 of 4096 experts per token");
}

// Bytes one decode token reads: every tensor, but of the routed experts only
// the n_used of n_expert that the router picks, and one embedding row.
uint64_t ds4_decode_bytes(const WeightLayout& wl, const Deepseek4Shape& s) {
  uint64_t total = decode_weight_bytes(wl);
  for (const auto& l : wl.layers) {
    for (int slot : {A::kGateExps, A::kUpExps, A::kDownExps}) {
      const auto& e = l[size_t(slot)];
      if (e.info && !e.alias) total -= e.info->nbytes / uint64_t(s.n_expert) * uint64_t(s.n_expert - s.n_expert_used);
    }
  }
  return total;
}

MemoryPlan make_plan(const CudaDs4Stage::Layout& L, const WeightLayout& wl, const StageConfig& c,
                     const LoadOptions& load) {
  MemoryPlan plan;
  add_stage_weights_line(plan, wl, c);
  plan.add(PlanLine::KvCache, L.kv_bytes,
           fmt::format("{} layers x {} seq x {} ctx (per-layer streams, f32), device", c.last_layer - c.first_layer + 1,
                       c.n_seq, c.n_ctx));
  std::string spec;
  if (c.verify_rows > 0) {
    spec += fmt::format(", verify {} rows (checkpoint {:.1f} KiB)", c.verify_rows, double(L.rollback_bytes) / 1024.0);
  }
  if (!c.capture_layers.empty()) spec += fmt::format(", capture {} layers", c.capture_layers.size());
  plan.add(PlanLine::Workspace, L.bytes,
           fmt::format("batch {}; matmul {:.1f} MiB, experts {:.1f} MiB, cuBLAS {} MiB{}; device", L.B,
                       double(L.mm_bytes) / double(kMiB), double(L.moe_bytes) / double(kMiB), L.cublas_bytes / kMiB,
                       spec));
  add_stage_host_lines(plan, L.io_bytes, load);
  return plan;
}

}  // namespace

MemoryPlan CudaDs4Stage::plan(const GgufFile& f, const StageConfig& config, const LoadOptions& load) {
  auto arch = Arch::from_gguf(f);
  const Deepseek4Arch& ds4 = as_ds4(*arch);
  check_dims(ds4.shape());
  const StageConfig c = Stage::resolve(*arch, config);
  const WeightLayout wl = Model::plan(f, *arch, {{c.first_layer, c.last_layer}, c.embedding, c.head});
  const Model views(wl, kPlanningBase);
  const Weights w = Weights::collect(views, ds4.shape(), c);
  return make_plan(Layout::make(ds4, c, w), wl, c, load);
}

// ------------------------------------------------------------------ stage

CudaDs4Stage::CudaDs4Stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load)
    : CudaStageBase(Arch::from_gguf(f)) {
  ds4_ = &as_ds4(*arch_);
  const Deepseek4Shape& s = ds4_->shape();
  check_dims(s);
  check_tp_rank(ds4_->tp_rank(), s.tp_size, config.tp);
  config_ = Stage::resolve(*arch_, config);
  // A group of one rank has nothing to exchange: the stage runs as any
  // whole model, one graph a step.
  if (config_.tp && config_.tp->size() == 1) config_.tp = nullptr;
  for (int l = config_.first_layer; l <= config_.last_layer; ++l) {
    if (s.is_hash_layer(l) && !config_.embedding) {
      throw std::invalid_argument(fmt::format(
          "deepseek4: layer {} routes experts by token id (hash layer) and this stage has no token ids; keep layers "
          "0..{} on the first stage",
          l, s.n_hash_layers - 1));
    }
  }
  const WeightLayout wl = Model::plan(f, *arch_, {{config_.first_layer, config_.last_layer}, config_.embedding,
                                                  config_.head});
  per_token_ = ds4_decode_bytes(wl, s);
  {
    const Model views(wl, kPlanningBase);
    const Weights w = Weights::collect(views, s, config_);
    layout_ = std::make_unique<Layout>(Layout::make(*ds4_, config_, w));
  }
  plan_ = make_plan(*layout_, wl, config_, load);
  SharedLayout shared = shared_of(*layout_, layout_->HC);
  shared.negated_positions = true;  // for the inverse rotation of V (ds4_attention's rope_pos)
  shared.input_in_forward = true;
  shared.batch_params = layout_->batch_params;
  // Decode batches read each row's sequence and position from the device
  // (cuda::Ds4Rows), so one graph per batch size serves them; past
  // kMoePairRows the routed experts need the host between kernels.
  shared.batch_graph_rows = kMoePairRows;
  open_device(f, wl, shared, load);
  side_ = make_stage_stream();
  fork_ = make_stage_event();
  join_ = make_stage_event();
  w_ = std::make_unique<Weights>(Weights::collect(*model_, s, config_));

  BATON_CUDA_CHECK(cudaMemsetAsync(kv_.data(), 0, kv_.size(), stream_.get()));
  // RoPE frequencies exactly as the CPU arch forms them.
  const std::vector<float> fm = ds4_rope_freqs(int(s.rope_dim), s.rope_base, 1.0, 0, 0, 0);
  const std::vector<float> fc = ds4_rope_freqs(int(s.rope_dim), s.compress_rope_base, s.yarn_factor, s.yarn_beta_fast,
                                               s.yarn_beta_slow, s.yarn_orig_ctx);
  // On stream_, after the workspace memset open_device queued there (a plain
  // cudaMemcpy runs on the legacy stream, which a non-blocking stream does not
  // wait for); start() synchronizes before fm and fc go out of scope.
  BATON_CUDA_CHECK(cudaMemcpyAsync(workspace_.data() + layout_->freqs_main, fm.data(), fm.size() * 4,
                                   cudaMemcpyHostToDevice, stream_.get()));
  BATON_CUDA_CHECK(cudaMemcpyAsync(workspace_.data() + layout_->freqs_comp, fc.data(), fc.size() * 4,
                                   cudaMemcpyHostToDevice, stream_.get()));
  // The checkpoint's ring table (ds4_spec.cpp); layout_ keeps the host copy.
  const std::vector<cuda::RingRows>& rings = layout_->ring_rows;
  if (!rings.empty()) {
    BATON_CUDA_CHECK(cudaMemcpyAsync(workspace_.data() + layout_->rings, rings.data(),
                                     rings.size() * sizeof(cuda::RingRows), cudaMemcpyHostToDevice, stream_.get()));
  }
  start();
}

CudaDs4Stage::~CudaDs4Stage() { close(); }

float* CudaDs4Stage::kv_stream(int layer, int seq, int s) const {
  const KvLayer& k = layout_->kv[size_t(layer - config_.first_layer)];
  return reinterpret_cast<float*>(kv_.data() + k.base + uint64_t(seq) * k.block + k.offset[size_t(s)]);
}

}  // namespace baton
