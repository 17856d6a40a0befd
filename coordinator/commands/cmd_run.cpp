// `baton run`: generate text from a prompt with the whole model on this
// machine (one Stage over every layer, with the embedding and the head), or
// with --workers K through a local cluster of K worker processes, one
// pipeline stage each (coordinator/cluster/local_cluster.h).
#include <unistd.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "coordinator/commands/commands.h"
#include "coordinator/commands/draft_options.h"
#include "coordinator/commands/model_choice.h"
#include "coordinator/commands/load_report.h"
#include "coordinator/cluster/cluster_config.h"
#include "coordinator/cluster/local_cluster.h"
#include "engine/base/command_line.h"
#include "engine/model/part_info.h"
#include "engine/plan/node_plan.h"
#include "engine/runtime/backend.h"
#include "engine/base/command_error.h"
#include "engine/model/layer_range_text.h"
#include "engine/gguf/file.h"
#include "engine/sampling/sampler.h"
#include "engine/runtime/stage.h"
#include "engine/dspark/dspark_device.h"
#include "engine/dspark/dspark_source.h"
#include "engine/dspark/dspark_weights.h"
#include "engine/spec/draft_pacer.h"
#include "engine/spec/forced_draft.h"
#include "engine/spec/speculative.h"
#include "engine/text/tokenizer.h"
#include "net/log.h"
#include "net/log_options.h"

namespace baton {

namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

constexpr const char* kDefaultPrompt = "Once upon a time";
constexpr int kDefaultTokens = 64;

struct RunOptions {
  std::string model;
  std::string prompt = kDefaultPrompt;
  int n_predict = kDefaultTokens;
  SamplerParams sampling;
  int64_t n_ctx = 0;
  int n_threads = 1;
  int64_t batch = 64;
  bool json = false;
  bool ignore_eos = false;   // --ignore-eos: generate past end-of-generation tokens (benchmarks)
  bool seed_given = false;   // else a sampled run picks a random seed and reports it
  Backend backend = Backend::Cpu;
  std::string backend_note;  // with --backend auto: which one, and why
  uint64_t staging_mb = 64;
  std::string draft;  // --draft: the DSpark drafter's sidecar
  bool progress = false;
  int workers = 0;  // > 0: run through a local cluster of this many worker processes
  int tp = 1;       // > 1: each of the `workers` stages on this many ranks (rank files made for the run)
  std::string parts_text;
  std::string config;
  int threads_per_worker = 0;
  std::vector<std::string> parts;  // split parts, one worker each
  int worker_delay_ms = 0;
  std::string worker_fault;  // with --workers: the workers' --fault (tests)
  std::string link = "auto";  // stage links with --workers: auto, tcp, nccl
  uint64_t mem_limit = 0;           // --mem-limit: the stage's (or each worker's) cap; 0 none
  std::vector<uint64_t> worker_mem_limits;  // from a config's [[node]] memory, one per worker
  std::string draft_test = "none";  // --draft-test: speculative decoding with a test draft source
  DraftChoice drafting;             // --no-draft, --draft-max (also --draft-test's), --draft-threshold
  bool cpu_drafter = false;         // --cpu-drafter: draft on the CPU beside a CUDA target
};

// Loading progress is worth a line on stderr for real models, or when asked.
constexpr uint64_t kProgressMinBytes = uint64_t(256) << 20;

const std::string kUsage =
    "usage: baton run [[-m] MODEL] [-p PROMPT] [-n N] [options]\n\n"
    "Generates text from a prompt with the whole model on this machine. Prints the\n"
    "prompt, then the generated text as it comes; stops after N tokens, at an\n"
    "end-of-generation token, or when the context is full.\n\n"
    "Without -m: $BATON_MODEL, else " + std::string(kDefaultModelRel) + " (relative to the\n"
    "current folder, then to the checkout the binary was built in), else a small\n"
    "built-in synthetic model with random weights.\n\n";

// Parses argv; returns nullopt when --help was printed.
std::optional<RunOptions> parse(int argc, char** argv) {
  RunOptions r;
  std::string backend = "auto", mem_limit;
  net::LogOptions log;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  po::options_description desc("options");
  // clang-format off
  desc.add_options()
      ("help,h", "print this help and exit")
      ("model,m", po::value<std::string>(&r.model), "GGUF model file (default: see above)")
      ("prompt,p", po::value<std::string>(&r.prompt)->default_value(kDefaultPrompt),
       "the prompt text (BOS is added when the vocabulary asks for it)")
      ("n-predict,n", po::value<int>(&r.n_predict)->default_value(kDefaultTokens),
       "tokens to generate at most; -1 = until the context is full")
      ("ignore-eos", po::bool_switch(&r.ignore_eos),
       "keep generating past end-of-generation tokens (benchmarks: always -n tokens)")
      ("temp", po::value<float>(&r.sampling.temperature)->default_value(0.8f, "0.8"),
       "sampling temperature, 0..2; 0 = greedy (always the most likely token)")
      ("seed", po::value<uint64_t>(&r.sampling.seed),
       "random seed: the same seed gives the same text on every machine (default: a random one, "
       "printed with the stats)")
      ("top-k", po::value<int>(&r.sampling.top_k)->default_value(40),
       "sample among the K most likely tokens; 0 = all")
      ("top-p", po::value<float>(&r.sampling.top_p)->default_value(0.95f, "0.95"),
       "then keep the most likely tokens until their probability reaches P; 1 = all")
      ("min-p", po::value<float>(&r.sampling.min_p)->default_value(0.05f, "0.05"),
       "then drop tokens less likely than P times the best one; 0 = none")
      ("ctx", po::value<int64_t>(&r.n_ctx)->default_value(0),
       "context length in tokens (KV cache size); 0 = the model's, at most 4096; beyond the model's "
       "trained context a warning")
      ("threads,t", po::value<int>(&r.n_threads)->default_value(hw),
       "CPU threads for the forward pass (default: all cores)")
      ("batch,b", po::value<int64_t>(&r.batch)->default_value(64),
       "prompt tokens per forward pass during prefill")
      ("backend", po::value<std::string>(&backend)->default_value("auto"),
       "auto (the GPU when one is usable, else the CPU; -v logs which), cpu, or cuda (the first GPU; "
       "refused with exit status 2 when the build has no CUDA or no GPU is present)")
      ("staging-mb", po::value<uint64_t>(&r.staging_mb)->default_value(64),
       "MiB of each of the loader's 4 staging buffers (pinned host memory with --backend cuda)")
      ("draft", po::value<std::string>(&r.draft),
       "DeepSeek V4: the DSpark drafter's sidecar GGUF (general.architecture deepseek4-dspark); checked "
       "before loading, every tensor by name and shape (default: the model file's own mtp.* drafter, if any)")
      ("progress", po::bool_switch(&r.progress),
       "show loading progress on stderr (always shown for models of 256 MiB or more)")
      ("workers", po::value<int>(&r.workers)->default_value(0),
       "run as a local cluster: K worker processes on loopback, one pipeline stage each "
       "(layers split by weight bytes); 0 = in this process")
      ("tp", po::value<int>(&r.tp)->default_value(1),
       "tensor-parallel ranks per stage: each of the --workers stages (default 1) runs on N local worker "
       "processes, each holding 1/N of every layer of the stage, the rank files written for the run into "
       "$TMPDIR (or give rank files of `baton split --tp N` with --parts)")
      ("config", po::value<std::string>(&r.config),
       "cluster topology file (TOML, configs/; local clusters only — remote workers are served with "
       "baton serve --config); options given here override it")
      ("parts", po::value<std::string>(&r.parts_text),
       "comma-separated split parts (from `baton split`): one local worker each, stages follow the parts "
       "(implies --workers; -m defaults to the first part)")
      ("threads-per-worker", po::value<int>(&r.threads_per_worker)->default_value(0),
       "with --workers: CPU threads of each worker; 0 = --threads divided by the workers (a worker models "
       "one node: give each all cores to compare one stream on K nodes with one node)")
      ("link", po::value<std::string>(&r.link)->default_value("auto"),
       "with --workers: how activations cross each stage link: auto (NCCL where both GPUs can, else TCP), "
       "tcp, or nccl (refuse to start when a link cannot use NCCL)")
      ("mem-limit", po::value<std::string>(&mem_limit),
       "most memory the stage's plan may use, e.g. 97887MiB (device lines with --backend cuda): refused "
       "before loading when the plan is larger; with --workers, each worker's cap (a config's [[node]] "
       "memory gives one per worker)")
      ("worker-fault", po::value<std::string>(&r.worker_fault),
       "with --workers: inject a fault into every worker, for tests (baton worker --fault)")
      ("worker-delay-ms", po::value<int>(&r.worker_delay_ms)->default_value(0),
       "with --workers: each worker sleeps this long before every step (models slow nodes; for tests)")
      ("draft-test", po::value<std::string>(&r.draft_test)->default_value("none"),
       "speculative decoding with a test draft source (docs/SPECULATIVE.md), one process, --temp 0, the CPU "
       "backend unless --backend names another: "
       "forced-accept (guesses the model's own greedy output, from a plain run first), forced-reject "
       "(guesses it never picks) or forced-prefix (right for a random number of guesses); the text is the "
       "plain run's (on a GPU the run ends where a verify row picks unlike the decode step, and says so); "
       "none = plain decoding")
      ("cpu-drafter", po::bool_switch(&r.cpu_drafter),
       "with --backend cuda: draft with the DSpark drafter on the CPU beside the GPU target, from the rows the "
       "target captures, with a host copy of its embedding and head (correct but slow for big models)")
      ("json", po::bool_switch(&r.json),
       "print one JSON object at the end instead of streaming text: prompt_tokens, tokens, "
       "text, n_prompt, n_gen, prefill/decode tokens per second, top_logits after the prompt, "
       "memory plan");
  // clang-format on
  add_draft_options(desc, r.drafting);
  net::add_log_options(desc, log, "warn: warnings, then one line of figures");
  // The model may also come first, as llama.cpp's tools take it.
  po::positional_options_description positional;
  positional.add("model", 1);
  const auto parsed = parse_command_line(argc, argv, {.options = desc, .help_head = kUsage, .positional = &positional});
  if (!parsed) return std::nullopt;
  const po::variables_map& vm = *parsed;
  net::apply_log_options(log, net::LogLevel::warn);
  if (r.n_predict < -1) throw std::invalid_argument("-n must be >= 0, or -1 for until the context is full");
  check_sampling_flags(r.sampling);
  r.seed_given = vm.count("seed") > 0;
  if (!r.seed_given) r.sampling.seed = random_seed();
  if (r.n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (r.batch < 1) throw std::invalid_argument("--batch must be >= 1");
  if (r.n_ctx < 0) throw std::invalid_argument("--ctx must be >= 0");
  if (r.workers < 0) throw std::invalid_argument("--workers must be >= 0");
  if (!r.config.empty()) {
    const ClusterConfig c = load_cluster_config(r.config);
    if (!c.local) {
      throw std::invalid_argument(r.config + ": a cluster of remote workers is served with baton serve --config");
    }
    if (r.model.empty()) r.model = c.model;
    if (vm["tp"].defaulted()) r.tp = c.tp;
    if (vm["workers"].defaulted() && r.parts_text.empty()) {
      r.workers = c.workers;
      for (size_t i = 0; i < c.parts.size(); ++i) r.parts_text += (i ? "," : "") + c.parts[i];
    }
    if (c.ctx > 0 && vm["ctx"].defaulted()) r.n_ctx = c.ctx;
    if (c.batch > 0 && vm["batch"].defaulted()) r.batch = c.batch;
    if (vm["link"].defaulted()) r.link = c.link;
    if (c.nodes.size() == size_t(r.workers)) {
      for (const NodeSpec& n : c.nodes) r.worker_mem_limits.push_back(n.memory_bytes);
    }
    if (c.node_backend && vm["backend"].defaulted()) backend = backend_name(*c.node_backend);
  }
  if (!mem_limit.empty()) r.mem_limit = parse_size(mem_limit);
  if (!net::link_mode_from_name(r.link)) throw std::invalid_argument("--link must be auto, tcp or nccl, got '" + r.link + "'");
  if (!r.parts_text.empty()) {
    std::stringstream list(r.parts_text);
    for (std::string item; std::getline(list, item, ',');) {
      if (!item.empty()) r.parts.push_back(item);
    }
    if (vm["workers"].defaulted()) r.workers = int(r.parts.size());
    if (r.parts.empty() || r.workers != int(r.parts.size())) {
      throw std::invalid_argument("--parts needs one file per worker (--workers must equal their number)");
    }
    if (r.model.empty()) r.model = r.parts.front();
  }
  if (r.tp < 1 || r.tp > int(net::kMaxGroupRanks)) {
    throw std::invalid_argument("--tp must be in 1.." + std::to_string(net::kMaxGroupRanks));
  }
  if (r.tp > 1) {
    if (!r.parts.empty()) {
      throw std::invalid_argument("--tp makes rank files from the model; rank files of baton split --tp go to --parts without it");
    }
    if (r.workers == 0) r.workers = 1;  // one stage of N ranks
  }
  if (r.worker_delay_ms < 0) throw std::invalid_argument("--worker-delay-ms must be >= 0");
  if (r.threads_per_worker < 0) throw std::invalid_argument("--threads-per-worker must be >= 0");
  if (r.staging_mb < 1 || r.staging_mb > 4096) throw std::invalid_argument("--staging-mb must be in 1..4096");
  if (r.draft_test != "none") {
    if (r.draft_test != "forced-accept" && r.draft_test != "forced-reject" && r.draft_test != "forced-prefix") {
      throw std::invalid_argument("--draft-test must be none, forced-accept, forced-reject or forced-prefix, got '" +
                                  r.draft_test + "'");
    }
    if (r.sampling.temperature != 0) {
      throw std::invalid_argument("--draft-test checks the greedy output: give --temp 0");
    }
    if (r.workers > 0) throw std::invalid_argument("--draft-test runs in one process (no --workers)");
    if (vm["backend"].defaulted()) backend = "cpu";
  }
  check_draft_options(r.drafting);
  if (r.cpu_drafter && r.drafting.on_gpu) throw std::invalid_argument("--cpu-drafter and --gpu-drafter: give one");
  for (const auto& [on, name] : {std::pair{r.cpu_drafter, "--cpu-drafter"}, std::pair{r.drafting.on_gpu, "--gpu-drafter"}}) {
    if (on && (r.workers > 0 || !r.parts.empty())) {
      throw std::invalid_argument(std::string(name) + " runs with the whole model in this process (no --workers or --parts)");
    }
  }
  if (!r.draft.empty() && (r.workers > 0 || !r.parts.empty())) {
    throw std::invalid_argument("--draft runs with the whole model in this process (no --workers or --parts)");
  }
  r.backend = resolve_backend(backend, &r.backend_note);
  return r;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What the decode loop produced.
struct Generated {
  std::vector<int32_t> tokens;
  std::string text;
  std::string stop = "length";
  int decode_steps = 0;
  double decode_s = 0;
  int64_t departed_at = -1;  // --draft-test on a GPU: where the run left the plain output
};

// The decode loop shared by the in-process and the distributed run: takes
// `first`, the token sampled after the prompt, then feeds each kept token to
// `next` (which returns the following one) until n_predict tokens, an
// end-of-generation token, or `context_full()` before a step. Streams the
// text to stdout unless --json.
Generated generate(const RunOptions& opt, const Tokenizer& tok, int32_t first,
                   const std::function<bool()>& context_full, const std::function<int32_t(int32_t)>& next) {
  Generated g;
  const auto t0 = std::chrono::steady_clock::now();
  int32_t id = first;
  const auto wanted = [&] { return opt.n_predict < 0 || int(g.tokens.size()) < opt.n_predict; };
  while (wanted()) {
    if (tok.is_eog(id) && !opt.ignore_eos) {
      g.stop = "end of generation";
      break;
    }
    g.tokens.push_back(id);
    std::string piece = tok.token_to_piece(id);
    g.text += piece;
    if (!opt.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (!wanted()) break;
    if (context_full()) {
      g.stop = "context full";
      break;
    }
    id = next(id);
    ++g.decode_steps;
  }
  g.decode_s = seconds_since(t0);
  return g;
}

// The prompt again from an empty sequence, decoded with `draft`'s guesses
// and streamed (docs/SPECULATIVE.md); `capture` hands the stage's captured
// rows to the source (a DSpark drafter reads them).
// The run's length and end-of-generation tokens for the speculative loop.
SpecOptions spec_options(const RunOptions& opt, const Tokenizer& tok, int32_t n_vocab) {
  SpecOptions o;
  o.n_predict = opt.n_predict;
  if (!opt.ignore_eos) {
    for (int32_t id = 0; id < n_vocab; ++id) {
      if (tok.is_eog(id)) o.stop_tokens.push_back(id);
    }
  }
  return o;
}

// `pacer` (null: every step drafts) pauses drafting where it does not pay.
Generated generate_speculative(const RunOptions& opt, const Tokenizer& tok, StageRunner& stage,
                               const std::vector<int32_t>& prompt, DraftSource& draft, bool capture,
                               SpecStats* stats, DraftPacer* pacer = nullptr) {
  const int32_t n_vocab = int32_t(stage.n_vocab());
  SpecOptions o = spec_options(opt, tok, n_vocab);
  o.max_draft = opt.drafting.max;
  o.capture = capture;
  o.pacer = pacer;
  Generated g;
  // Decode time runs from the first token (sampled after the prefill), as
  // in generate(); the rate counts the tokens after it.
  std::optional<std::chrono::steady_clock::time_point> first;
  o.on_token = [&](int32_t id) {
    if (!first) first = std::chrono::steady_clock::now();
    const std::string piece = tok.token_to_piece(id);
    g.text += piece;
    if (!opt.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  };
  stage.reset(0);
  Sampler sampler(opt.sampling, n_vocab);
  const SpecResult r = speculative_generate(stage, 0, prompt, sampler, draft, o);
  g.decode_s = first ? seconds_since(*first) : 0.0;
  g.decode_steps = int(std::max<size_t>(r.tokens.size(), 1) - 1);
  g.tokens = r.tokens;
  g.stop = r.stop == "stop token" ? "end of generation" : r.stop;
  *stats = r.stats;
  return g;
}

// --draft-test: the plain greedy output first (the test draft sources guess
// from it), then the same prompt again with drafts, streamed; the drafted
// run's output, which equals the plain one token for token.
Generated generate_draft_test(const RunOptions& opt, const Tokenizer& tok, StageRunner& stage,
                              const std::vector<int32_t>& prompt, SpecStats* stats) {
  struct NoDraft final : DraftSource {
    Draft propose(int32_t, int64_t, int) override { return {}; }
    void committed(std::span<const int32_t>, int64_t, std::span<const float>) override {}
  };
  const int32_t n_vocab = int32_t(stage.n_vocab());
  SpecOptions o = spec_options(opt, tok, n_vocab);
  o.max_draft = 0;
  NoDraft none;
  Sampler plain(opt.sampling, n_vocab);
  stage.reset(0);
  const std::vector<int32_t> reference = speculative_generate(stage, 0, prompt, plain, none, o).tokens;
  using Mode = ForcedDraft::Mode;
  const Mode mode = opt.draft_test == "forced-accept"   ? Mode::Accept
                    : opt.draft_test == "forced-reject" ? Mode::Reject
                                                        : Mode::Prefix;
  // On the CPU a departure from the plain output is a bug and throws; on a
  // GPU the verify rows run other kernels than the decode steps
  // (docs/SPECULATIVE.md), so a pick can round differently: the run ends
  // there and its figures cover the tokens before it.
  const bool cpu = stage.backend() == Backend::Cpu;
  ForcedDraft draft(mode, int64_t(prompt.size()), reference, n_vocab, opt.sampling.seed, /*end_at_departure=*/!cpu);
  Generated g = generate_speculative(opt, tok, stage, prompt, draft, false, stats);
  if (draft.departed_at() >= 0) {
    g.stop = "left the plain output";
    g.departed_at = draft.departed_at();
    std::fprintf(stderr,
                 "--draft-test %s: the drafted run left the plain greedy output at position %lld, after %zu tokens "
                 "(the %s backend's verify rows and decode steps picked differently there); the figures cover "
                 "the tokens before it\n",
                 opt.draft_test.c_str(), (long long)g.departed_at, g.tokens.size(),
                 backend_name(stage.backend()));
  }
  return g;
}

// The prompt's tokens, refused when there are none or more than the context
// holds.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& prompt, int64_t n_ctx) {
  std::vector<int32_t> ids = tok.encode(prompt, /*add_special=*/true, /*parse_special=*/false);
  if (ids.empty()) throw std::runtime_error("the prompt gives no tokens");
  if (int64_t(ids.size()) > n_ctx) {
    throw std::runtime_error("the prompt has " + std::to_string(ids.size()) + " tokens; the context holds " +
                             std::to_string(n_ctx) + " (see --ctx)");
  }
  return ids;
}

// What both runs say at the end.
struct RunResult {
  const std::string& model_path;
  const std::string& arch;
  int64_t n_ctx;
  const std::vector<int32_t>& prompt;
  double prefill_s;
  const Generated& gen;
};

// With --json one object: what both runs report, plus the keys `add_json`
// sets (the keys come out sorted, so where they are added does not matter).
// Else the line that ends the streamed text, and the rates on stderr with
// `rates_tail` before the closing bracket.
void report_run(const RunOptions& opt, const RunResult& r, const std::function<void(nlohmann::json&)>& add_json,
                const std::string& rates_tail) {
  const double prefill_tps = r.prefill_s > 0 ? double(r.prompt.size()) / r.prefill_s : 0.0;
  const Generated& gen = r.gen;
  const double decode_tps = gen.decode_s > 0 && gen.decode_steps > 0 ? gen.decode_steps / gen.decode_s : 0.0;
  if (opt.json) {
    nlohmann::json j = {
        {"model", r.model_path},
        {"arch", r.arch},
        {"backend", backend_name(opt.backend)},
        {"prompt", opt.prompt},
        {"prompt_tokens", r.prompt},
        {"tokens", gen.tokens},
        {"text", gen.text},
        {"n_prompt", r.prompt.size()},
        {"n_gen", gen.tokens.size()},
        {"stop", gen.stop},
        {"n_ctx", r.n_ctx},
        {"prefill_tokens_per_s", prefill_tps},
        {"decode_tokens_per_s", decode_tps},
        // Greedy decoding draws no random numbers: no seed to report.
        {"seed", opt.sampling.temperature > 0 ? nlohmann::json(opt.sampling.seed) : nlohmann::json(nullptr)},
    };
    add_json(j);
    // Generated bytes need not be valid UTF-8 (a multi-byte character can be
    // cut by -n); replace rather than fail.
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    // The text ends its line before the stats start theirs, also when both
    // streams go to one pipe (stdout is buffered there).
    std::fputs("\n", stdout);
    std::fflush(stdout);
    // A sampled run names its seed, so that --seed repeats it.
    const std::string seed =
        opt.sampling.temperature > 0 ? "; seed " + std::to_string(opt.sampling.seed) : std::string();
    std::fprintf(stderr, "[%zu prompt tokens, %.1f tok/s; %zu generated, %.1f tok/s; stop: %s%s%s]\n",
                 r.prompt.size(), prefill_tps, gen.tokens.size(), decode_tps, gen.stop.c_str(), rates_tail.c_str(),
                 seed.c_str());
  }
}

// The generation loop of run() with the stages on worker processes: the
// prompt goes to the first stage in chunks of --batch, sent back to back so
// that the chunks pipeline across stages; only the last samples. Then one
// token per step. The last stage samples with the same seeded sampler a
// single-process run uses, so the tokens are the same.
int run_distributed(const RunOptions& opt) {
  if (const std::string why = backend_unavailable(opt.backend); !why.empty()) throw CommandError(why, kExitRefused);
  std::string model_path = opt.model.empty() ? default_model() : opt.model;
  // The workers open the model by path: the built-in one goes to a file for the run.
  std::optional<SyntheticModelFile> synthetic;
  if (model_path.empty()) model_path = synthetic.emplace().path();
  model_path = fs::absolute(model_path).string();
  GgufFile file = about_file(model_path, [&] { return GgufFile::open(model_path); });
  if (opt.parts.empty()) refuse_split_part(file, model_path);
  auto arch = about_file(model_path, [&] { return Arch::from_gguf(file); });
  if (net::log_enabled(net::LogLevel::info)) std::fprintf(stderr, "baton run: workers: %s\n", opt.backend_note.c_str());
  warn_beyond_trained_context("baton run", arch->dims().n_ctx_train, opt.n_ctx);
  StageConfig sc;
  sc.n_ctx = opt.n_ctx;
  sc.max_batch = opt.batch;
  sc = Stage::resolve(*arch, sc);
  // Placed before any worker starts, so an impossible split fails at once.
  // With --tp the stages' rank files are made first and give the stages.
  std::vector<StageSlice> slices;
  std::optional<TpRankFiles> rank_files;
  if (opt.tp > 1) rank_files.emplace(model_path, file, opt.workers, opt.tp);
  const std::vector<std::string> parts = rank_files ? rank_files->paths() : opt.parts;
  const int n_workers = int(parts.empty() ? size_t(opt.workers) : parts.size());
  if (parts.empty()) slices = split_layers(ModelPlanner(file), opt.workers);
  auto tokenizer = Tokenizer::from_gguf(file);
  const std::vector<int32_t> prompt = encode_prompt(*tokenizer, opt.prompt, sc.n_ctx);

  LocalClusterOptions lo;
  lo.n_workers = n_workers;
  lo.model = model_path;
  lo.threads_per_worker =
      opt.threads_per_worker > 0 ? opt.threads_per_worker : std::max(1, opt.n_threads / n_workers);
  lo.step_delay_ms = opt.worker_delay_ms;
  lo.worker_fault = opt.worker_fault;
  lo.worker_mem_limits = opt.mem_limit ? std::vector<uint64_t>(size_t(n_workers), opt.mem_limit)
                                       : opt.worker_mem_limits;
  lo.backend = backend_name(opt.backend);
  lo.staging_mb = opt.staging_mb;
  lo.cluster.link_mode = *net::link_mode_from_name(opt.link);
  for (const std::string& p : parts) lo.worker_models.push_back(fs::absolute(p).string());
  lo.wait_for_registration = false;
  LocalCluster local(lo);
  Cluster& cluster = local.cluster();
  const std::vector<net::Hello> hellos = cluster.wait_for_workers(n_workers, [&] { return local.exited_worker(); });
  if (!parts.empty()) {
    auto from_parts = slices_from_parts(hellos, arch->dims().n_layer);
    if (!from_parts) throw std::runtime_error("the --parts do not form one complete split of the model (see baton split)");
    slices = *from_parts;
  }
  StageSettings settings;
  settings.n_ctx = uint32_t(sc.n_ctx);
  settings.micro_batch = 1;
  settings.prefill_chunk = uint32_t(sc.max_batch);
  settings.n_seq = 1;
  settings.model_path = model_path;
  const std::optional<PartInfo> part = read_part_info(file);
  settings.model_hash = part ? part->source_hash : file.tensor_table_hash();
  cluster.assign(slices, settings);

  if (!opt.json) {
    std::fputs(opt.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  net::SamplingParams sp;
  sp.temperature = opt.sampling.temperature;
  sp.top_k = opt.sampling.top_k;
  sp.top_p = opt.sampling.top_p;
  sp.min_p = opt.sampling.min_p;
  sp.seed = opt.sampling.seed;
  auto chunk = [&](uint32_t pos, uint32_t n, bool sample) {
    net::SeqChunk c;
    c.seq = 0;
    c.start_pos = pos;
    c.n_tokens = n;
    c.sample = sample;
    c.sampling = sp;
    return c;
  };

  auto t0 = std::chrono::steady_clock::now();
  uint64_t last = 0;
  for (size_t at = 0; at < prompt.size(); at += size_t(sc.max_batch)) {
    const size_t n = std::min(prompt.size() - at, size_t(sc.max_batch));
    const bool final_chunk = at + n == prompt.size();
    last = cluster.forward({chunk(uint32_t(at), uint32_t(n), final_chunk)},
                           std::vector<int32_t>(prompt.begin() + std::ptrdiff_t(at), prompt.begin() + std::ptrdiff_t(at + n)));
  }
  int32_t id = cluster.wait_result(last).tokens.at(0);
  const double prefill_s = seconds_since(t0);

  int64_t pos = int64_t(prompt.size());
  const Generated gen = generate(
      opt, *tokenizer, id, [&] { return pos >= sc.n_ctx; },
      [&](int32_t in) {
        const uint64_t rid = cluster.forward({chunk(uint32_t(pos), 1, true)}, {in});
        ++pos;
        return cluster.wait_result(rid).tokens.at(0);
      });
  cluster.free_seq(0);

  report_run(
      opt, {model_path, arch->name(), sc.n_ctx, prompt, prefill_s, gen},
      [&](nlohmann::json& j) {
        nlohmann::json stages = nlohmann::json::array();
        for (const WorkerStatus& w : cluster.workers()) {
          stages.push_back({{"worker", w.name},
                            {"address", w.address},
                            {"stage", w.stage},
                            {"tp", {{"rank", w.rank}, {"size", w.slice.tp}}},
                            {"first_layer", w.slice.layers.first},
                            {"last_layer", w.slice.layers.last},
                            {"embedding", w.slice.embedding},
                            {"head", w.slice.head},
                            {"weights_bytes", w.ready.weights_bytes},
                            {"kv_bytes", w.ready.kv_bytes},
                            {"workspace_bytes", w.ready.workspace_bytes},
                            {"load_seconds", w.ready.load_seconds},
                            {"link", w.link.empty() ? nlohmann::json() : nlohmann::json(w.link)},
                            {"link_reason", w.link_reason}});
        }
        j["workers"] = n_workers;
        j["stages"] = stages;
      },
      "; " + std::to_string(n_workers) + " workers" +
          (opt.tp > 1 ? " (" + std::to_string(opt.workers) + " stages x " + std::to_string(opt.tp) + " ranks)" : ""));
  return 0;
}

int run(const RunOptions& opt) {
  if (opt.workers > 0) return run_distributed(opt);
  std::string model_path = opt.model.empty() ? default_model() : opt.model;
  if (std::string why = backend_unavailable(opt.backend); !why.empty()) throw CommandError(why, kExitRefused);
  GgufFile file = model_path.empty() ? GgufFile::open(SyntheticModelFile().path())  // the descriptor outlives the file
                                     : about_file(model_path, [&] { return GgufFile::open(model_path); });
  if (model_path.empty()) model_path = "(built-in synthetic model)";
  refuse_split_part(file, model_path);
  StageConfig sc;
  sc.n_ctx = opt.n_ctx;
  sc.n_threads = opt.n_threads;
  sc.max_batch = opt.batch;
  if (opt.draft_test != "none") sc.verify_rows = opt.drafting.max + 1;
  sc.draft_path = opt.draft;
  // The DSpark drafter (docs/DSPARK.md): on by default for this one user when
  // the model file or --draft has one. On CUDA its network runs on the
  // target's GPU (--cpu-drafter: on the CPU); unless --gpu-drafter asks for
  // it, a drafter that does not fit beside the model (under --mem-limit, or in
  // the device memory the load leaves) stays off with a line that says so.
  // Its stage captures the layers it reads.
  const std::optional<DsparkShape> drafter = dspark_find(file, sc.draft_path);
  if ((opt.drafting.on_gpu || opt.cpu_drafter) && opt.backend != Backend::Cuda) {
    throw std::invalid_argument(std::string(opt.drafting.on_gpu ? "--gpu-drafter" : "--cpu-drafter") +
                                " places the drafter beside a CUDA target: give --backend cuda");
  }
  bool drafting = drafter && !opt.drafting.off && opt.draft_test == "none";
  const bool on_gpu = drafting && opt.backend == Backend::Cuda && !opt.cpu_drafter;
  const bool may_drop = on_gpu && !opt.drafting.on_gpu;  // a default GPU drafter gives way to the model
  if (drafting) {
    sc.verify_rows = std::max(sc.verify_rows, int64_t(opt.drafting.max) + 1);
    sc.capture_layers = drafter->target_layer_ids;
  }
  LoadOptions load;
  load.slot_bytes = opt.staging_mb << 20;
  // The dry-run plan checks the architecture and every tensor before the
  // tokenizer is built or anything is allocated, so those errors come first.
  MemoryPlan dry = about_file(model_path, [&] { return plan_stage_runner(opt.backend, file, sc, load); });
  // The drafter where it shares the stage's memory: the CPU backend's host
  // memory, or the GPU beside the target (--cpu-drafter's host copy is not
  // under a device limit).
  const std::optional<DsparkPlan> drafter_plan = drafting ? dspark_plan(file, sc.draft_path) : std::nullopt;
  std::string dropped;  // why a default drafter stays off
  if (drafter_plan && (opt.backend == Backend::Cpu || on_gpu)) {
    MemoryPlan with = dry;
    with.add(PlanLine::Drafter, drafter_plan->total(), drafter_plan->detail);
    if (may_drop) dropped = dspark_limit_room(opt.backend, dry, with, opt.mem_limit);
    if (!dropped.empty()) {
      drafting = false;
    } else {
      dry = std::move(with);
    }
  }
  if (std::string why = memory_limit_problem(opt.backend, dry, opt.mem_limit); !why.empty()) {
    throw std::runtime_error(why + " (baton plan shows the lines)");
  }
  auto drafter_line = [&](const std::string& state) {
    if (net::log_enabled(net::LogLevel::info)) {
      std::fprintf(stderr, "baton run: %s (%s)%s\n", drafter->describe().c_str(),
                   sc.draft_path.empty() ? "in the model file" : sc.draft_path.c_str(), state.c_str());
    }
  };
  if (drafter) {
    drafter_line(drafting                    ? std::string(on_gpu ? " on the GPU" : "")
                 : !dropped.empty()          ? "; off: " + dropped
                 : opt.drafting.off          ? std::string("; off (--no-draft)")
                                             : std::string("; off (--draft-test)"));
  }
  auto tokenizer = about_file(model_path, [&] { return Tokenizer::from_gguf(file); });
  if (net::log_enabled(net::LogLevel::info)) std::fprintf(stderr, "baton run: %s\n", opt.backend_note.c_str());
  warn_beyond_trained_context("baton run", Arch::from_gguf(file)->dims().n_ctx_train, opt.n_ctx);
  const bool show_load = opt.progress || dry.bytes(PlanLine::Weights) >= kProgressMinBytes;
  if (show_load) load.progress = stderr_load_progress(model_path);
  std::unique_ptr<StageRunner> runner = make_stage_runner(opt.backend, file, sc, load);
  StageRunner& stage = *runner;
  if (show_load) std::fprintf(stderr, "%s\n", load_summary(stage).c_str());
  if (may_drop && drafting) {
    if (std::string why = dspark_device_room(stage, drafter_plan ? drafter_plan->total() : 0); !why.empty()) {
      drafting = false;
      drafter_line("; off: " + why + " (--gpu-drafter loads it anyway)");
    }
  }
  if ((opt.draft_test != "none" || drafting) && !stage.speculative()) {
    throw CommandError(std::string(drafting ? "drafting" : "--draft-test") + ": the " + backend_name(opt.backend) +
                           " stage of " + stage.arch().name() + " has no verify forward (docs/SPECULATIVE.md)",
                       kExitRefused);
  }

  const std::vector<int32_t> prompt = encode_prompt(*tokenizer, opt.prompt, stage.n_ctx());
  if (!opt.json) {
    std::fputs(opt.prompt.c_str(), stdout);
    std::fflush(stdout);
  }

  // Prefill: the prompt in chunks of the planned batch; the last chunk's
  // logits are the next-token distribution.
  auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits;
  const int64_t batch = stage.max_batch();
  for (size_t at = 0; at < prompt.size(); at += size_t(batch)) {
    size_t n = std::min(prompt.size() - at, size_t(batch));
    logits = stage.forward(0, std::span<const int32_t>(prompt.data() + at, n));
  }
  const double prefill_s = seconds_since(t0);

  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  const size_t n_top = std::min<size_t>(5, order.size());
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(n_top), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < n_top; ++i) top.push_back({order[i], logits[size_t(order[i])]});

  Sampler sampler(opt.sampling, int32_t(stage.n_vocab()));
  SpecStats spec;
  DraftPacer pacer;
  Generated gen;
  if (opt.draft_test != "none") {
    gen = generate_draft_test(opt, *tokenizer, stage, prompt, &spec);
  } else if (drafting) {
    const std::optional<GgufFile> sidecar =
        sc.draft_path.empty() ? std::nullopt : std::optional<GgufFile>(GgufFile::open(sc.draft_path));
    const GgufFile& drafter_file = sidecar ? *sidecar : file;
    const std::unique_ptr<DsparkDraftSource> source =
        make_dspark_source(stage, file, drafter_file, *drafter, load, on_gpu, opt.n_threads,
                           opt.drafting.threshold, "baton run");
    // Only the sampled verify rule reads the draft's logits.
    source->set_return_logits(opt.sampling.temperature > 0);
    gen = generate_speculative(opt, *tokenizer, stage, prompt, *source, true, &spec,
                               opt.drafting.always ? nullptr : &pacer);
  } else {
    const int32_t first = opt.n_predict != 0 ? sampler.sample(logits) : -1;
    gen = generate(
        opt, *tokenizer, first, [&] { return stage.position(0) >= stage.n_ctx(); },
        [&](int32_t in) {
          logits = stage.forward(0, std::span<const int32_t>(&in, 1));
          return sampler.sample(logits);
        });
  }
  report_run(
      opt, {model_path, stage.arch().name(), stage.n_ctx(), prompt, prefill_s, gen},
      [&](nlohmann::json& j) {
        nlohmann::json plan = nlohmann::json::array();
        for (const auto& l : stage.memory_plan().lines()) plan.push_back({{"name", l.name()}, {"bytes", l.bytes}});
        j["threads"] = opt.n_threads;
        j["top_logits"] = top;
        j["memory_plan"] = plan;
        if (opt.draft_test != "none" || drafting) {
          j["draft"] = {{"mode", drafting ? std::string("dspark") : opt.draft_test},
                        {"max", opt.drafting.max},
                        {"verifies", spec.verifies},
                        {"drafted", spec.drafted},
                        {"accepted", spec.accepted}};
          if (drafting && !opt.drafting.always) {
            // Probes that did not pay, and the plain step the pacer measured.
            j["draft"]["pauses"] = pacer.pauses();
            j["draft"]["plain_step_ms"] = 1e3 * pacer.plain_seconds();
          }
          if (gen.departed_at >= 0) j["draft"]["departed_at"] = gen.departed_at;
        }
      },
      opt.draft_test == "none" && !drafting
          ? std::string()
          : "; " + (drafting ? std::string("drafter") : opt.draft_test) + ": " + std::to_string(spec.verifies) + " verifies, " +
                                std::to_string(spec.accepted) + " of " + std::to_string(spec.drafted) +
                                " guesses kept" +
                                (pacer.pauses() > 0 ? ", paused " + std::to_string(pacer.pauses()) +
                                                          " times where drafting was slower than plain steps"
                                                    : std::string()));
  return 0;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  auto opt = parse(argc, argv);
  if (!opt || parse_only()) return 0;
  return run(*opt);
}

}  // namespace baton
