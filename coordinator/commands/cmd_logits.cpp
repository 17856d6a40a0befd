// `baton logits -m MODEL --tokens "1,2,3" [--backend cpu|cuda] -o FILE`: runs
// token ids through the whole model and writes the logits of every position,
// n_tokens rows of n_vocab floats, as raw little-endian f32 or as .npy (when
// FILE ends in .npy). It is the hook for oracles: another implementation
// (transformers, llama.cpp) computes the same rows and a script compares.
//
// `--workers K` runs the same tokens through a pipeline of K local worker
// processes (as `baton run --workers`). The protocol's RESULT carries a
// sampled token with at most kMaxTopLogprobs log-probabilities, not raw
// logits, so each position is its own one-token step that asks for every
// token's log-probability: the rows are log-softmax (compare them with a
// single-process `--log-softmax` run), for vocabularies of at most 64 tokens
// (the oracles' tiny models).
#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/commands/commands.h"
#include "coordinator/cluster/local_cluster.h"
#include "engine/model/arch.h"
#include "engine/runtime/backend.h"
#include "engine/base/command_error.h"
#include "engine/base/command_line.h"
#include "engine/gguf/file.h"
#include "engine/base/temp_file.h"
#include "engine/plan/node_plan.h"

namespace baton {
namespace {

namespace po = boost::program_options;

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> ids;
  const char* p = s.data();
  const char* end = p + s.size();
  while (p < end) {
    while (p < end && (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t')) ++p;
    if (p == end) break;
    int32_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || v < 0) {
      throw std::invalid_argument("--tokens: '" + std::string(p, std::min<size_t>(12, size_t(end - p))) +
                                  "' is not a token id (comma-separated non-negative integers)");
    }
    ids.push_back(v);
    p = next;
  }
  if (ids.empty()) throw std::invalid_argument("--tokens: no token ids given");
  return ids;
}

// NumPy format 1.0: magic, version, header length (u16), a Python dict
// literal padded with spaces to a 64-byte boundary and ending in '\n'.
std::string npy_header(uint64_t rows, uint64_t cols) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "), }";
  const size_t fixed = 10;  // magic (6) + version (2) + length (2)
  size_t total = fixed + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - fixed - dict.size() - 1, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += char(1);
  h += char(0);
  h += char(dict.size() & 0xff);
  h += char(dict.size() >> 8);
  return h + dict;
}

// In place, with the arithmetic of the sampler's token_logprobs (the
// pipeline's numbers): x - (max + log sum exp(x - max)), in double.
void log_softmax(std::span<float> row) {
  float max = -INFINITY;
  for (float v : row) max = std::max(max, v);
  double sum = 0;
  for (float v : row) sum += std::exp(double(v) - double(max));
  const double log_z = double(max) + std::log(sum);
  for (float& v : row) v = float(double(v) - log_z);
}

using RowSink = std::function<void(std::span<const float>)>;  // rows of n_vocab, in token order

// The whole model in this process, in forwards of up to `batch` tokens.
void local_rows(const std::string& model, const std::vector<int32_t>& ids, Backend backend, int n_threads,
                int64_t batch, bool lsm, const RowSink& sink) {
  GgufFile file = about_file(model, [&] { return GgufFile::open(model); });
  StageConfig sc;
  sc.n_ctx = int64_t(ids.size());
  sc.n_threads = n_threads;
  sc.max_batch = batch;
  sc.all_logits = true;
  std::unique_ptr<StageRunner> stage = make_stage_runner(backend, file, sc);
  const int64_t V = stage->n_vocab();
  for (int32_t id : ids) {
    if (id >= V) throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                         std::to_string(V) + ")");
  }
  std::vector<float> row;
  for (size_t at = 0; at < ids.size(); at += size_t(stage->max_batch())) {
    const size_t n = std::min(ids.size() - at, size_t(stage->max_batch()));
    std::span<const float> rows = stage->forward(0, std::span<const int32_t>(ids.data() + at, n));
    if (rows.size() != n * size_t(V)) {
      throw std::logic_error("the backend returned " + std::to_string(rows.size()) + " logits for " +
                             std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) {
      row.assign(rows.begin() + std::ptrdiff_t(i * size_t(V)), rows.begin() + std::ptrdiff_t((i + 1) * size_t(V)));
      if (lsm) log_softmax(row);
      sink(row);
    }
  }
}

// K local workers; one one-token step per position, up to 16 in flight so
// the stages overlap. Rows are log-probabilities.
void pipeline_rows(const std::string& model, const std::vector<int32_t>& ids, Backend backend, int workers,
                   int n_threads, const RowSink& sink) {
  const std::string path = std::filesystem::absolute(model).string();
  GgufFile file = about_file(model, [&] { return GgufFile::open(path); });
  const ModelPlanner planner(file);
  const int64_t V = Arch::from_gguf(file)->dims().n_vocab;
  if (V > int64_t(net::kMaxTopLogprobs)) {
    throw std::invalid_argument("--workers: the pipeline returns at most " + std::to_string(net::kMaxTopLogprobs) +
                                " log-probabilities per position and this model has " + std::to_string(V) +
                                " tokens; use a single process");
  }
  for (int32_t id : ids) {
    if (id >= V) throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                         std::to_string(V) + ")");
  }
  const std::vector<StageSlice> slices = split_layers(planner, workers);  // before any worker starts
  LocalClusterOptions lo;
  lo.n_workers = workers;
  lo.model = path;
  lo.threads_per_worker = std::max(1, n_threads / workers);
  lo.backend = backend_name(backend);
  lo.wait_for_registration = false;
  LocalCluster local(lo);
  Cluster& cluster = local.cluster();
  cluster.wait_for_workers(workers, [&] { return local.exited_worker(); });
  StageSettings settings;
  settings.n_ctx = uint32_t(ids.size());
  settings.model_path = path;
  settings.model_hash = file.tensor_table_hash();
  cluster.assign(slices, settings);
  net::SeqChunk c;
  c.n_tokens = 1;
  c.sample = true;
  c.sampling.temperature = 0;
  c.sampling.want_logprobs = true;
  c.sampling.top_logprobs = uint32_t(V);
  std::deque<uint64_t> pending;
  std::vector<float> row(static_cast<size_t>(V));
  auto receive = [&] {
    const net::Result r = cluster.wait_result(pending.front());
    pending.pop_front();
    if (r.top.size() != 1 || int64_t(r.top[0].size()) != V) {
      throw std::runtime_error("the last stage returned " + std::to_string(r.top.empty() ? 0 : r.top[0].size()) +
                               " log-probabilities for a vocabulary of " + std::to_string(V));
    }
    std::fill(row.begin(), row.end(), NAN);
    for (const net::TokenLogprob& t : r.top[0]) row.at(size_t(t.token)) = t.logprob;
    sink(row);
  };
  for (size_t pos = 0; pos < ids.size(); ++pos) {
    c.start_pos = uint32_t(pos);
    pending.push_back(cluster.forward({c}, {ids[pos]}));
    if (pending.size() >= 16) receive();
  }
  while (!pending.empty()) receive();
  cluster.free_seq(0);
}

}  // namespace

int cmd_logits(int argc, char** argv) {
  std::string model, tokens, out, backend_name_arg = "cpu";
  int n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  int workers = 0;
  int64_t batch = 64;
  po::options_description opts(
      "usage: baton logits -m MODEL --tokens IDS -o FILE [options]\n\n"
      "Runs the token ids through the whole model (from position 0, no BOS added)\n"
      "and writes the logits of every position: n_tokens rows of n_vocab float32,\n"
      "raw little-endian, or NumPy .npy when FILE ends in .npy. With --workers K\n"
      "the tokens go through a pipeline of K local worker processes, one per step,\n"
      "and the rows are log-probabilities (vocabularies of at most 64 tokens).\n\noptions");
  opts.add_options()
      ("help,h", "show this help")
      ("model,m", po::value(&model), "GGUF model file")
      ("tokens", po::value(&tokens), "token ids, comma-separated (e.g. \"1,2,3\")")
      ("output,o", po::value(&out), "file to write (.npy: NumPy format; else raw f32)")
      ("backend", po::value(&backend_name_arg), "cpu (default) or cuda")
      ("threads,t", po::value(&n_threads), "CPU threads (default: all cores; shared by the workers)")
      ("batch,b", po::value(&batch), "tokens per forward pass (default 64)")
      ("workers", po::value(&workers), "run on K local worker processes (a pipeline); writes log-probabilities")
      ("log-softmax", "write log-probabilities (log-softmax of each row) instead of logits");
  const auto vm = parse_command_line(argc, argv, {.options = opts});
  if (!vm) return 0;
  if (model.empty() || tokens.empty() || out.empty()) {
    throw std::invalid_argument("-m, --tokens and -o are required (see baton logits --help)");
  }
  if (n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (batch < 1) throw std::invalid_argument("--batch must be >= 1");
  if (workers < 0) throw std::invalid_argument("--workers must be >= 1");
  auto backend = backend_from_name(backend_name_arg);
  if (!backend) throw std::invalid_argument("--backend must be cpu or cuda, got '" + backend_name_arg + "'");
  const std::vector<int32_t> ids = parse_tokens(tokens);
  if (parse_only()) return 0;
  if (std::string why = backend_unavailable(*backend); !why.empty()) throw CommandError(why, kExitRefused);
  const bool lsm = workers > 0 || vm->count("log-softmax") > 0;

  const bool npy = out.size() >= 4 && out.compare(out.size() - 4, 4, ".npy") == 0;
  // Created exclusively beside `out` and renamed when complete; removed if
  // anything throws.
  TempFile file(out);
  const size_t V = size_t(Arch::from_gguf(about_file(model, [&] { return GgufFile::open(model); }))->dims().n_vocab);
  size_t n_rows = 0;
  if (npy) {
    const std::string h = npy_header(ids.size(), V);
    file.write(h.data(), h.size());
  }
  const RowSink sink = [&](std::span<const float> row) {
    if (row.size() != V) throw std::logic_error("a row of " + std::to_string(row.size()) + " values");
    ++n_rows;
    file.write(row.data(), row.size_bytes());
  };
  if (workers > 0) {
    pipeline_rows(model, ids, *backend, workers, n_threads, sink);
  } else {
    local_rows(model, ids, *backend, n_threads, batch, lsm, sink);
  }
  file.commit();
  const std::string where = workers > 0 ? ", " + std::to_string(workers) + " workers" : "";
  std::printf("wrote %s: %zu x %zu float32 %s (%s, %s backend%s)\n", out.c_str(), n_rows, V,
              lsm ? "log-probabilities" : "logits", npy ? "npy" : "raw", backend_name(*backend), where.c_str());
  return 0;
}

}  // namespace baton
