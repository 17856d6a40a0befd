#include "engine/cuda/stage_base.h"
#include "engine/model/layer_range_text.h"
#include "engine/runtime/tp_comm.h"
#include "engine/tp/slice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace baton {

void add_stage_weights_line(MemoryPlan& plan, const WeightLayout& wl, const StageConfig& c) {
  plan.add(PlanLine::Weights, wl.bytes,
           fmt::format("{} tensors, layers {}{}{}, device", wl.n_tensors, layer_range_text(c.first_layer, c.last_layer),
                       c.embedding ? " + embedding" : "", c.head ? " + head" : ""));
}

void add_stage_host_lines(MemoryPlan& plan, uint64_t io_bytes, const LoadOptions& load) {
  constexpr uint64_t kMiB = uint64_t(1) << 20;
  plan.add(PlanLine::PinnedIo, io_bytes, "step parameters and outputs, host");
  plan.add(PlanLine::LoadStaging, uint64_t(load.slots) * load.slot_bytes,
           fmt::format("{} x {} MiB pinned, while loading, host", load.slots, load.slot_bytes / kMiB));
}

CudaStageBase::CudaStageBase(std::unique_ptr<Arch> arch) : arch_(std::move(arch)) {}

CudaStageBase::~CudaStageBase() = default;

void CudaStageBase::open_device(const GgufFile& f, const WeightLayout& wl, const SharedLayout& layout,
                                const LoadOptions& load) {
  shared_ = layout;
  if (std::string why = cuda_unavailable_reason(); !why.empty()) throw std::runtime_error(why);
  stream_ = make_stage_stream();
  StageDeviceLines lines = allocate_stage_lines(plan_, wl.bytes, layout.kv_bytes, layout.workspace_bytes);
  weights_ = std::move(lines.weights);
  kv_ = std::move(lines.kv);
  workspace_ = std::move(lines.workspace);
  memory_ = lines.report;
  io_ = PinnedBuffer(layout.io_bytes, "the step parameters");
  load_stats_ = load_stage_weights(f, wl, weights_, load);
  if (layout.cublas_bytes > 0) {
    cublas_ = make_stage_cublas();
    check_cublas(cublasSetStream(cublas_.get(), stream_.get()), "cublasSetStream");
    check_cublas(cublasSetWorkspace(cublas_.get(), workspace_.data() + layout.cublas, layout.cublas_bytes),
                 "cublasSetWorkspace");
  }
  model_ = std::make_unique<Model>(wl, weights_.data());
  BATON_CUDA_CHECK(cudaMemsetAsync(workspace_.data(), 0, workspace_.size(), stream_.get()));
}

void CudaStageBase::start() {
  length_.assign(size_t(config_.n_seq), 0);
  forwards_.assign(size_t(config_.n_seq), 0);
  std::memset(io_.data(), 0, io_.size());
  sync();
  capture_decode_graphs();
}

void CudaStageBase::close() noexcept {
  if (stream_) cudaStreamSynchronize(stream_.get());
  try {
    profile_decode();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode profile: %s\n", e.what());
  }
}

void CudaStageBase::sync() { BATON_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

void CudaStageBase::check_seq(int seq) const {
  if (seq < 0 || seq >= config_.n_seq) {
    throw std::out_of_range(fmt::format("sequence {} out of range (have {})", seq, config_.n_seq));
  }
}

int64_t CudaStageBase::position(int seq) const {
  check_seq(seq);
  return length_[size_t(seq)];
}

// Every read of the KV cache is of positions this sequence wrote (deepseek4's
// window ring and compressor states hold only its latest tokens), so
// forgetting the length is a full reset.
void CudaStageBase::reset(int seq) {
  check_seq(seq);
  if (seq == 0) profile_decode();
  length_[size_t(seq)] = 0;
}

// The prefix cache keeps the first n positions. Every kernel reads a
// sequence's K/V rows only below the position of the row it computes
// (row_pos, pos0 + t), which comes from length_ through the step
// parameters, so lowering the length is the whole truncation: the rows past
// it are overwritten by the next forward before anything reads them.
// StageRunner::truncate has checked n against the architecture.
void CudaStageBase::set_position(int seq, int64_t n) {
  check_seq(seq);
  if (n < 0 || n > length_[size_t(seq)]) {
    throw std::out_of_range(fmt::format("sequence {} holds {} positions; cannot keep {}", seq, length_[size_t(seq)], n));
  }
  length_[size_t(seq)] = n;
}

// set_stage_profiling(true): sequence 0's decode profile (graph_profile.h).
// A tensor-parallel step is a chain of graphs with host calls between: the
// profiler's re-captures of one step do not apply, so it stays off there.
void CudaStageBase::profile_decode() {
  if (decode_graphs_.empty() || config_.tp) return;
  profiler_.report(decode_graphs_[0].parts[0].get(), stream_.get(), length_[0] - 1,
                   [&] { enqueue(0, 1, 0, /*graph=*/true); });
}

// A forward that forks onto another stream (deepseek4's side stream) joins
// it back before it returns, so that stream is part of the capture and
// of the graph.
void CudaStageBase::capture_decode_graphs() {
  decode_graphs_.clear();
  for (int seq = 0; seq < config_.n_seq; ++seq) {
    decode_graphs_.push_back(capture([&] { enqueue(seq, 1, 0, /*graph=*/true); }));
  }
}

CudaStageBase::StepGraph CudaStageBase::capture(const std::function<void()>& enqueue_fn) {
  StepGraph step;
  BATON_CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
  capturing_ = &step;
  try {
    enqueue_fn();
  } catch (...) {
    capturing_ = nullptr;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_.get(), &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    throw;
  }
  capturing_ = nullptr;
  step.parts.push_back(end_capture());
  return step;
}

GraphExecHandle CudaStageBase::end_capture() {
  cudaGraph_t g = nullptr;
  BATON_CUDA_CHECK(cudaStreamEndCapture(stream_.get(), &g));
  // Sequence 0's decode graph, when the step is one graph.
  if (decode_graphs_.empty() && !config_.tp) profiler_.keep(g);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  BATON_CUDA_CHECK(err);
  return GraphExecHandle(exec);
}

void CudaStageBase::launch(const StepGraph& g) {
  for (size_t i = 0; i < g.parts.size(); ++i) {
    BATON_CUDA_CHECK(cudaGraphLaunch(g.parts[i].get(), stream_.get()));
    if (i < g.exchanges.size()) exchange(g.exchanges[i]);
  }
}

// ---- tensor-parallel exchanges

void CudaStageBase::tp_sum(float* device, size_t n) {
  if (!config_.tp) throw std::logic_error("tp_sum: this stage is not a tensor-parallel rank");
  const SharedLayout& S = shared_;
  if (n > S.h_tp_floats) throw std::logic_error(fmt::format("tp_sum of {} floats: the plan holds {}", n, S.h_tp_floats));
  if (config_.tp->on_stream()) return config_.tp->sum_on_stream(device, n, stream_.get());
  const bool host = !config_.tp->device_buffers();
  if (host) {
    BATON_CUDA_CHECK(cudaMemcpyAsync(io_.data() + S.h_tp, device, n * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream_.get()));
  }
  cut({false, device, nullptr, n});
  if (host) {
    BATON_CUDA_CHECK(cudaMemcpyAsync(device, io_.data() + S.h_tp, n * sizeof(float), cudaMemcpyHostToDevice,
                                     stream_.get()));
  }
}

void CudaStageBase::tp_gather(const float* mine, size_t n, float* all) {
  if (!config_.tp) throw std::logic_error("tp_gather: this stage is not a tensor-parallel rank");
  const SharedLayout& S = shared_;
  const size_t total = size_t(config_.tp->size()) * n;
  if (n > S.h_tp_floats || total > S.h_tp_all_floats) {
    throw std::logic_error(fmt::format("tp_gather of {} x {} floats: the plan holds {} and {}", config_.tp->size(), n,
                                       S.h_tp_floats, S.h_tp_all_floats));
  }
  if (config_.tp->on_stream()) return config_.tp->gather_on_stream(mine, n, all, stream_.get());
  const bool host = !config_.tp->device_buffers();
  if (host) {
    BATON_CUDA_CHECK(cudaMemcpyAsync(io_.data() + S.h_tp, mine, n * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream_.get()));
  }
  cut({true, const_cast<float*>(mine), all, n});
  if (host) {
    BATON_CUDA_CHECK(cudaMemcpyAsync(all, io_.data() + S.h_tp_all, total * sizeof(float), cudaMemcpyHostToDevice,
                                     stream_.get()));
  }
}

CudaStageBase::TpRooms CudaStageBase::tp_rooms(int tp_size, int64_t vocab, int64_t logit_rows, uint64_t sum_floats) {
  TpRooms t;
  if (tp_size <= 1) return t;
  t.slice = tp_vocab_range(vocab, tp_size, 0).second;
  t.block = uint64_t(logit_rows) * uint64_t(t.slice);
  t.h_tp_floats = std::max(sum_floats, t.block);
  t.h_tp_all_floats = uint64_t(tp_size) * t.block;
  return t;
}

void CudaStageBase::tp_gather_logits(float* mine, float* all, int64_t rows, float* logits) {
  const int n = config_.tp->size();
  const int64_t V = shared_.vocab;
  const int64_t slice = tp_vocab_range(V, n, 0).second;
  const int64_t block = rows * slice, filled = rows * tp_vocab_range(V, n, config_.tp->rank()).second;
  cudaStream_t s = stream_.get();
  if (filled < block) {
    BATON_CUDA_CHECK(cudaMemsetAsync(mine + filled, 0, uint64_t(block - filled) * sizeof(float), s));
  }
  tp_gather(mine, size_t(block), all);
  for (int r = 0; r < n; ++r) {
    const auto [begin, count] = tp_vocab_range(V, n, r);
    if (count <= 0) continue;
    BATON_CUDA_CHECK(cudaMemcpy2DAsync(logits + begin, uint64_t(V) * sizeof(float), all + int64_t(r) * block,
                                       uint64_t(count) * sizeof(float), uint64_t(count) * sizeof(float), size_t(rows),
                                       cudaMemcpyDeviceToDevice, s));
  }
}

void CudaStageBase::cut(const TpExchange& x) {
  if (!capturing_) {
    exchange(x);
    return;
  }
  capturing_->parts.push_back(end_capture());
  capturing_->exchanges.push_back(x);
  BATON_CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
}

// The rows are complete once stream_ has passed the work before the
// exchange (a host group reads them from the pinned copy; a device group
// may run on a stream of its own); the work after it is queued only when
// the call has returned with the result in place.
void CudaStageBase::exchange(const TpExchange& x) {
  sync();
  TpComm& tp = *config_.tp;
  if (tp.device_buffers()) {
    if (x.gather) {
      tp.gather(x.in, x.n, x.all);
    } else {
      tp.sum(x.in, x.n);
    }
    return;
  }
  float* rows = reinterpret_cast<float*>(io_.data() + shared_.h_tp);
  if (x.gather) {
    tp.gather(rows, x.n, reinterpret_cast<float*>(io_.data() + shared_.h_tp_all));
  } else {
    tp.sum(rows, x.n);
  }
}

void CudaStageBase::enqueue_batch(int64_t, int64_t, bool) {
  throw std::logic_error("this CUDA stage runs one sequence per forward");
}

void CudaStageBase::enqueue_params() {
  const uint64_t count = uint64_t(pos0_param() + 1 + shared_.batch_params);
  BATON_CUDA_CHECK(cudaMemcpyAsync(workspace_.data() + shared_.params, io_.data() + shared_.h_params,
                                   count * sizeof(int32_t), cudaMemcpyHostToDevice, stream_.get()));
}

void CudaStageBase::enqueue_input_rows(int64_t n) {
  BATON_CUDA_CHECK(cudaMemcpyAsync(workspace_.data() + shared_.x, io_.data() + shared_.h_in,
                                   uint64_t(n * shared_.row_width) * sizeof(float), cudaMemcpyHostToDevice,
                                   stream_.get()));
}

void CudaStageBase::put_row(int64_t row, int32_t id, int64_t pos) {
  const SharedLayout& S = shared_;
  if (id < 0 || id >= S.vocab) {
    throw std::out_of_range(fmt::format("token id {} is outside the vocabulary [0, {})", id, S.vocab));
  }
  int32_t* hp = reinterpret_cast<int32_t*>(io_.data() + S.h_params);
  hp[row] = id;
  hp[S.batch + row] = int32_t(pos);
  if (S.negated_positions) hp[2 * S.batch + row] = -int32_t(pos);
}

void CudaStageBase::run(int seq, const int32_t* tokens, const float* activations, int64_t n, bool queued) {
  check_seq(seq);
  const SharedLayout& S = shared_;
  const int64_t pos0 = length_[size_t(seq)];
  if (n < 1 || n > config_.max_batch) {
    throw std::invalid_argument(
        fmt::format("a forward takes 1..{} tokens (the planned batch), got {}; split the input", config_.max_batch, n));
  }
  if (pos0 + n > config_.n_ctx) {
    throw std::out_of_range(
        fmt::format("sequence {} would reach {} tokens; the context is {}", seq, pos0 + n, config_.n_ctx));
  }
  int32_t* hp = reinterpret_cast<int32_t*>(io_.data() + S.h_params);
  for (int64_t t = 0; t < n; ++t) put_row(t, tokens ? tokens[t] : 0, pos0 + t);
  hp[pos0_param()] = int32_t(pos0);
  if (activations) {
    std::memcpy(io_.data() + S.h_in, activations, uint64_t(n * S.row_width) * sizeof(float));
    if (!S.input_in_forward) enqueue_input_rows(n);
  }
  ++forwards_[size_t(seq)];
  if (n == 1 && !queued) {
    launch(decode_graphs_[size_t(seq)]);
    if (seq == 0) profiler_.count_step();
  } else {
    enqueue(seq, n, pos0, /*graph=*/false);
  }
  length_[size_t(seq)] = pos0 + n;
  last_rows_ = config_.head ? (config_.all_logits ? n : 1) : n;
}

std::span<const float> CudaStageBase::forward(int seq, std::span<const int32_t> tokens) {
  if (!config_.embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  run(seq, tokens.data(), nullptr, int64_t(tokens.size()));
  return output_to_host();
}

std::span<const float> CudaStageBase::forward(int seq, std::span<const float> activations, int64_t n_tokens) {
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  const int64_t width = shared_.row_width;
  if (n_tokens < 0 || activations.size() != uint64_t(n_tokens) * uint64_t(width)) {
    throw std::invalid_argument(
        fmt::format("stage input: {} floats for {} tokens of width {}", activations.size(), n_tokens, width));
  }
  run(seq, nullptr, activations.data(), n_tokens);
  return output_to_host();
}

int32_t CudaStageBase::forward_greedy(int seq, std::span<const int32_t> tokens) {
  if (!config_.head) throw std::logic_error("forward_greedy: this stage has no output head");
  if (!config_.embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  run(seq, tokens.data(), nullptr, int64_t(tokens.size()));
  sync();
  return reinterpret_cast<const int32_t*>(io_.data() + shared_.h_ids)[last_rows_ - 1];
}

std::span<const float> CudaStageBase::output_to_host() {
  const int64_t width = output_width();
  BATON_CUDA_CHECK(cudaMemcpyAsync(io_.data() + shared_.h_out, workspace_.data() + output_offset(),
                                   uint64_t(last_rows_ * width) * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_.get()));
  sync();
  return {reinterpret_cast<const float*>(io_.data() + shared_.h_out), size_t(last_rows_ * width)};
}

// The boundary rows stay where the forward computes them: the residual
// stream x of the workspace (the logits on the last stage). x is also where
// a stage without the embedding starts, so device_input() hands out x
// itself: no extra buffer, no copy, and the decode graph, which reads x,
// replays unchanged.
StageRunner::DeviceRows CudaStageBase::device_output() const {
  if (shared_.input_in_forward) return StageRunner::device_output();
  if (last_rows_ == 0) return {};
  return {reinterpret_cast<const float*>(workspace_.data() + output_offset()), last_rows_ * output_width(),
          stream_.get()};
}

float* CudaStageBase::device_input(int64_t n_tokens) {
  if (shared_.input_in_forward) return StageRunner::device_input(n_tokens);
  if (config_.embedding) throw std::logic_error("this stage has the embedding: it takes token ids, not device rows");
  if (n_tokens < 1 || n_tokens > config_.max_batch) {
    throw std::invalid_argument(fmt::format("device input of {} rows: a forward takes 1..{} tokens (the planned batch)",
                                            n_tokens, config_.max_batch));
  }
  // The room is x: writing it overwrites the rows of the last forward.
  if (!config_.head) last_rows_ = 0;
  return reinterpret_cast<float*>(workspace_.data() + shared_.x);
}

std::span<const float> CudaStageBase::forward_device_input(int seq, int64_t n_tokens) {
  if (shared_.input_in_forward) return StageRunner::forward_device_input(seq, n_tokens);
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  run(seq, nullptr, nullptr, n_tokens);
  return output_to_host();
}

// ---- batches of several sequences

std::span<const float> CudaStageBase::run_one(const BatchChunk& c, const int32_t* tokens, const float* activations) {
  run(c.seq, tokens, activations, c.n_tokens);
  std::span<const float> y = output_to_host();
  if (!config_.head) return y;
  if (!c.output) return {};
  return y.subspan(y.size() - size_t(shared_.vocab));  // all_logits: the last token's row
}

std::span<const float> CudaStageBase::run_batch(std::span<const BatchChunk> chunks, const int32_t* tokens,
                                                const float* activations, bool logits) {
  const SharedLayout& S = shared_;
  const int64_t n = check_batch(chunks);
  if (chunks.size() == 1) return run_one(chunks[0], tokens, activations);
  int32_t* hp = reinterpret_cast<int32_t*>(io_.data() + S.h_params);
  int32_t* seqs = hp + pos0_param() + 1;
  int32_t* out_rows = seqs + S.batch;
  int32_t& n_pos = out_rows[S.batch];
  int64_t row = 0, n_out = 0, max_pos = 0;
  bool decode = true;  // single tokens that all ask for output: the graph's shape
  for (const BatchChunk& c : chunks) {
    const int64_t pos0 = length_[size_t(c.seq)];
    for (int64_t t = 0; t < c.n_tokens; ++t, ++row) {
      put_row(row, tokens ? tokens[row] : 0, pos0 + t);
      seqs[row] = c.seq;
    }
    if (c.output) out_rows[n_out++] = int32_t(row - 1);
    max_pos = std::max(max_pos, pos0 + c.n_tokens);
    decode = decode && c.n_tokens == 1 && c.output;
  }
  hp[pos0_param()] = 0;
  n_pos = int32_t(max_pos);
  if (activations) {
    std::memcpy(io_.data() + S.h_in, activations, uint64_t(n * S.row_width) * sizeof(float));
    if (!S.input_in_forward) enqueue_input_rows(n);
  }
  // Profiling (stage_profiling) times the phases of a queued forward.
  if (decode && n <= S.batch_graph_rows && !stage_profiling()) {
    auto it = batch_graphs_.find(n);
    if (it == batch_graphs_.end()) {
      it = batch_graphs_.emplace(n, capture([&] { enqueue_batch(n, n, /*graph=*/true); })).first;
    }
    launch(it->second);
  } else {
    enqueue_batch(n, n_out, /*graph=*/false);
  }
  for (const BatchChunk& c : chunks) {
    length_[size_t(c.seq)] += c.n_tokens;
    ++forwards_[size_t(c.seq)];
  }
  last_rows_ = config_.head ? n_out : n;
  if (last_rows_ == 0 || !logits) {
    sync();
    return {};
  }
  return output_to_host();
}

std::span<const int32_t> CudaStageBase::forward_batch_greedy(std::span<const BatchChunk> chunks,
                                                             std::span<const int32_t> tokens) {
  if (!batches() || !config_.head || !config_.embedding || config_.all_logits) {
    return StageRunner::forward_batch_greedy(chunks, tokens);
  }
  int64_t total = 0;
  for (const BatchChunk& c : chunks) total += c.n_tokens;
  if (int64_t(tokens.size()) != total) {
    throw std::invalid_argument(fmt::format("a batch of {} tokens came with {} token ids", total, tokens.size()));
  }
  const int32_t* ids = reinterpret_cast<const int32_t*>(io_.data() + shared_.h_ids);
  if (chunks.size() == 1) {
    // The single-sequence path (its decode graph), as forward_greedy.
    check_batch(chunks);
    run(chunks[0].seq, tokens.data(), nullptr, chunks[0].n_tokens);
    sync();
    if (!chunks[0].output) return {};
    return {ids + last_rows_ - 1, 1};
  }
  run_batch(chunks, tokens.data(), nullptr, /*logits=*/false);
  return {ids, size_t(last_rows_)};
}

std::span<const float> CudaStageBase::forward_batch(std::span<const BatchChunk> chunks,
                                                    std::span<const int32_t> tokens) {
  if (!batches()) return StageRunner::forward_batch(chunks, tokens);
  if (!config_.embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  int64_t total = 0;
  for (const BatchChunk& c : chunks) total += c.n_tokens;
  if (int64_t(tokens.size()) != total) {
    throw std::invalid_argument(fmt::format("a batch of {} tokens came with {} token ids", total, tokens.size()));
  }
  return run_batch(chunks, tokens.data(), nullptr);
}

std::span<const float> CudaStageBase::forward_batch(std::span<const BatchChunk> chunks,
                                                    std::span<const float> activations) {
  if (!batches()) return StageRunner::forward_batch(chunks, activations);
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  int64_t total = 0;
  for (const BatchChunk& c : chunks) total += c.n_tokens;
  if (int64_t(activations.size()) != total * shared_.row_width) {
    throw std::invalid_argument(fmt::format("stage input: {} floats for a batch of {} tokens of width {}",
                                            activations.size(), total, shared_.row_width));
  }
  return run_batch(chunks, nullptr, activations.data());
}

std::span<const float> CudaStageBase::forward_batch_device_input(std::span<const BatchChunk> chunks) {
  if (!batches() || shared_.input_in_forward) return StageRunner::forward_batch_device_input(chunks);
  if (config_.embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  return run_batch(chunks, nullptr, nullptr);
}

}  // namespace baton
