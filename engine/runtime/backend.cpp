#include "engine/runtime/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <stdexcept>

#include "engine/model/arch.h"
#include "engine/model/registry.h"
#include "engine/gguf/file.h"
#include "engine/model/model.h"
#include "engine/tp/slice.h"  // tp_keys

#ifdef BATON_HAVE_CUDA
#include "engine/cuda/device_memory.h"  // cuda_unavailable_reason, measure_cuda_ceilings
#endif

namespace baton {

uint64_t decode_weight_bytes(const WeightLayout& layout) {
  uint64_t total = 0;
  for (const auto* group : {&layout.embedding, &layout.head}) {
    for (const auto& e : *group) {
      if (e.info && !e.alias) total += e.info->nbytes;
    }
  }
  for (const auto& l : layout.layers) {
    for (const auto& e : l) {
      if (e.info && !e.alias) total += e.info->nbytes;
    }
  }
  for (const auto& e : layout.embedding) {
    if (!e.info) continue;
    bool shared = false;
    for (const auto& h : layout.head) shared = shared || (h.info == e.info);
    if (!shared) total -= e.info->nbytes - e.info->row_bytes();
  }
  return total;
}

void StageRunner::truncate(int seq, int64_t n) {
  const int64_t have = position(seq);  // also checks seq
  if (n < 0 || n > have) {
    throw std::out_of_range(fmt::format("sequence {} holds {} positions; cannot keep {}", seq, have, n));
  }
  if (n == have) return;
  if (n == 0) return reset(seq);
  if (!arch().kv_truncatable()) {
    throw std::invalid_argument(fmt::format("{}: the KV of sequence {} ({} positions) cannot be cut back to {}",
                                            arch().name(), seq, have, n));
  }
  set_position(seq, n);
}

ForwardRows StageRunner::forward_rows(int, std::span<const int32_t>, const ForwardOptions&) {
  throw std::logic_error(fmt::format("verify forwards are not supported on this backend ({})", backend_name(backend())));
}

void StageRunner::truncate_seq(int, int64_t) {
  throw std::logic_error(fmt::format("rollback is not supported on this backend ({})", backend_name(backend())));
}

int64_t StageRunner::check_batch(std::span<const BatchChunk> chunks) const {
  return baton::check_batch(chunks, config().n_seq, config().max_batch, config().n_ctx,
                            [this](int seq) { return position(seq); });
}

std::span<const float> StageRunner::forward_chunks(std::span<const BatchChunk> chunks, const int32_t* tokens,
                                                   const float* activations) {
  const int64_t total = check_batch(chunks);
  const bool head = config().head;
  const int64_t width = head ? n_vocab() : arch().boundary_elems_per_token();
  const int64_t in_width = arch().boundary_elems_per_token();
  batch_out_.resize(size_t((head ? batch_outputs(chunks) : total) * width));
  float* out = batch_out_.data();
  int64_t row = 0;
  for (const BatchChunk& c : chunks) {
    std::span<const float> y;
    if (tokens) {
      y = forward(c.seq, std::span<const int32_t>(tokens + row, size_t(c.n_tokens)));
    } else {
      y = forward(c.seq, std::span<const float>(activations + row * in_width, size_t(c.n_tokens * in_width)),
                  c.n_tokens);
    }
    row += c.n_tokens;
    if (!head) {
      std::copy(y.begin(), y.end(), out);
      out += y.size();
    } else if (c.output) {
      // all_logits gives a row per token: the chunk's last token is the last row.
      std::copy(y.end() - width, y.end(), out);
      out += width;
    }
  }
  return {batch_out_.data(), batch_out_.size()};
}

std::span<const float> StageRunner::forward_batch(std::span<const BatchChunk> chunks, std::span<const int32_t> tokens) {
  if (!config().embedding) throw std::logic_error("this stage has no embedding: give it boundary activations");
  int64_t total = 0;
  for (const BatchChunk& c : chunks) total += c.n_tokens;
  if (int64_t(tokens.size()) != total) {
    throw std::invalid_argument(fmt::format("a batch of {} tokens came with {} token ids", total, tokens.size()));
  }
  return forward_chunks(chunks, tokens.data(), nullptr);
}

std::span<const float> StageRunner::forward_batch(std::span<const BatchChunk> chunks,
                                                  std::span<const float> activations) {
  if (config().embedding) throw std::logic_error("this stage has the embedding: give it token ids");
  int64_t total = 0;
  for (const BatchChunk& c : chunks) total += c.n_tokens;
  const int64_t width = arch().boundary_elems_per_token();
  if (int64_t(activations.size()) != total * width) {
    throw std::invalid_argument(
        fmt::format("stage input: {} floats for a batch of {} tokens of width {}", activations.size(), total, width));
  }
  return forward_chunks(chunks, nullptr, activations.data());
}

std::span<const int32_t> StageRunner::forward_batch_greedy(std::span<const BatchChunk> chunks,
                                                          std::span<const int32_t> tokens) {
  if (!config().head) throw std::logic_error("forward_batch_greedy: this stage has no output head");
  std::span<const float> logits = forward_batch(chunks, tokens);
  const size_t v = size_t(n_vocab());
  batch_ids_.resize(logits.size() / v);
  for (size_t i = 0; i < batch_ids_.size(); ++i) {
    const float* row = logits.data() + i * v;
    batch_ids_[i] = int32_t(std::max_element(row, row + v) - row);  // the first maximum: lowest id
  }
  return batch_ids_;
}

std::span<const float> StageRunner::forward_batch_device_input(std::span<const BatchChunk> chunks) {
  if (chunks.size() != 1) throw std::logic_error("this stage runner takes device input one sequence at a time");
  check_batch(chunks);
  std::span<const float> y = forward_device_input(chunks[0].seq, chunks[0].n_tokens);
  if (!config().head) return y;
  if (!chunks[0].output) return {};
  return y.subspan(y.size() - size_t(n_vocab()));
}

namespace {

class CpuStageRunner final : public StageRunner {
 public:
  CpuStageRunner(const GgufFile& f, const StageConfig& config, const LoadOptions& load) : stage_(f, config, load) {
    const StageConfig& c = stage_.config();
    per_token_ = decode_weight_bytes(Model::plan(f, stage_.arch(), {{c.first_layer, c.last_layer}, c.embedding, c.head}));
  }
  Backend backend() const override { return Backend::Cpu; }
  std::span<const float> forward(int seq, std::span<const int32_t> tokens) override {
    return stage_.forward(seq, tokens);
  }
  std::span<const float> forward(int seq, std::span<const float> activations, int64_t n_tokens) override {
    return stage_.forward(seq, activations, n_tokens);
  }
  ForwardRows forward_rows(int seq, std::span<const int32_t> tokens, const ForwardOptions& options) override {
    return stage_.forward_rows(seq, tokens, options);
  }
  void truncate_seq(int seq, int64_t n) override { stage_.truncate_seq(seq, n); }
  bool speculative() const override { return true; }
  int64_t position(int seq) const override { return stage_.position(seq); }
  void reset(int seq) override { stage_.reset(seq); }
  void set_position(int seq, int64_t n) override { stage_.truncate(seq, n); }
  const Arch& arch() const override { return stage_.arch(); }
  const StageConfig& config() const override { return stage_.config(); }
  const MemoryPlan& memory_plan() const override { return stage_.memory_plan(); }
  const LoadStats& load_stats() const override { return stage_.load_stats(); }
  uint64_t weight_bytes_per_token() const override { return per_token_; }
  const Model* host_model() const override { return &stage_.model(); }

 private:
  Stage stage_;
  uint64_t per_token_ = 0;
};

}  // namespace

std::optional<Backend> backend_from_name(std::string_view name) {
  if (name == "cpu") return Backend::Cpu;
  if (name == "cuda") return Backend::Cuda;
  return std::nullopt;
}

Backend resolve_backend(std::string_view name, std::string* note) {
  if (name == "auto") {
    const std::string why = backend_unavailable(Backend::Cuda);
    if (note) *note = why.empty() ? "backend cuda (auto: a CUDA device is usable)" : "backend cpu (auto: " + why + ")";
    return why.empty() ? Backend::Cuda : Backend::Cpu;
  }
  const std::optional<Backend> b = backend_from_name(name);
  if (!b) throw std::invalid_argument("--backend must be auto, cpu or cuda, got '" + std::string(name) + "'");
  if (note) *note = "backend " + std::string(name);
  return *b;
}

std::string backend_unavailable(Backend b) {
  if (b == Backend::Cpu) return "";
#ifdef BATON_HAVE_CUDA
  return cuda_unavailable_reason();
#else
  return "cuda: this build has no CUDA backend (configure with -DBATON_CUDA=ON where nvcc is installed)";
#endif
}

int64_t StageRunner::n_vocab() const { return arch().dims().n_vocab; }

int32_t StageRunner::forward_greedy(int seq, std::span<const int32_t> tokens) {
  if (!config().head) throw std::logic_error("forward_greedy: this stage has no output head");
  std::span<const float> logits = forward(seq, tokens);
  const int64_t v = n_vocab();
  const float* row = logits.data() + (int64_t(logits.size()) - v);
  // First maximum: the lowest id wins a tie, as in Sampler.
  return int32_t(std::max_element(row, row + v) - row);
}

namespace {
// The CUDA stage the registry names for the file's architecture. Only
// reached with the CUDA backend available, so a CUDA build.
const CudaStageFactory& cuda_stage_of(const GgufFile& f) {
  const ArchEntry& e = arch_entry(f);
  if (!e.cuda) throw std::runtime_error(std::string("cuda: no CUDA stage runs architecture '") + e.name + "'");
  // A stage without the sums would give one rank's partial products as if
  // they were the model's.
  if (f.has(tp_keys::kSize) && !e.cuda->tensor_parallel) {
    throw std::runtime_error(std::string("cuda: the CUDA stage of '") + e.name +
                             "' does not run tensor-parallel rank files yet (--backend cpu does)");
  }
  return *e.cuda;
}
}  // namespace

MemoryPlan plan_stage_runner(Backend b, const GgufFile& f, const StageConfig& config, const LoadOptions& load) {
  if (std::string why = backend_unavailable(b); !why.empty()) throw std::runtime_error(why);
  if (b == Backend::Cpu) return Stage::plan(f, config);
  return cuda_stage_of(f).plan(f, config, load);
}

std::unique_ptr<StageRunner> make_stage_runner(Backend b, const GgufFile& f, const StageConfig& config,
                                               const LoadOptions& load) {
  if (std::string why = backend_unavailable(b); !why.empty()) throw std::runtime_error(why);
  if (b == Backend::Cpu) return std::make_unique<CpuStageRunner>(f, config, load);
  return cuda_stage_of(f).make(f, config, load);
}

#ifndef BATON_HAVE_CUDA
void set_programmatic_launch(bool) {}
void set_draft_graphs(bool) {}
#endif

namespace {
std::atomic<bool> g_stage_profiling{false};
}  // namespace
void set_stage_profiling(bool on) { g_stage_profiling.store(on); }
bool stage_profiling() { return g_stage_profiling.load(); }

DeviceCeilings measure_device_ceilings(uint64_t copy_bytes, bool gemm) {
  if (std::string why = backend_unavailable(Backend::Cuda); !why.empty()) throw std::runtime_error(why);
#ifdef BATON_HAVE_CUDA
  return measure_cuda_ceilings(copy_bytes, gemm);
#else
  (void)copy_bytes, (void)gemm;
  throw std::logic_error("unreachable: cuda without CUDA");
#endif
}

uint64_t plan_bytes_under_limit(Backend b, const MemoryPlan& plan) {
  uint64_t need = 0;
  for (const auto& line : plan.lines()) {
    if (b == Backend::Cpu || !plan_line_is_host(line.kind)) need += line.bytes;
  }
  return need;
}

namespace {

uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return UINT64_MAX;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return UINT64_MAX;
  }
}

// The limit's headroom of this process's memory cgroup (v2, else v1).
uint64_t cgroup_headroom() {
  std::ifstream in("/proc/self/cgroup");
  uint64_t best = UINT64_MAX;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string dir, limit_file, usage_file;
    if (controllers.empty()) {
      dir = "/sys/fs/cgroup" + path, limit_file = "memory.max", usage_file = "memory.current";
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      dir = "/sys/fs/cgroup/memory" + path, limit_file = "memory.limit_in_bytes", usage_file = "memory.usage_in_bytes";
    } else {
      continue;
    }
    const uint64_t limit = read_number(dir + "/" + limit_file), used = read_number(dir + "/" + usage_file);
    if (limit == UINT64_MAX || used == UINT64_MAX) continue;  // no limit, or not visible from here
    best = std::min(best, limit > used ? limit - used : 0);
  }
  return best;
}

}  // namespace

uint64_t host_memory_available() {
  uint64_t avail = UINT64_MAX;
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    uint64_t kib = 0;
    std::string unit;
    in >> kib >> unit;
    if (key == "MemAvailable:") {
      avail = kib * 1024;
      break;
    }
  }
  return std::min(avail, cgroup_headroom());
}

std::string memory_limit_problem(Backend b, const MemoryPlan& plan, uint64_t limit) {
  const uint64_t need = plan_bytes_under_limit(b, plan);
  if (limit == 0) {
    if (b != Backend::Cpu) return "";
    const uint64_t avail = host_memory_available();
    if (need <= avail) return "";
    return "stage needs " + format_size(need) + "; this machine has " + format_size(avail) +
           " available now (a smaller --ctx, or the model split across machines: baton plan; --mem-limit SIZE "
           "checks against SIZE instead)";
  }
  if (need <= limit) return "";
  return "stage needs " + format_size(need) + "; --mem-limit allows " + format_size(limit);
}

}  // namespace baton
