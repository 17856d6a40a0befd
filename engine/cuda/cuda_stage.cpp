#include "engine/cuda/cuda_stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "engine/cuda/stage_ops.cuh"
#include "engine/gguf.h"
#include "engine/kv_cache.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sampling.cuh"

namespace baton {

using cuda::MatrixView;

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;
// cuBLAS and matmul() want 256-byte aligned scratch; every section is.
constexpr uint64_t kSectionAlign = 256;
// cuBLAS's scratch (cublasSetWorkspace): NVIDIA recommends 32 MiB on Hopper.
constexpr uint64_t kCublasWorkspace = 32 * kMiB;
// The F16 tile of a dequantized weight for prefill GEMMs: larger matrices are
// multiplied in row chunks that fit (docs/CUDA.md: whole 14336 x 4096
// matrices, 112 MiB, are one GEMM).
constexpr uint64_t kMaxTileBytes = 128 * kMiB;

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(fmt::format("{}: cuBLAS status {} ({})", what, int(st), cublasGetStatusString(st)));
  }
}

MatrixView matrix_of(const Tensor& t) { return {t.type, t.data, t.rows(), t.ne[0], t.row_bytes}; }

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

// Views of a layout placed at this address are never dereferenced; it only
// gives the pointers the alignment a cudaMalloc base (256 bytes) would.
const uint8_t* const kPlanningBase = reinterpret_cast<const uint8_t*>(uintptr_t(1) << 20);

}  // namespace

// ------------------------------------------------------------------ memory

DeviceBuffer::DeviceBuffer(uint64_t bytes, const char* what) : n_(bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    throw std::runtime_error(fmt::format("cuda: cannot allocate the {} line of {:.2f} MiB ({}); {:.2f} MiB free of {:.2f}",
                                         what, double(bytes) / double(kMiB), cudaGetErrorString(err),
                                         double(free_b) / double(kMiB), double(total_b) / double(kMiB)));
  }
  p_ = static_cast<uint8_t*>(p);
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}

PinnedBuffer::PinnedBuffer(uint64_t bytes, const char* what) : n_(bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(fmt::format("cuda: cannot allocate {:.2f} MiB of pinned host memory for {} ({})",
                                         double(bytes) / double(kMiB), what, cudaGetErrorString(err)));
  }
  p_ = static_cast<uint8_t*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}

PinnedStagingSink::PinnedStagingSink(uint8_t* device_dst, uint64_t dst_bytes, int slots, uint64_t slot_bytes)
    : dst_(device_dst), dst_bytes_(dst_bytes), slots_(slots), slot_bytes_(slot_bytes) {
  if (slots < 1 || slot_bytes < kDirectIoAlignment || slot_bytes % kDirectIoAlignment != 0) {
    throw std::invalid_argument(fmt::format("staging ring of {} x {} bytes: need at least one slot of a multiple of {}",
                                            slots, slot_bytes, kDirectIoAlignment));
  }
  ring_ = PinnedBuffer(uint64_t(slots) * slot_bytes, "the staging ring");
  BATON_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  done_.assign(size_t(slots), nullptr);
  pending_.assign(size_t(slots), false);
  for (auto& e : done_) BATON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

PinnedStagingSink::~PinnedStagingSink() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto e : done_) {
    if (e) cudaEventDestroy(e);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

uint8_t* PinnedStagingSink::slot(int i) {
  if (i < 0 || i >= slots_) throw std::out_of_range(fmt::format("staging slot {} of {}", i, slots_));
  return ring_.data() + uint64_t(i) * slot_bytes_;
}

void PinnedStagingSink::wait(int i) {
  if (pending_[size_t(i)]) BATON_CUDA_CHECK(cudaEventSynchronize(done_[size_t(i)]));
  pending_[size_t(i)] = false;
}

void PinnedStagingSink::copy(int i, const uint8_t* src, uint64_t dst_offset, uint64_t n) {
  const uint8_t* s = slot(i);
  if (src < s || src + n > s + slot_bytes_) throw std::out_of_range("staging copy: source outside its slot");
  if (dst_offset > dst_bytes_ || n > dst_bytes_ - dst_offset) {
    throw std::out_of_range(fmt::format("staging copy of {} bytes at {} is outside the {} byte device allocation", n,
                                        dst_offset, dst_bytes_));
  }
  BATON_CUDA_CHECK(cudaMemcpyAsync(dst_ + dst_offset, src, n, cudaMemcpyHostToDevice, stream_));
}

void PinnedStagingSink::release(int i) {
  BATON_CUDA_CHECK(cudaEventRecord(done_[size_t(i)], stream_));
  pending_[size_t(i)] = true;
}

void PinnedStagingSink::finish() { BATON_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("cuda: no usable CUDA device ({})", cudaGetErrorString(err));
  }
  if (n == 0) return "cuda: no CUDA device on this machine";
  return "";
}

// ------------------------------------------------------------------ layout

struct CudaStage::Proj {
  MatrixView w;
  bool cublas_f32 = false;  // F32 rows the matvec cannot take: a float32 cuBLAS GEMM
  bool xq = false;          // decode through the integer-dot matvec (quantized activations)
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
  MatrixView embedding{};
  const float* output_norm = nullptr;
  Proj output{};
  std::vector<Layer> layers;
  const Tensor* rope_freqs = nullptr;  // optional, the same tensor for every layer
  bool any_cublas_f32 = false;

  // From the Model's views (device pointers, or a planning base). Refuses a
  // dtype or shape the CUDA kernels cannot run, naming the tensor.
  static Weights collect(const Model& m, const LlamaHparams& hp, const StageConfig& c);
};

namespace {

using LW = LlamaFamilyArch;

CudaStage::Proj make_proj(const Tensor& t, int64_t x_stride, int64_t out_col, bool& any_f32) {
  CudaStage::Proj p;
  p.w = matrix_of(t);
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
    w.embedding = matrix_of(emb);
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

struct CudaStage::Layout {
  // Dimensions.
  int64_t E = 0, F = 0, V = 0, B = 0, L = 0;  // L: logit rows (1, or B with all_logits; 0 without the head)
  int64_t qw = 0, kw = 0, vw = 0, ow = 0, qkvw = 0;
  // Device workspace sections (byte offsets) and sizes.
  uint64_t x = 0, y = 0, xn = 0, qkv = 0, att = 0, gu = 0, ffh = 0, logits = 0, freqs = 0, params = 0, ids = 0;
  uint64_t argmax = 0, argmax_bytes = 0;  // split argmax slots (zeroed at build, left zero by each call)
  uint64_t attn = 0, attn_bytes = 0, mm = 0, mm_bytes = 0, cublas = 0, cublas_bytes = 0, bytes = 0;
  uint64_t xq = 0, xq_bytes = 0;  // quantized activations of up to kMatvecMaxTokens rows (matvec_xq)
  uint64_t params_bytes = 0;  // int32 tokens[B], positions[B], pos0
  // Pinned host io sections.
  uint64_t h_params = 0, h_ids = 0, h_out = 0, h_in = 0, io_bytes = 0;
  uint64_t kv_bytes = 0;

  static Layout make(const LlamaHparams& hp, const StageConfig& c, const Weights& w,
                     const std::vector<int64_t>& kv_widths);
};

CudaStage::Layout CudaStage::Layout::make(const LlamaHparams& hp, const StageConfig& c, const Weights& w,
                                          const std::vector<int64_t>& kv_widths) {
  Layout L;
  L.E = hp.n_embd;
  L.F = hp.n_ff;
  L.V = hp.n_vocab;
  L.B = c.max_batch;
  L.L = c.head ? (c.all_logits ? c.max_batch : 1) : 0;
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
  L.freqs = take(uint64_t(hp.rope_dim / 2) * f);
  L.params_bytes = (2 * B + 1) * sizeof(int32_t);
  L.params = take(L.params_bytes);
  L.ids = take(uint64_t(std::max<int64_t>(L.L, 1)) * sizeof(int32_t));
  L.argmax_bytes = cuda::argmax_workspace_bytes(L.L);
  L.argmax = take(L.argmax_bytes);
  // Attention splits positions across blocks (flash-decoding) for up to 256
  // query rows; decode is one token, so this is what makes it fast.
  const int64_t split_tokens = std::min<int64_t>(L.B, 256 / hp.n_head);
  L.attn_bytes = split_tokens >= 1 ? cuda::attention_workspace_bytes(split_tokens, hp.n_head, hp.head_dim_v) : 0;
  L.attn = take(L.attn_bytes);
  // Prefill GEMMs: x rounded to 16 bits plus a dequantized F16 tile.
  if (L.B > cuda::kMatvecMaxTokens) {
    auto need = [&](const Proj& p) {
      if (p.cublas_f32) return;
      const uint64_t row = uint64_t(p.w.cols) * 2;
      const int64_t cap = std::max<int64_t>(64, int64_t(kMaxTileBytes / row) / 64 * 64);
      L.mm_bytes = std::max<uint64_t>(
          L.mm_bytes, cuda::matmul_workspace_bytes(p.w.type, p.w.cols, L.B, std::min(p.w.rows, cap)));
    };
    for (const auto& l : w.layers) {
      for (const auto& p : l.qkv) need(p);
      need(l.wo);
      for (const auto& p : l.gate_up) need(p);
      need(l.down);
    }
    if (L.L > cuda::kMatvecMaxTokens) need(w.output);
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
    const int64_t rows = std::min<int64_t>(L.B, cuda::kMatvecMaxTokens);
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
  plan.add(PlanLine::Weights, wl.bytes,
           fmt::format("{} tensors, layers {}-{}{}{}, device", wl.n_tensors, c.first_layer, c.last_layer,
                       c.embedding ? " + embedding" : "", c.head ? " + head" : ""));
  plan.add(PlanLine::KvCache, L.kv_bytes,
           fmt::format("{} layers x {} seq x {} ctx x {} B, device", c.last_layer - c.first_layer + 1, c.n_seq,
                       c.n_ctx, arch.kv_bytes_per_token_per_layer()));
  plan.add(PlanLine::Workspace, L.bytes,
           fmt::format("batch {}; matmul {:.1f} MiB, cuBLAS {} MiB, attention splits {:.1f} MiB; device", L.B,
                       double(L.mm_bytes) / double(kMiB), L.cublas_bytes / kMiB, double(L.attn_bytes) / double(kMiB)));
  plan.add(PlanLine::PinnedIo, L.io_bytes, "step parameters and outputs, host");
  plan.add(PlanLine::LoadStaging, uint64_t(load.slots) * load.slot_bytes,
           fmt::format("{} x {} MiB pinned, while loading, host", load.slots, load.slot_bytes / kMiB));
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

void StreamDeleter::operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
void CublasDeleter::operator()(cublasContext* h) const { cublasDestroy(h); }
void EventDeleter::operator()(CUevent_st* e) const { cudaEventDestroy(e); }

EventHandle make_stage_event() {
  cudaEvent_t e = nullptr;
  BATON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return EventHandle(e);
}
void GraphExecDeleter::operator()(CUgraphExec_st* g) const { cudaGraphExecDestroy(g); }

StreamHandle make_stage_stream() {
  BATON_CUDA_CHECK(cudaFree(nullptr));  // the context first
  cudaStream_t s = nullptr;
  BATON_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return StreamHandle(s);
}

CublasHandle make_stage_cublas() {
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  return CublasHandle(h);
}

StageDeviceLines allocate_stage_lines(const MemoryPlan& plan, uint64_t weight_bytes, uint64_t kv_bytes,
                                      uint64_t workspace_bytes) {
  StageDeviceLines out;
  DeviceMemoryReport& m = out.report;
  int dev = 0;
  BATON_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  BATON_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  m.device = prop.name;
  size_t free0 = 0, free1 = 0, total = 0;
  BATON_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  out.weights = DeviceBuffer(weight_bytes, "weights");
  out.kv = DeviceBuffer(kv_bytes, "kv cache");
  out.workspace = DeviceBuffer(workspace_bytes, "workspace");
  BATON_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  m.planned = plan.bytes(PlanLine::Weights) + plan.bytes(PlanLine::KvCache) + plan.bytes(PlanLine::Workspace);
  m.allocated = out.weights.size() + out.kv.size() + out.workspace.size();
  m.measured = free0 > free1 ? uint64_t(free0 - free1) : 0;
  m.free_after = free1;
  m.total = total;
  return out;
}

LoadStats load_stage_weights(const GgufFile& f, const WeightLayout& wl, DeviceBuffer& weights,
                             const LoadOptions& load) {
  const uint64_t rss_before_ring = current_rss_bytes();
  PinnedStagingSink sink(weights.data(), weights.size(), load.slots, load.slot_bytes);
  LoadStats stats = load_staged(f, load_items(wl), sink, load);
  stats.rss_before = rss_before_ring;
  return stats;
}

CudaStage::CudaStage(const GgufFile& f, const StageConfig& config, const LoadOptions& load)
    : arch_(Arch::from_gguf(f)) {
  llama_ = &as_llama(*arch_);
  const LlamaHparams& hp = llama_->hparams();
  check_dims(hp);
  config_ = Stage::resolve(*arch_, config);
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
  if (std::string why = cuda_unavailable_reason(); !why.empty()) throw std::runtime_error(why);

  stream_ = make_stage_stream();
  StageDeviceLines lines = allocate_stage_lines(plan_, wl.bytes, layout_->kv_bytes, layout_->bytes);
  weights_ = std::move(lines.weights);
  kv_ = std::move(lines.kv);
  workspace_ = std::move(lines.workspace);
  memory_ = lines.report;
  io_ = PinnedBuffer(layout_->io_bytes, "the step parameters");
  load_stats_ = load_stage_weights(f, wl, weights_, load);
  if (layout_->cublas_bytes > 0) cublas_ = make_stage_cublas();  // after the load: make_stage_stream's comment
  model_ = std::make_unique<Model>(wl, weights_.data());
  w_ = std::make_unique<Weights>(Weights::collect(*model_, hp, config_));

  // Scratch starts defined (the F32 fallback and padding never read garbage).
  BATON_CUDA_CHECK(cudaMemsetAsync(workspace_.data(), 0, workspace_.size(), stream_.get()));
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
  if (cublas_) {
    // Stream first: setting it drops a workspace given before.
    check_cublas(cublasSetStream(cublas_.get(), stream_.get()), "cublasSetStream");
    check_cublas(cublasSetWorkspace(cublas_.get(), workspace_.data() + layout_->cublas, layout_->cublas_bytes),
                 "cublasSetWorkspace");
  }
  length_.assign(size_t(config_.n_seq), 0);
  std::memset(io_.data(), 0, io_.size());
  sync();
  capture_decode_graphs();
}

CudaStage::~CudaStage() {
  if (stream_) cudaStreamSynchronize(stream_.get());
  try {
    profile_decode();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode profile: %s\n", e.what());
  }
}

void CudaStage::sync() { BATON_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

void CudaStage::check_seq(int seq) const {
  if (seq < 0 || seq >= config_.n_seq) {
    throw std::out_of_range(fmt::format("sequence {} out of range (have {})", seq, config_.n_seq));
  }
}

int64_t CudaStage::position(int seq) const {
  check_seq(seq);
  return length_[size_t(seq)];
}

void CudaStage::reset(int seq) {
  check_seq(seq);
  if (seq == 0) profile_decode();
  length_[size_t(seq)] = 0;
}

// set_stage_profiling(true): sequence 0's decode profile (graph_profile.h).
void CudaStage::profile_decode() {
  if (decode_graphs_.empty()) return;
  profiler_.report(decode_graphs_[0].get(), stream_.get(), length_[0] - 1, [&] { enqueue(0, 1, 0, /*graph=*/true); });
}

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
  if (xq && p.xq && n <= cuda::kMatvecMaxTokens) {
    cuda::matvec_xq(p.w, xq, n, o, out_stride, stream_.get());
  } else if (p.cublas_f32) {
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(p.w.rows), int(n), int(p.w.cols), &one,
                             static_cast<const float*>(p.w.data), int(p.w.row_bytes / sizeof(float)), x, int(x_stride),
                             &zero, o, int(out_stride)),
                 "cublasSgemm (F32 weights)");
  } else if (n <= cuda::kMatvecMaxTokens) {
    cuda::matvec(p.w, x, n, x_stride, o, out_stride, stream_.get());
  } else {
    cuda::matmul(cublas_.get(), p.w, x, n, x_stride, o, out_stride, workspace_.data() + L.mm, L.mm_bytes,
                 stream_.get());
  }
}

void CudaStage::enqueue(int seq, int64_t n, int64_t pos0, bool graph) {
  const Layout& L = *layout_;
  const LlamaHparams& hp = llama_->hparams();
  const Weights& W = *w_;
  cudaStream_t s = stream_.get();
  uint8_t* ws = workspace_.data();
  uint8_t* io = io_.data();
  auto f = [&](uint64_t off) { return reinterpret_cast<float*>(ws + off); };
  float *x = f(L.x), *y = f(L.y), *xn = f(L.xn), *qkv = f(L.qkv), *att = f(L.att), *gu = f(L.gu), *ffh = f(L.ffh);
  const float* freqs = f(L.freqs);
  int32_t* d_tokens = reinterpret_cast<int32_t*>(ws + L.params);
  int32_t* d_positions = d_tokens + L.B;
  int32_t* d_pos0 = d_tokens + 2 * L.B;
  const int64_t E = L.E, F = L.F;
  const float eps = hp.rms_eps;
  // Quantized activations for the integer-dot matvec (decode and short
  // prompts), written by the kernel that produces each projection input.
  uint8_t* xq_buf = L.xq_bytes > 0 && n <= cuda::kMatvecMaxTokens ? ws + L.xq : nullptr;
  auto xq_for = [&](const Proj* ps, size_t count) -> uint8_t* {
    return std::any_of(ps, ps + count, [](const Proj& p) { return p.xq; }) ? xq_buf : nullptr;
  };

  BATON_CUDA_CHECK(cudaMemcpyAsync(d_tokens, io + L.h_params, L.params_bytes, cudaMemcpyHostToDevice, s));
  // Without the embedding the input rows are already in x: run() copies host
  // rows there, a link writes device rows there (device_input()). Keeping
  // that copy out of the graph lets one decode graph serve both.
  if (config_.embedding) cuda::get_rows(W.embedding, d_tokens, n, x, E, s);
  const float* pending = nullptr;  // the last projection's output, not yet added into x
  for (size_t i = 0; i < W.layers.size(); ++i) {
    const Weights::Layer& w = W.layers[i];
    const int layer = config_.first_layer + int(i);
    uint8_t* xq = xq_for(w.qkv.data(), w.qkv.size());
    cuda::add_rmsnorm(x, E, pending, E, w.attn_norm, xn, E, n, E, eps, s, xq);
    float* kc = kv_stream(layer, seq, 0);
    float* vc = kv_stream(layer, seq, 1);
    // One decode token of a plain llama layer (no biases or q/k norms,
    // interleaved RoPE pairs, integer-dot weights): RoPE and the KV append
    // run in the projection's epilogue, one launch instead of two.
    const bool fuse_rope = n == 1 && xq && !w.bq && !w.bk && !w.bv && !w.q_norm && !w.k_norm &&
                           llama_->variant().rope == RopeMode::Normal && hp.head_dim_k % 2 == 0 &&
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
    } else {
      for (const Proj& p : w.qkv) project(p, xn, xq, n, E, qkv, L.qkvw);
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
      app.pos0 = d_pos0;
      cuda::rope(qkv, n, L.qkvw, hp.n_head + hp.n_head_kv, hp.head_dim_k, hp.rope_dim, d_positions, freqs,
                 llama_->variant().rope, app, s);
    }
    cuda::AttentionParams ap;
    ap.n_head = hp.n_head;
    ap.n_head_kv = hp.n_head_kv;
    ap.head_dim_k = hp.head_dim_k;
    ap.head_dim_v = hp.head_dim_v;
    ap.scale = float(1.0 / std::sqrt(double(hp.head_dim_k)));
    ap.q = qkv;
    ap.q_stride = L.qkvw;
    ap.n_tokens = n;
    ap.pos0 = graph ? config_.n_ctx - n : pos0;
    ap.pos0_device = graph ? d_pos0 : nullptr;
    ap.k_cache = kc;
    ap.v_cache = vc;
    ap.out = att;
    ap.out_stride = L.ow;
    // The attention kernels quantize their output for the output projection.
    xq = hp.head_dim_v % 32 == 0 ? xq_for(&w.wo, 1) : nullptr;
    ap.xq = xq;
    cuda::attention(ap, ws + L.attn, L.attn_bytes, s);
    project(w.wo, att, xq, n, L.ow, y, E);
    xq = xq_for(w.gate_up.data(), w.gate_up.size());
    cuda::add_rmsnorm(x, E, y, E, w.ffn_norm, xn, E, n, E, eps, s, xq);
    for (const Proj& p : w.gate_up) project(p, xn, xq, n, E, gu, 2 * F);
    xq = xq_for(&w.down, 1);
    cuda::swiglu_rows(gu, gu + F, 2 * F, ffh, n, F, s, xq);
    project(w.down, ffh, xq, n, F, y, E);
    pending = y;
  }
  if (config_.head) {
    const int64_t rows = config_.all_logits ? n : 1;
    float* logits = f(L.logits);
    int32_t* ids = reinterpret_cast<int32_t*>(ws + L.ids);
    uint8_t* xq = xq_for(&W.output, 1);
    cuda::add_rmsnorm(x, E, pending, E, W.output_norm, xn, E, n, E, eps, s, xq);
    project(W.output, xn + (n - rows) * E, xq ? xq + uint64_t(n - rows) * cuda::xq_row_bytes(E) : nullptr, rows, E,
            logits, L.V);
    cuda::argmax(logits, rows, L.V, L.V, ids, s, ws + L.argmax, L.argmax_bytes);
    BATON_CUDA_CHECK(cudaMemcpyAsync(io + L.h_ids, ids, uint64_t(rows) * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  } else {
    cuda::add_inplace(x, pending, n * E, s);
  }
}

void CudaStage::capture_decode_graphs() {
  decode_graphs_.clear();
  for (int seq = 0; seq < config_.n_seq; ++seq) {
    cudaGraph_t g = nullptr;
    BATON_CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
    try {
      enqueue(seq, 1, 0, /*graph=*/true);
    } catch (...) {
      cudaStreamEndCapture(stream_.get(), &g);
      if (g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
      throw;
    }
    BATON_CUDA_CHECK(cudaStreamEndCapture(stream_.get(), &g));
    if (seq == 0) profiler_.keep(g);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    BATON_CUDA_CHECK(err);
    decode_graphs_.emplace_back(exec);
  }
}

void CudaStage::run(int seq, const int32_t* tokens, const float* activations, int64_t n) {
  check_seq(seq);
  const Layout& L = *layout_;
  const int64_t pos0 = length_[size_t(seq)];
  if (n < 1 || n > config_.max_batch) {
    throw std::invalid_argument(
        fmt::format("a forward takes 1..{} tokens (the planned batch), got {}; split the input", config_.max_batch, n));
  }
  if (pos0 + n > config_.n_ctx) {
    throw std::out_of_range(
        fmt::format("sequence {} would reach {} tokens; the context is {}", seq, pos0 + n, config_.n_ctx));
  }
  int32_t* hp = reinterpret_cast<int32_t*>(io_.data() + L.h_params);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens ? tokens[t] : 0;
    if (id < 0 || id >= L.V) {
      throw std::out_of_range(fmt::format("token id {} is outside the vocabulary [0, {})", id, L.V));
    }
    hp[t] = id;
    hp[L.B + t] = int32_t(pos0 + t);
  }
  hp[2 * L.B] = int32_t(pos0);
  if (activations) {
    const uint64_t bytes = uint64_t(n * L.E) * sizeof(float);
    std::memcpy(io_.data() + L.h_in, activations, bytes);
    BATON_CUDA_CHECK(cudaMemcpyAsync(workspace_.data() + L.x, io_.data() + L.h_in, bytes, cudaMemcpyHostToDevice,
                                     stream_.get()));
  }
  if (n == 1) {
    BATON_CUDA_CHECK(cudaGraphLaunch(decode_graphs_[size_t(seq)].get(), stream_.get()));
    if (seq == 0) profiler_.count_step();
  } else {
    enqueue(seq, n, pos0, /*graph=*/false);
  }
  length_[size_t(seq)] = pos0 + n;
  last_rows_ = config_.head ? (config_.all_logits ? n : 1) : n;
}

std::span<const float> CudaStage::forward(int seq, std::span<const int32_t> tokens) {
  if (!config_.embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  run(seq, tokens.data(), nullptr, int64_t(tokens.size()));
  return output_to_host();
}

std::span<const float> CudaStage::forward(int seq, std::span<const float> activations, int64_t n_tokens) {
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  const Layout& L = *layout_;
  if (n_tokens < 0 || activations.size() != uint64_t(n_tokens) * uint64_t(L.E)) {
    throw std::invalid_argument(
        fmt::format("stage input: {} floats for {} tokens of width {}", activations.size(), n_tokens, L.E));
  }
  run(seq, nullptr, activations.data(), n_tokens);
  return output_to_host();
}

std::span<const float> CudaStage::output_to_host() {
  const Layout& L = *layout_;
  const int64_t width = config_.head ? L.V : L.E;
  const uint64_t src = config_.head ? L.logits : L.x;
  BATON_CUDA_CHECK(cudaMemcpyAsync(io_.data() + L.h_out, workspace_.data() + src,
                                   uint64_t(last_rows_ * width) * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_.get()));
  sync();
  return {reinterpret_cast<const float*>(io_.data() + L.h_out), size_t(last_rows_ * width)};
}

// The boundary rows stay where the forward computes them: the residual
// stream x of the workspace (the logits on the last stage). x is also where
// a stage without the embedding starts, so device_input() hands out x
// itself: no extra buffer, no copy, and the decode graph, which reads x,
// replays unchanged.
StageRunner::DeviceRows CudaStage::device_output() const {
  if (last_rows_ == 0) return {};
  const Layout& L = *layout_;
  const int64_t width = config_.head ? L.V : L.E;
  const uint64_t src = config_.head ? L.logits : L.x;
  return {reinterpret_cast<const float*>(workspace_.data() + src), last_rows_ * width, stream_.get()};
}

float* CudaStage::device_input(int64_t n_tokens) {
  if (config_.embedding) throw std::logic_error("this stage has the embedding: it takes token ids, not device rows");
  if (n_tokens < 1 || n_tokens > config_.max_batch) {
    throw std::invalid_argument(fmt::format("device input of {} rows: a forward takes 1..{} tokens (the planned batch)",
                                            n_tokens, config_.max_batch));
  }
  // The room is x: writing it overwrites the rows of the last forward.
  if (!config_.head) last_rows_ = 0;
  return reinterpret_cast<float*>(workspace_.data() + layout_->x);
}

std::span<const float> CudaStage::forward_device_input(int seq, int64_t n_tokens) {
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  run(seq, nullptr, nullptr, n_tokens);
  return output_to_host();
}

int32_t CudaStage::forward_greedy(int seq, std::span<const int32_t> tokens) {
  if (!config_.head) throw std::logic_error("forward_greedy: this stage has no output head");
  if (!config_.embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  run(seq, tokens.data(), nullptr, int64_t(tokens.size()));
  sync();
  const int32_t* ids = reinterpret_cast<const int32_t*>(io_.data() + layout_->h_ids);
  return ids[last_rows_ - 1];
}

}  // namespace baton
