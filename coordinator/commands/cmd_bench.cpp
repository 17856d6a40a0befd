// `baton bench`: prefill and decode speed of one whole-model stage at growing
// context depths, against the device's ceilings measured in the same run
// (docs/PERFORMANCE.md). Prints a table, or CSV with --csv:
//
//   ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kv_bytes,
//   weights_bytes_per_token,gen_gbps,roofline_pct,prefill_tflops,bf16_tflops,copy_gbps
//
// gen_gbps counts the weight bytes one decode step reads (every tensor of the
// stage, one row of an untied embedding) times tokens/s; roofline_pct is that
// over the device-to-device copy bandwidth (bytes read + written) measured
// just before loading. prefill_tflops counts 2 FLOPs per weight per prompt
// token, the head once per chunk, and attention's q.k and p.v products over
// the visible positions; compare it with bf16_tflops, a dense bf16 cuBLAS
// GEMM measured in the same run.
//
// --parallel N,M,...: afterwards N sequences decode together, every step one
// forward of N rows (forward_batch_greedy, as `baton serve` steps them), and
// the aggregate decode rate per N goes to stderr.
//
// --verify K,...: afterwards one sequence runs forwards of K tokens at
// ctx-start (the shape of a speculative verify step: a bonus token and K - 1
// guesses), and the ms per forward against the one-token decode step,
// measured beside it, go to stderr.
//
// --draft-rounds N: afterwards the DSpark drafter (the model file's or
// --draft's) runs N draft rounds over ctx-start context rows, on the stage's
// GPU (or the CPU backend's threads), timed against the same one-token step;
// on the GPU once as one CUDA graph and once queued launch by launch.
//
// --tp-alone: MODEL is one rank file of `baton split --tp`, run alone as its
// rank with a lone group answering its sums and gather locally: one rank's
// step time on one device. On CUDA the lone group's calls are queued on the
// stage's stream (engine/cuda/lone_rank.h: the rank's reads and kernels
// alone) unless --tp-exchange host asks for the host groups' lone rank
// (LoneTpRank: each exchange also copies through pinned memory and
// synchronizes, as the TCP mesh makes it).
#include <boost/program_options.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "coordinator/commands/commands.h"
#include "coordinator/commands/count_list.h"
#include "coordinator/commands/load_report.h"
#include "engine/runtime/backend.h"
#include "engine/base/command_error.h"
#include "engine/base/command_line.h"
#include "engine/base/temp_file.h"
#include "engine/gguf/file.h"
#include "engine/runtime/kv_cache.h"
#include "engine/arch/llama_family.h"
#include "coordinator/commands/draft_options.h"
#include "engine/dspark/dspark_device.h"
#include "engine/dspark/dspark_source.h"
#include "engine/dspark/dspark_weights.h"
#include "engine/model/loader.h"
#include "engine/base/memory_plan.h"
#include "engine/model/part_info.h"
#include "engine/model/layer_range_text.h"
#include "engine/runtime/tp_comm.h"
#include "engine/tp/slice.h"
#if BATON_HAVE_CUDA
#include "engine/cuda/lone_rank.h"
#endif

namespace baton {

namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model;
  Backend backend = Backend::Cuda;
  int64_t ctx_start = 512;
  int64_t ctx_max = 4096;
  int64_t step_mul = 2;
  int64_t gen_tokens = 128;
  int64_t batch = 512;
  bool csv = false;
  uint64_t staging_mb = 64;
  uint64_t copy_mb = 1024;
  uint64_t read_mb = 2048;
  int n_threads = 1;
  uint64_t seed = 1;
  std::string load_csv;
  uint64_t mem_limit = 0;  // 0: none
  bool load_only = false;
  bool no_pdl = false;
  bool profile = false;
  bool tp_alone = false;
  std::string tp_exchange = "device";  // --tp-exchange: device or host
  std::vector<int64_t> parallel;  // sequence counts decoding together
  std::vector<int64_t> verify;    // tokens per verify-shaped forward
  int64_t draft_rounds = 0;       // DSpark draft rounds to time
  std::string draft;              // the drafter's sidecar
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::optional<BenchOptions> parse(int argc, char** argv) {
  BenchOptions o;
  std::string backend = "auto", mem_limit, parallel, verify;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  po::options_description desc(
      "usage: baton bench [-m] MODEL [options]\n\n"
      "Loads the whole model as one stage, then for ctx = ctx-start, ctx-start*K, ...\n"
      "up to ctx-max: prefills ctx random prompt tokens (chunks of --batch) and\n"
      "generates --gen-tokens greedy tokens, timing both. Device ceilings (copy\n"
      "bandwidth, bf16 GEMM rate, host-to-device and file read speed) are measured\n"
      "in the same run. Loading progress and a summary go to stderr.\n\n"
      "MODEL may be a split part (baton split): it loads as the stage it holds;\n"
      "a part without the embedding or the head only loads (--load-only).\n"
      "A tensor-parallel rank file (baton split --tp) runs with --tp-alone: that\n"
      "one rank alone, its group's sums and gather answered on this node.\n\n"
      "baton bench --serve [options] -- SERVE-ARGS... is the load benchmark through\n"
      "the HTTP API of `baton serve` (see baton bench --serve --help).\n\noptions");
  // clang-format off
  desc.add_options()
      ("help,h", "print this help and exit")
      ("model,m", po::value<std::string>(&o.model), "GGUF model file (required)")
      ("backend", po::value<std::string>(&backend)->default_value("auto"),
       "auto (the GPU when one is usable, else the CPU; the plan line says which), cuda, or cpu")
      ("ctx-start", po::value<int64_t>(&o.ctx_start)->default_value(512), "first context depth (prompt tokens)")
      ("ctx-max", po::value<int64_t>(&o.ctx_max)->default_value(4096), "last context depth")
      ("step-mul", po::value<int64_t>(&o.step_mul)->default_value(2), "factor between depths (>= 2)")
      ("gen-tokens", po::value<int64_t>(&o.gen_tokens)->default_value(128), "tokens generated at each depth")
      ("batch,b", po::value<int64_t>(&o.batch)->default_value(512), "prompt tokens per prefill forward")
      ("csv", po::bool_switch(&o.csv), "print CSV instead of a table")
      ("staging-mb", po::value<uint64_t>(&o.staging_mb)->default_value(64), "MiB of each of the loader's 4 staging buffers")
      ("copy-mb", po::value<uint64_t>(&o.copy_mb)->default_value(1024), "MiB copied device-to-device for the bandwidth ceiling")
      ("read-mb", po::value<uint64_t>(&o.read_mb)->default_value(2048),
       "MiB of the file read (O_DIRECT where allowed) for the disk ceiling; 0 skips it")
      ("threads,t", po::value<int>(&o.n_threads)->default_value(hw), "CPU threads (cpu backend)")
      ("seed", po::value<uint64_t>(&o.seed)->default_value(1), "seed of the random prompt tokens")
      ("load-csv", po::value<std::string>(&o.load_csv), "also write the load measurements as a one-row CSV to this file")
      ("no-pdl", po::bool_switch(&o.no_pdl),
       "CUDA: launch the decode kernels without programmatic dependent launch (A/B measurement)")
      ("profile", po::bool_switch(&o.profile),
       "CUDA: per-kernel tables of a decode step on stderr, node by node and each kernel's marginal cost in the "
       "replay (and for deepseek4 the GPU time per prefill phase; with --draft-rounds the same two tables of the "
       "DSpark draft round)")
      ("parallel", po::value<std::string>(&parallel),
       "comma list of sequence counts: after the single-stream rows, N sequences with a prompt of ctx-start "
       "tokens each decode --gen-tokens steps together, one forward of N rows per step; prints their aggregate "
       "decode tok/s")
      ("verify", po::value<std::string>(&verify),
       "comma list of token counts 1..64: after the single-stream rows, one sequence with a prompt of ctx-start "
       "tokens runs --gen-tokens / K forwards of K tokens each (a speculative verify step's shape); prints ms a "
       "forward and its ratio to the one-token decode step measured beside it")
      ("draft-rounds", po::value<int64_t>(&o.draft_rounds)->default_value(0),
       "DeepSeek V4 with a DSpark drafter (the model file's, or --draft FILE): after the single-stream rows, time "
       "this many draft rounds of the drafter network (on the stage's GPU, or the CPU backend's threads) over "
       "ctx-start context rows, each round its whole block (threshold 0); prints ms a round and its ratio to the "
       "one-token decode step measured beside it, on the GPU for the round as one CUDA graph and queued launch by "
       "launch")
      ("draft", po::value<std::string>(&o.draft), "the DSpark drafter's sidecar GGUF for --draft-rounds")
      ("tp-alone", po::bool_switch(&o.tp_alone),
       "MODEL is one rank file of baton split --tp: run that rank alone, each sum leaving its own partial rows and "
       "the gather filling the other ranks' logits with zeros, to time one rank's step (its compute and its "
       "exchange copies, no network); the tokens are not the model's")
      ("tp-exchange", po::value<std::string>(&o.tp_exchange)->default_value("device"),
       "with --tp-alone on cuda: device (the sums and the gather queued on the stage's stream, the decode step one "
       "graph: the rank's own compute) or host (each exchange copied through pinned memory with a "
       "synchronization, the graph cut there: what a host group such as the TCP mesh adds besides the network)")
      ("load-only", po::bool_switch(&o.load_only), "measure the ceilings and the load, then exit (no prefill or decode)")
      ("mem-limit", po::value<std::string>(&mem_limit),
       "most memory the stage's plan may use (device lines with --backend cuda), e.g. 128GB: refused before "
       "loading when larger");
  // clang-format on
  po::positional_options_description positional;
  positional.add("model", 1);  // -m MODEL, or the model first
  if (!parse_command_line(argc, argv, {.options = desc, .positional = &positional})) return std::nullopt;
  if (o.model.empty()) throw std::invalid_argument("-m MODEL is required");
  std::string note;
  if (o.tp_exchange != "device" && o.tp_exchange != "host") {
    throw std::invalid_argument("--tp-exchange must be device or host, got '" + o.tp_exchange + "'");
  }
  o.backend = resolve_backend(backend, &note);
  if (backend == "auto") std::fprintf(stderr, "baton bench: %s\n", note.c_str());
  if (o.ctx_start < 1 || o.ctx_max < o.ctx_start) throw std::invalid_argument("need 1 <= --ctx-start <= --ctx-max");
  if (o.step_mul < 2) throw std::invalid_argument("--step-mul must be >= 2");
  if (o.gen_tokens < 1) throw std::invalid_argument("--gen-tokens must be >= 1");
  if (o.batch < 1) throw std::invalid_argument("--batch must be >= 1");
  if (o.staging_mb < 1 || o.staging_mb > 4096) throw std::invalid_argument("--staging-mb must be in 1..4096");
  if (o.n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (!parallel.empty()) o.parallel = parse_count_list(parallel, "--parallel", 1024);
  if (!verify.empty()) o.verify = parse_count_list(verify, "--verify", 64);
  if (o.draft_rounds < 0) throw std::invalid_argument("--draft-rounds must be >= 0");
  if (!mem_limit.empty()) o.mem_limit = parse_size(mem_limit);
  return o;
}

// Weight elements of the layer matrices (multiplied once per prompt token)
// and of the head matrix (once per prefill chunk: only the last row's logits).
struct FlopModel {
  double layer_weights = 0;
  double head_weights = 0;
  double attn_per_pair = 0;  // FLOPs per (query token, visible position): 2 * H * (dk + dv)

  double prefill(int64_t pos0, int64_t n, int64_t chunks) const {
    // Token t of [pos0, pos0 + n) sees pos0 + t + 1 positions.
    const double pairs = double(n) * double(pos0) + double(n) * double(n + 1) / 2.0;
    return 2.0 * layer_weights * double(n) + 2.0 * head_weights * double(chunks) + attn_per_pair * pairs;
  }
};

FlopModel flop_model(const GgufFile& f, const StageRunner& r) {
  FlopModel m;
  // Stacked expert tensors (3 dims, one slice per expert) count only the
  // experts a token uses (the usual `ARCH.expert_used_count / expert_count`).
  const std::string arch = f.get_str("general.architecture", "");
  const int64_t n_expert = f.get_int(arch + ".expert_count", 0);
  const int64_t n_used = f.get_int(arch + ".expert_used_count", 0);
  for (const auto& t : f.tensors()) {
    if (t.n_dims < 2) continue;
    if (t.name.rfind("blk.", 0) != 0) continue;
    double n = double(t.n_elements());
    if (t.n_dims == 3 && n_expert > 0 && n_used > 0) n = n * double(n_used) / double(n_expert);
    m.layer_weights += n;
  }
  const GgufTensorInfo* out = f.find_tensor("output.weight");
  if (!out) out = f.find_tensor("token_embd.weight");
  if (out) m.head_weights = double(out->n_elements());
  if (const auto* l = dynamic_cast<const LlamaFamilyArch*>(&r.arch())) {
    const LlamaHparams& hp = l->hparams();
    m.attn_per_pair = 2.0 * hp.n_head * double(hp.head_dim_k + hp.head_dim_v) * hp.n_layer;
  }
  return m;
}

// Host memory bandwidth for the CPU backend's roofline: a 1 GiB-class memcpy,
// bytes read + written, best of 3.
double host_copy_bandwidth(uint64_t bytes) {
  std::vector<uint8_t> a(bytes), b(bytes);
  for (size_t i = 0; i < a.size(); i += 4096) a[i] = uint8_t(i >> 12);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::max(best, 2.0 * double(bytes) / seconds_since(t0));
    volatile uint8_t keep = b[bytes / 2];  // the copy is used
    (void)keep;
  }
  return best;
}

struct Row {
  int64_t ctx = 0, prefill_tokens = 0, gen_tokens = 0;
  double prefill_tps = 0, gen_tps = 0, gen_gbps = 0, roofline_pct = 0, prefill_tflops = 0;
  uint64_t kv_bytes = 0, weight_bytes = 0;
};

// --draft-rounds: the drafter network's round over ctx-start random context
// rows, every round its whole block, against the one-token step `one` (s).
// On the GPU it times the round as one CUDA graph, then queued launch by
// launch (a fresh context over the same device weights), side by side. Without the block's logits, as
// serve and greedy runs draft (only the sampled verify rule reads them).
void time_draft_rounds(const BenchOptions& o, const GgufFile& file, const DsparkShape& shape, const StageRunner& r,
                       const std::function<std::vector<int32_t>(int64_t)>& random_prompt, double one) {
  const std::optional<GgufFile> sidecar = o.draft.empty() ? std::nullopt : std::optional<GgufFile>(GgufFile::open(o.draft));
  const GgufFile& df = sidecar ? *sidecar : file;
  LoadOptions load;
  load.slot_bytes = o.staging_mb << 20;
  // On the GPU the weights are loaded once; each timing gets its own context.
  const std::shared_ptr<const DsparkDeviceWeights> weights = dspark_device_weights(r, df, shape, load);
  const bool gpu = weights != nullptr;
  const int64_t F = shape.feature_width(), n = std::max<int64_t>(1, o.ctx_start);
  std::mt19937 rng(uint32_t(o.seed));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> rows(static_cast<size_t>(n * F));
  for (float& v : rows) v = dist(rng);
  const std::vector<int32_t> bonus = random_prompt(o.draft_rounds + 1);
  for (const bool graph : gpu ? std::vector<bool>{true, false} : std::vector<bool>{true}) {
    set_draft_graphs(graph);
    // Threshold 0: every round its whole block.
    const std::unique_ptr<DsparkDraftSource> source =
        gpu ? std::make_unique<DsparkDraftSource>(dspark_device_network(weights), 0.0f)
            : make_dspark_source(r, file, df, shape, load, /*on_gpu=*/false, o.n_threads, 0.0f, "baton bench");
    source->set_return_logits(false);  // as serve and greedy runs draft: tokens and confidences only
    source->committed(std::vector<int32_t>(static_cast<size_t>(n), 0), 0, rows);
    source->propose(bonus[0], n, shape.block_size);  // warm-up (and the graph's capture)
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < o.draft_rounds; ++i) source->propose(bonus[size_t(i + 1)], n, shape.block_size);
    const double t = seconds_since(t0) / double(o.draft_rounds);
    std::fprintf(stderr, "draft round on the %s%s at ctx %lld: %.2f ms (%d rows), %.2fx the one-token step (%.2f ms)\n",
                 gpu ? "GPU" : "CPU", gpu ? (graph ? " (one graph)" : " (queued)") : "", (long long)n, 1e3 * t,
                 shape.block_size, t / one, 1e3 * one);
  }
  set_draft_graphs(true);
}

int bench(const BenchOptions& o) {
  const uint64_t rss_start = current_rss_bytes();  // before any device work
  if (std::string why = backend_unavailable(o.backend); !why.empty()) throw CommandError(why, kExitRefused);
  if (o.no_pdl) set_programmatic_launch(false);
  if (o.profile) set_stage_profiling(true);
  GgufFile file = about_file(o.model, [&] { return GgufFile::open(o.model); });
  // The drafter --draft-rounds times, found before the load.
  const std::optional<DsparkShape> drafter_shape = o.draft_rounds > 0 ? dspark_find(file, o.draft) : std::nullopt;
  if (o.draft_rounds > 0 && !drafter_shape) {
    throw std::invalid_argument("--draft-rounds: " + o.model + " has no DSpark drafter (--draft FILE names a sidecar)");
  }
  StageConfig sc;
  int64_t tail = o.gen_tokens;  // past the deepest prompt: the generated tokens, or --verify's forwards
  for (const int64_t k : o.verify) tail = std::max(tail, 4 * k);
  if (o.draft_rounds > 0) tail = std::max<int64_t>(tail, 4);  // the one-token steps it is set against
  sc.n_ctx = o.ctx_max + tail;
  sc.max_batch = std::min(o.batch, sc.n_ctx);
  sc.n_threads = o.n_threads;
  // With --draft-rounds the stage also runs the verify steps as drafting runs
  // them (ForwardRows with the drafter's capture, every row's logits and the
  // checkpoint), so it plans those rows and captures the drafter's layers.
  if (drafter_shape) {
    int64_t rows = drafter_shape->block_size + 1;
    for (const int64_t k : o.verify) rows = std::max(rows, k);
    sc.verify_rows = std::min(rows, sc.max_batch);
    sc.capture_layers = drafter_shape->target_layer_ids;
  }
  for (int64_t n : o.parallel) sc.n_seq = std::max(sc.n_seq, int(n));
  // A rank file runs only inside its group; --tp-alone gives it a group of its own.
  std::unique_ptr<TpComm> lone;
  if (file.has(tp_keys::kSize)) {
    const int64_t rank = file.get_int(tp_keys::kRank, 0), size = file.get_int(tp_keys::kSize, 0);
    if (!o.tp_alone) {
      throw std::invalid_argument(fmt::format(
          "{} is tensor-parallel rank {} of {} (baton split --tp), which runs only beside its other ranks; "
          "--tp-alone times that one rank alone",
          o.model, rank, size));
    }
    if (size < 2 || size > kMaxTpRanks || rank < 0 || rank >= size) {
      throw std::invalid_argument(fmt::format("{}: tensor-parallel rank {} of {} is out of range", o.model, rank, size));
    }
    if (o.backend == Backend::Cuda && o.tp_exchange == "device") {
#if BATON_HAVE_CUDA
      lone = make_cuda_lone_rank(int(rank), int(size));
#endif
    } else {
      lone = std::make_unique<LoneTpRank>(int(rank), int(size));
    }
    sc.tp = lone.get();
    std::fprintf(stderr,
                 "baton bench: tensor-parallel rank %lld of %lld alone: each sum keeps this rank's partial rows and "
                 "the gather fills the other ranks' logits with zeros (no network; the tokens are not the "
                 "model's)\n",
                 (long long)rank, (long long)size);
  } else if (o.tp_alone) {
    throw std::invalid_argument(o.model + " is not a tensor-parallel rank file (baton split --tp): --tp-alone takes one");
  }
  if (const std::optional<PartInfo> part = read_part_info(file)) {
    sc.first_layer = part->range.first;
    sc.last_layer = part->range.last;
    sc.embedding = part->has_embedding;
    sc.head = part->has_output;
    if (!o.load_only && !(sc.embedding && sc.head)) {
      throw std::invalid_argument(o.model + " holds layers " + layer_range_text(sc.first_layer, sc.last_layer) +
                                  " without the embedding or the head: only --load-only can measure it");
    }
  }
  LoadOptions load;
  load.slot_bytes = o.staging_mb << 20;
  const MemoryPlan dry = about_file(o.model, [&] { return plan_stage_runner(o.backend, file, sc, load); });
  std::fprintf(stderr, "plan (%s):\n%s", backend_name(o.backend), dry.to_string().c_str());
  if (std::string why = memory_limit_problem(o.backend, dry, o.mem_limit); !why.empty()) {
    throw std::runtime_error(why);
  }
  if (o.mem_limit) {
    std::fprintf(stderr, "--mem-limit %s: the plan's %s fit\n", format_size(o.mem_limit).c_str(),
                 format_size(plan_bytes_under_limit(o.backend, dry)).c_str());
  }

  // Ceilings first, with their own buffers, so the stage's memory reading
  // sees only the stage.
  DeviceCeilings ceil;
  if (o.backend == Backend::Cuda) {
    ceil = measure_device_ceilings(o.copy_mb << 20, !o.load_only);
  } else {
    ceil.device = "cpu";
    ceil.copy_bytes_per_s = host_copy_bandwidth(std::min<uint64_t>(o.copy_mb, 1024) << 20);
  }
  double read_bps = 0;
  bool read_direct = false;
  if (o.read_mb > 0) read_bps = measure_file_read(o.model, o.read_mb << 20, load.slot_bytes, &read_direct);
  const std::string gemm = ceil.bf16_flops_per_s > 0 ? fmt::format("{:.0f} TFLOP/s", ceil.bf16_flops_per_s / 1e12)
                                                     : std::string("not measured (--load-only)");
  std::fprintf(stderr,
               "ceilings on %s: copy %.0f GB/s (read + write), host-to-device %.1f GB/s, bf16 GEMM %s, "
               "file read %.2f GB/s%s\n",
               ceil.device.c_str(), ceil.copy_bytes_per_s / 1e9, ceil.h2d_bytes_per_s / 1e9, gemm.c_str(),
               read_bps / 1e9, read_direct ? " (O_DIRECT)" : "");

  // Where the process's host memory stands before the stage exists (the
  // CUDA context and libraries are most of it on a GPU).
  std::fprintf(stderr, "host RSS: %.0f MiB at start, %.0f MiB after the ceilings (the %s backend's runtime)\n",
               double(rss_start) / 1048576.0, double(current_rss_bytes()) / 1048576.0, backend_name(o.backend));
  load.progress = stderr_load_progress(o.model);
  std::unique_ptr<StageRunner> runner = make_stage_runner(o.backend, file, sc, load);
  StageRunner& r = *runner;
  std::fprintf(stderr, "%s\n", load_summary(r).c_str());
  const LoadStats& ls = r.load_stats();
  const double load_ceiling = o.backend == Backend::Cuda && read_bps > 0 ? std::min(read_bps, ceil.h2d_bytes_per_s)
                                                                         : read_bps;
  if (load_ceiling > 0) {
    std::fprintf(stderr, "load: %.2f GB/s = %.0f%% of min(file read, host-to-device) = %.2f GB/s\n", ls.gbps(),
                 100.0 * ls.gbps() * 1e9 / load_ceiling, load_ceiling / 1e9);
  }
  if (!o.load_csv.empty()) {
    const DeviceMemoryReport m = r.device_memory();
    std::string out = "model,backend,weights_bytes,load_seconds,load_gbps,direct_io,file_read_gbps,h2d_gbps,staging_bytes,"
                    "rss_before_bytes,rss_peak_bytes,rss_peak_reset,plan_device_bytes,device_allocated_bytes,"
           "device_measured_bytes\n";
    out += fmt::format("{},{},{},{:.3f},{:.3f},{},{:.3f},{:.3f},{},{},{},{},{},{},{}\n", o.model,
                       backend_name(o.backend), ls.bytes, ls.seconds, ls.gbps(), int(ls.direct_io), read_bps / 1e9,
                       ceil.h2d_bytes_per_s / 1e9, ls.staging_bytes, ls.rss_before, ls.rss_peak,
                       int(ls.rss_peak_reset), m.planned, m.allocated, m.measured);
    TempFile csv(o.load_csv);  // exclusive, beside the target, renamed when complete
    csv.write(out.data(), out.size());
    csv.commit();
  }
  if (o.load_only) return 0;

  const FlopModel flops = flop_model(file, r);
  const int64_t V = r.n_vocab();
  std::mt19937_64 rng(o.seed);
  auto random_prompt = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint64_t(V));
    return t;
  };
  // Prefill in chunks; returns seconds. Every chunk ends with a greedy id
  // (synchronized), so the time is the device's.
  auto prefill = [&](const std::vector<int32_t>& prompt, int32_t* next) {
    const auto t0 = Clock::now();
    for (size_t at = 0; at < prompt.size(); at += size_t(r.max_batch())) {
      const size_t n = std::min(prompt.size() - at, size_t(r.max_batch()));
      *next = r.forward_greedy(0, std::span<const int32_t>(prompt.data() + at, n));
    }
    return seconds_since(t0);
  };
  auto generate = [&](int64_t n, int32_t next) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) next = r.forward_greedy(0, std::span<const int32_t>(&next, 1));
    return seconds_since(t0);
  };

  // Warm-up: library heuristics, lazy module loading, first graph replays.
  {
    int32_t next = 0;
    prefill(random_prompt(std::min<int64_t>(r.max_batch(), o.ctx_start)), &next);
    generate(std::min<int64_t>(8, o.gen_tokens), next);
    r.reset(0);
  }

  std::vector<Row> rows;
  // KV bytes at a context, from the arch's own streams (per-layer windows and
  // compressed rows for deepseek4, n_ctx rows per stream for llama).
  const LayerRange range{r.config().first_layer, r.config().last_layer};
  auto kv_bytes_at = [&](int64_t n) { return KvCache::bytes_needed(r.arch(), range, 1, n); };
  for (int64_t ctx = o.ctx_start; ctx <= o.ctx_max; ctx *= o.step_mul) {
    r.reset(0);
    const auto prompt = random_prompt(ctx);
    int32_t next = 0;
    const double tp = prefill(prompt, &next);
    const double tg = generate(o.gen_tokens, next);
    Row row;
    row.ctx = ctx;
    row.prefill_tokens = ctx;
    row.gen_tokens = o.gen_tokens;
    row.prefill_tps = double(ctx) / tp;
    row.gen_tps = double(o.gen_tokens) / tg;
    row.kv_bytes = kv_bytes_at(ctx + o.gen_tokens);
    row.weight_bytes = r.weight_bytes_per_token();
    row.gen_gbps = double(row.weight_bytes) * row.gen_tps / 1e9;
    row.roofline_pct = ceil.copy_bytes_per_s > 0 ? 100.0 * row.gen_gbps * 1e9 / ceil.copy_bytes_per_s : 0.0;
    const int64_t chunks = (ctx + r.max_batch() - 1) / r.max_batch();
    row.prefill_tflops = flops.prefill(0, ctx, chunks) / tp / 1e12;
    rows.push_back(row);
    std::fprintf(stderr,
                 "ctx %6lld: prefill %8.0f tok/s (%.0f TFLOP/s, %.0f%% of bf16 %.0f), decode %7.1f tok/s, %.0f GB/s "
                 "of weights = %.1f%% of copy %.0f GB/s\n",
                 (long long)ctx, row.prefill_tps, row.prefill_tflops,
                 ceil.bf16_flops_per_s > 0 ? 100.0 * row.prefill_tflops * 1e12 / ceil.bf16_flops_per_s : 0.0,
                 ceil.bf16_flops_per_s / 1e12, row.gen_tps, row.gen_gbps, row.roofline_pct,
                 ceil.copy_bytes_per_s / 1e9);
  }

  // N sequences at once: each prefilled alone, then decode steps of N rows.
  for (const int64_t n_par : o.parallel) {
    std::vector<int32_t> next(static_cast<size_t>(n_par));
    for (int64_t q = 0; q < n_par; ++q) {
      r.reset(int(q));
      const auto prompt = random_prompt(o.ctx_start);
      for (size_t at = 0; at < prompt.size(); at += size_t(r.max_batch())) {
        const size_t n = std::min(prompt.size() - at, size_t(r.max_batch()));
        next[size_t(q)] = r.forward_greedy(int(q), std::span<const int32_t>(prompt.data() + at, n));
      }
    }
    std::vector<BatchChunk> chunks;
    for (int64_t q = 0; q < n_par; ++q) chunks.push_back({int(q), 1, true});
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < o.gen_tokens; ++i) {
      const std::span<const int32_t> ids = r.forward_batch_greedy(chunks, next);
      std::copy(ids.begin(), ids.end(), next.begin());
    }
    const double tg = seconds_since(t0);
    std::fprintf(stderr, "parallel %lld at ctx %lld: decode %.1f tok/s aggregate (%.1f per sequence), %.2f ms a step\n",
                 (long long)n_par, (long long)o.ctx_start, double(n_par * o.gen_tokens) / tg, double(o.gen_tokens) / tg,
                 1e3 * tg / double(o.gen_tokens));
  }

  // Verify-shaped forwards: K tokens of one sequence per forward, against
  // one-token steps of the same sequence at the same depth.
  auto per_forward = [&](int64_t k) {
    r.reset(0);
    int32_t next = 0;
    prefill(random_prompt(o.ctx_start), &next);
    const int64_t steps = std::max<int64_t>(4, o.gen_tokens / k);
    if (o.ctx_start + steps * k > r.n_ctx()) {
      throw std::invalid_argument(fmt::format("--verify {}: {} forwards past ctx-start {} exceed the context {}", k,
                                              steps, o.ctx_start, r.n_ctx()));
    }
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      std::vector<int32_t> ids = random_prompt(k);
      ids[0] = next;
      next = r.forward_greedy(0, ids);
    }
    return seconds_since(t0) / double(steps);
  };
  // A drafting step's forward as run and serve make it: the capture, and for
  // K > 1 every row's logits and the checkpoint, then the cut back to one kept
  // row (each step one position deeper). K = 1 is a step the pacer keeps plain.
  auto per_drafting_step = [&](int64_t k) {
    r.reset(0);
    int32_t next = 0;
    prefill(random_prompt(o.ctx_start), &next);
    const int64_t steps = std::max<int64_t>(4, o.gen_tokens / k);
    ForwardOptions fo;
    fo.capture = true;
    fo.all_logits = fo.checkpoint = k > 1;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      std::vector<int32_t> ids = random_prompt(k);
      ids[0] = next;
      const int64_t n = r.position(0);
      const ForwardRows rows = r.forward_rows(0, ids, fo);
      next = int32_t(std::max_element(rows.out.begin(), rows.out.begin() + r.n_vocab()) - rows.out.begin());
      if (k > 1) r.truncate_seq(0, n + 1);
    }
    return seconds_since(t0) / double(steps);
  };
  if (!o.verify.empty() || o.draft_rounds > 0) {
    const double one = per_forward(1);
    for (const int64_t k : o.verify) {
      const double t = k == 1 ? one : per_forward(k);
      std::fprintf(stderr, "verify %lld at ctx %lld: %.2f ms a forward, %.2fx the one-token step (%.2f ms)\n",
                   (long long)k, (long long)o.ctx_start, 1e3 * t, t / one, 1e3 * one);
    }
    if (o.draft_rounds > 0 && r.speculative()) {
      std::vector<int64_t> ks = {1};
      for (const int64_t k : o.verify) {
        if (k > 1 && k <= sc.verify_rows) ks.push_back(k);
      }
      for (const int64_t k : ks) {
        const double t = per_drafting_step(k);
        std::fprintf(stderr,
                     "drafting step of %lld rows at ctx %lld (capture%s): %.2f ms, %.2fx the one-token step\n",
                     (long long)k, (long long)o.ctx_start, k > 1 ? ", every row's logits, checkpoint, cut back" : "",
                     1e3 * t, t / one);
      }
    }
    if (drafter_shape) time_draft_rounds(o, file, *drafter_shape, r, random_prompt, one);
  }

  if (o.csv) {
    std::printf(
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kv_bytes,weights_bytes_per_token,gen_gbps,"
        "roofline_pct,prefill_tflops,bf16_tflops,copy_gbps\n");
    for (const auto& w : rows) {
      std::printf("%lld,%lld,%.2f,%lld,%.2f,%llu,%llu,%.2f,%.2f,%.2f,%.2f,%.1f\n", (long long)w.ctx,
                  (long long)w.prefill_tokens, w.prefill_tps, (long long)w.gen_tokens, w.gen_tps,
                  (unsigned long long)w.kv_bytes, (unsigned long long)w.weight_bytes, w.gen_gbps, w.roofline_pct,
                  w.prefill_tflops, ceil.bf16_flops_per_s / 1e12, ceil.copy_bytes_per_s / 1e9);
    }
  } else {
    std::printf("%8s %10s %12s %8s %10s %12s %10s %10s %9s %10s\n", "ctx", "prefill", "prefill t/s", "gen",
                "gen t/s", "kv MiB", "w MiB/tok", "gen GB/s", "roofline", "TFLOP/s");
    for (const auto& w : rows) {
      std::printf("%8lld %10lld %12.1f %8lld %10.1f %12.1f %10.1f %10.1f %8.1f%% %10.1f\n", (long long)w.ctx,
                  (long long)w.prefill_tokens, w.prefill_tps, (long long)w.gen_tokens, w.gen_tps,
                  double(w.kv_bytes) / 1048576.0, double(w.weight_bytes) / 1048576.0, w.gen_gbps, w.roofline_pct,
                  w.prefill_tflops);
    }
  }
  return 0;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  // `--serve` before any `--` selects the load benchmark through the API.
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    if (std::string_view(argv[i]) == "--serve") return cmd_bench_serve(argc, argv);
  }
  auto o = parse(argc, argv);
  if (!o || parse_only()) return 0;
  return bench(*o);
}

}  // namespace baton
