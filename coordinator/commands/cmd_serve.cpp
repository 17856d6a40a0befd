// `baton serve`: the OpenAI-compatible HTTP server (docs/SERVING.md). Today
// the model runs in this process (LocalEngine); the distributed coordinator
// will plug in behind the same GenerationService.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "coordinator/commands/commands.h"
#include "coordinator/commands/draft_options.h"
#include "coordinator/commands/model_choice.h"
#include "coordinator/commands/load_report.h"
#include "coordinator/cluster/cluster_config.h"
#include "coordinator/cluster/cluster_engine.h"
#include "coordinator/api/cors.h"
#include "coordinator/api/http_server.h"
#include "coordinator/cluster/local_cluster.h"
#include "coordinator/cluster/local_engine.h"
#include "coordinator/api/metrics.h"
#include "coordinator/api/openai_api.h"
#include "engine/model/arch.h"
#include "engine/runtime/backend.h"
#include "chat/jinja_prompt.h"
#include "chat/templates/builtin.h"
#include "engine/base/command_error.h"
#include "engine/base/command_line.h"
#include "engine/gguf/file.h"
#include "engine/plan/node_plan.h"
#include "engine/sampling/sampler.h"
#include "net/auth.h"
#include "net/log.h"
#include "net/log_options.h"
#include "net/address.h"

namespace baton {

namespace {

namespace po = boost::program_options;

struct ServeOptions {
  std::string model;
  std::string config;
  int workers = 0;  // stages (of tp ranks each)
  int tp = 1;       // > 1: tensor-parallel ranks per stage
  std::vector<std::string> parts;
  int worker_delay_ms = 0;
  std::vector<uint64_t> worker_mem_limits;  // a local config's [[node]] memory, one per worker
  uint64_t staging_mb = 64;                 // the loader's staging buffers, here or in every local worker
  int threads_per_worker = 0;
  bool remote = false;      // --config with local = false: workers on other machines register
  std::string listen;       // remote: where they register
  std::string secret_file;  // remote: the shared secret
  std::string link = "auto";  // stage links: auto, tcp, nccl
  std::string backend = "auto";  // in process, or the local workers'
  std::vector<int> gpus;         // local workers' GPUs
  std::string api_key_file;
  std::string api_key;  // --api-key, else $BATON_API_KEY
  CorsPolicy cors;  // --cors: none unless given
  std::string model_id;
  std::string chat_template_file;  // --chat-template: replaces the model's template
  SamplingDefaults sampling;       // --temp, --top-p, --top-k, --min-p, --seed, the penalties; else [sampling]
  LocalEngineConfig engine;
  HttpServerConfig http;
  double request_timeout_s = 10, idle_timeout_s = 60, write_timeout_s = 30;
  double template_timeout_s = 2;
  std::string mem_limit;  // --mem-limit: the in-process stage's, or each local worker's
  bool quiet = false;
  net::LogOptions log;
};

constexpr const char* kUsage =
    "usage: baton serve [[-m] MODEL | --config FILE] [--host H] [--port P] [--api-key-file F] [options]\n\n"
    "Serves a GGUF model over an OpenAI-compatible HTTP API and Anthropic's Messages API:\n"
    "  POST /v1/chat/completions   chat (messages rendered with the model's chat template)\n"
    "  POST /v1/completions        plain text completion\n"
    "  POST /v1/messages           Anthropic Messages API (content blocks, tools, thinking)\n"
    "  POST /v1/messages/count_tokens  the token count of a Messages API prompt\n"
    "  GET  /v1/models             the served model\n"
    "  GET  /health                route state: stages, layers, loading progress, memory\n"
    "  GET  /metrics               Prometheus metrics\n"
    "  POST /tokenize, /detokenize text (or messages) to token ids and back, as llama-server and vLLM\n"
    "The completion and message routes stream server-sent events with \"stream\": true.\n\n"
    "Concurrent requests share the model by continuous batching: up to --parallel\n"
    "sequences hold a KV slot; each step runs one batch of at most --batch tokens\n"
    "(a decode token of every generating sequence, then chunks of waiting prompts)\n"
    "in one forward pass that reads the weights once; up to --queue more requests\n"
    "wait, and beyond that requests get 429 with Retry-After. A client that\n"
    "disconnects has its generation cancelled. A slot keeps the KV of its last\n"
    "request: a prompt that begins with those tokens takes that slot and computes\n"
    "only the rest (the prefix cache; usage.prompt_tokens_details.cached_tokens).\n\n"
    "The port is bound before the model is opened: a busy port or a --host that\n"
    "does not resolve ends the command at once. Once connections are accepted,\n"
    "stdout gets one line\n"
    "  baton serve: listening on http://HOST:PORT\n"
    "(with the real port when --port 0), then \"baton serve: ready ...\" when the\n"
    "model is loaded. Logs and one line per request go to stderr. SIGINT or SIGTERM\n"
    "stops the server: generations in flight end, connections close.\n\n"
    "With --api-key-file, --api-key or $BATON_API_KEY, every /v1/ request needs\n"
    "'Authorization: Bearer KEY' or 'x-api-key: KEY' (for a file, its first line);\n"
    "/health and /metrics stay open for probes and scrapers.\n\n"
    "With --workers K the model runs as a pipeline of K worker processes on this\n"
    "machine (loopback TCP, a generated secret): each loads only its layers, and\n"
    "--parallel sequences are in flight at once so that the stages overlap. A worker\n"
    "that dies is started again; requests in flight fail within 2 s with an error\n"
    "naming the worker and its stage, /health reports the route as incomplete, and\n"
    "serving resumes once the worker has loaded again. With --parts (files written\n"
    "by `baton split`) each worker loads one part, and the stages follow the parts.\n\n";

// --temp, --top-p, --top-k, --min-p, --seed and the penalties, checked
// against the ranges a request's own fields are (engine/sampling/sampler.h).
SamplingDefaults sampling_defaults(const po::variables_map& vm) {
  SamplingDefaults d;
  auto number = [&](const SamplingRange& range, const char* flag) -> std::optional<double> {
    if (!vm.count(flag)) return std::nullopt;
    const double x = vm[flag].as<double>();
    if (std::string why = sampling_range_problem(range, x); !why.empty()) throw std::invalid_argument(why);
    return x;
  };
  d.temperature = number(kTemperatureRange, "temp");
  d.top_p = number(kTopPRange, "top-p");
  d.min_p = number(kMinPRange, "min-p");
  d.repeat_penalty = number(kRepeatPenaltyRange, "repeat-penalty");
  d.presence_penalty = number(kPresencePenaltyRange, "presence-penalty");
  d.frequency_penalty = number(kFrequencyPenaltyRange, "frequency-penalty");
  if (vm.count("repeat-last-n")) {
    const int64_t n = vm["repeat-last-n"].as<int64_t>();
    if (std::string why = sampling_range_problem(kRepeatLastNRange, double(n)); !why.empty()) {
      throw std::invalid_argument(why);
    }
    d.repeat_last_n = n;
  }
  if (vm.count("top-k")) {
    const int64_t k = vm["top-k"].as<int64_t>();
    if (std::string why = sampling_range_problem(kTopKRange, double(k)); !why.empty()) {
      throw std::invalid_argument(why);
    }
    d.top_k = k;
  }
  if (vm.count("seed")) {
    const std::string text = vm["seed"].as<std::string>();
    if (text != "-1") {
      size_t used = 0;
      uint64_t seed = 0;
      try {
        seed = std::stoull(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (text.empty() || used != text.size() || text[0] == '-' || text[0] == '+') {
        throw std::invalid_argument("--seed takes an integer from 0 to 18446744073709551615, or -1 for a random "
                                    "seed per request; got '" + text + "'");
      }
      d.seed = seed;
    }
  }
  return d;
}

// "temperature 0, seed 7": the defaults that are set, for the start-up log.
std::string describe(const SamplingDefaults& d) {
  std::string out;
  auto add = [&](const char* name, const std::string& value) {
    out += (out.empty() ? "" : ", ") + std::string(name) + " " + value;
  };
  auto num = [](double x) {
    std::ostringstream s;
    s << x;
    return s.str();
  };
  if (d.temperature) add("temperature", num(*d.temperature));
  if (d.top_p) add("top_p", num(*d.top_p));
  if (d.top_k) add("top_k", std::to_string(*d.top_k));
  if (d.min_p) add("min_p", num(*d.min_p));
  if (d.seed) add("seed", std::to_string(*d.seed));
  if (d.repeat_penalty) add("repeat_penalty", num(*d.repeat_penalty));
  if (d.repeat_last_n) add("repeat_last_n", std::to_string(*d.repeat_last_n));
  if (d.presence_penalty) add("presence_penalty", num(*d.presence_penalty));
  if (d.frequency_penalty) add("frequency_penalty", num(*d.frequency_penalty));
  return out;
}

std::optional<ServeOptions> parse(int argc, char** argv) {
  ServeOptions r;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  int port = 8080;
  uint64_t max_body = r.http.max_body_bytes;
  po::options_description desc("options");
  // clang-format off
  desc.add_options()
      ("help,h", "print this help and exit")
      ("model,m", po::value<std::string>(&r.model),
       ("GGUF model file to serve (default: $BATON_MODEL, else " + std::string(kDefaultModelRel) +
        ", else the built-in synthetic model)").c_str())
      ("config", po::value<std::string>(&r.config),
       "cluster topology file (TOML, see configs/ and docs/CONFIG.md); options given here override it")
      ("workers", po::value<int>(&r.workers), "run the model on K local worker processes (a pipeline)")
      ("parts", po::value<std::string>(), "comma-separated split parts, one local worker each (implies --workers); "
       "rank files of `baton split --tp N` make tensor-parallel stages")
      ("tp", po::value<int>(&r.tp)->default_value(1),
       "tensor-parallel ranks per stage: each of the --workers stages (default 1) runs on N local worker "
       "processes holding 1/N of every layer, the rank files written at start into $TMPDIR; with a remote "
       "config, its cluster.tp says how many ranks each stage's workers are")
      ("threads-per-worker", po::value<int>(&r.threads_per_worker)->default_value(0),
       "with --workers: CPU threads of each worker; 0 = --threads divided by the workers")
      ("link", po::value<std::string>(&r.link)->default_value("auto"),
       "with workers: how activations cross each stage link: auto (NCCL where both GPUs can, else TCP), "
       "tcp, or nccl (refuse to start when a link cannot use NCCL); /health shows each link")
      ("backend", po::value<std::string>(&r.backend)->default_value("auto"),
       "auto (the GPU when one is usable, else the CPU; one log line says which), cpu or cuda: the "
       "in-process stage's, or with --workers the local workers'")
      ("gpus", po::value<std::string>(),
       "with --workers and cuda: comma-separated GPU indices, worker i on the (i mod n)-th (workers may share one)")
      ("staging-mb", po::value<uint64_t>(&r.staging_mb)->default_value(r.staging_mb),
       "MiB of each of the loader's 4 staging buffers (pinned host memory with cuda), in this process or, "
       "with --workers, in each local worker")
      ("worker-delay-ms", po::value<int>(&r.worker_delay_ms)->default_value(0),
       "with --workers: each worker sleeps this long before every step (models slow nodes; for tests)")
      ("host", po::value<std::string>(&r.http.host)->default_value("127.0.0.1"),
       "address to listen on: an IP address (0.0.0.0 for every interface, :: or [::1] for IPv6) or a host "
       "name (its IPv4 address when it has one); bound before the model loads")
      ("port", po::value<int>(&port)->default_value(8080), "TCP port; 0 = any free port (printed on stdout)")
      ("api-key-file", po::value<std::string>(&r.api_key_file),
       "file whose first line is the API key clients must send (Authorization: Bearer KEY, or x-api-key: KEY)")
      ("api-key", po::value<std::string>(&r.api_key),
       "the API key itself (other users of this machine can read it in the process list: prefer "
       "--api-key-file or $BATON_API_KEY)")
      ("cors", po::value<std::string>(),
       "let web pages of these origins call the API: '*' or a comma list like https://app.example.com; "
       "answers OPTIONS preflights (default: no CORS headers)")
      ("chat-template", po::value<std::string>(&r.chat_template_file),
       ("Jinja chat template rendering chat prompts instead of the model's own (tokenizer.chat_template): a "
        "file, or the name of a built-in template: " + builtin_chat_template_names() +
        " (a file of that name wins; docs/CHAT_TEMPLATES.md gives their sources); refused at start when it "
        "uses what Baton's Jinja engine lacks")
           .c_str())
      ("temp", po::value<double>(),
       "default temperature of a request that names none (0..2; 0 = greedy); a request's own wins "
       "(default: the API's, 1)")
      ("top-p", po::value<double>(), "default top_p of a request that names none (0..1; default: 1, off)")
      ("top-k", po::value<int64_t>(), "default top_k of a request that names none (0 = off, the default)")
      ("min-p", po::value<double>(),
       "default min_p of a request that names none (0..1; default: 0, off, on the OpenAI routes, 0.05 on the "
       "Messages API, which has no min_p field)")
      ("repeat-penalty", po::value<double>(),
       "default repetition penalty of a request that names none (0.01..10; 1 = off, the default): positive "
       "logits of the last --repeat-last-n tokens divided by it, negative ones multiplied")
      ("repeat-last-n", po::value<int64_t>(), "default window of the repetition penalty (0..65536 tokens; default 64)")
      ("presence-penalty", po::value<double>(), "default presence_penalty (-2..2; default 0, off)")
      ("frequency-penalty", po::value<double>(), "default frequency_penalty (-2..2; default 0, off)")
      ("seed", po::value<std::string>(),
       "default seed of a request that names none: the same request then gives the same text; -1 = a random "
       "seed per request (the default)")
      ("mem-limit", po::value<std::string>(&r.mem_limit),
       "most memory the stage's plan may use, in process or in each local worker, e.g. 90GiB (refused before "
       "loading when it does not fit; default: the device, or on the CPU what the machine has available)")
      ("template-timeout", po::value<double>(&r.template_timeout_s)->default_value(2),
       "seconds one chat template render may take; longer gets 400 (a model file's template is input from "
       "strangers)")
      ("model-id", po::value<std::string>(&r.model_id),
       "the name /v1/models reports and clients pass as \"model\" (default: the file name without .gguf, and a split part's without its part suffix)")
      ("ctx", po::value<int64_t>(&r.engine.stage.n_ctx)->default_value(0),
       "context per sequence in tokens (prompt + completion); 0 = the model's, at most 4096")
      ("draft", po::value<std::string>(&r.engine.stage.draft_path),
       "DeepSeek V4: the DSpark drafter's sidecar GGUF (general.architecture deepseek4-dspark); checked at "
       "startup, every tensor by name and shape (default: the model file's own mtp.* drafter, if any)")
      ("parallel", po::value<int>(&r.engine.stage.n_seq)->default_value(4),
       "sequences generated concurrently (each holds a KV cache slot of --ctx tokens)")
      ("no-prefix-cache", po::bool_switch(), "never reuse the KV of a finished request: every prompt is computed whole")
      ("queue", po::value<int>(&r.engine.queue_capacity)->default_value(64),
       "requests that may wait for a slot; more get 429")
      ("threads,t", po::value<int>(&r.engine.stage.n_threads)->default_value(hw),
       "CPU threads for the forward pass (default: all cores)")
      ("batch,b", po::value<int64_t>(&r.engine.stage.max_batch)->default_value(64),
       "tokens of one step's batch: decode tokens of the running sequences plus prompt chunks")
      ("http-threads", po::value<int>(&r.http.threads)->default_value(2), "threads serving HTTP connections")
      ("max-body", po::value<uint64_t>(&max_body)->default_value(max_body),
       "largest request body in bytes; larger gets 413")
      ("max-connections", po::value<int>(&r.http.max_connections)->default_value(256),
       "open connections at most; more get 503 (the last quarter only for clients holding fewer than 4)")
      ("max-connections-per-client", po::value<int>(&r.http.max_connections_per_client)->default_value(0),
       "open connections from one client address at most; more get 503; 0 = half of --max-connections")
      ("request-timeout", po::value<double>(&r.request_timeout_s)->default_value(10),
       "seconds a request may take to arrive once it started; slower gets 408")
      ("idle-timeout", po::value<double>(&r.idle_timeout_s)->default_value(60),
       "seconds an idle keep-alive connection stays open")
      ("write-timeout", po::value<double>(&r.write_timeout_s)->default_value(30),
       "seconds a client may take to accept each write before it is dropped")
      ("quiet,q", po::bool_switch(&r.quiet), "no per-request log lines");
  // clang-format on
  add_draft_options(desc, r.engine.draft);
  net::add_log_options(desc, r.log, "info");
  // The model may also come first, as llama.cpp's tools take it.
  po::positional_options_description positional;
  positional.add("model", 1);
  const auto parsed = parse_command_line(argc, argv, {.options = desc, .help_head = kUsage, .positional = &positional});
  if (!parsed) return std::nullopt;
  const po::variables_map& vm = *parsed;
  r.engine.prefix_cache = !vm["no-prefix-cache"].as<bool>();
  net::apply_log_options(r.log, net::LogLevel::info);
  if (!net::log_enabled(net::LogLevel::info)) r.quiet = true;  // the request lines are info lines
  if (vm.count("api-key") && vm.count("api-key-file")) {
    throw std::invalid_argument("give --api-key or --api-key-file, not both");
  }
  if (vm.count("api-key") && r.api_key.empty()) throw std::invalid_argument("--api-key must not be empty");
  if (!vm.count("api-key") && !vm.count("api-key-file")) {
    if (const char* env = std::getenv("BATON_API_KEY"); env && *env) r.api_key = env;
  }
  if (vm.count("parts")) {
    std::stringstream list(vm["parts"].as<std::string>());
    for (std::string item; std::getline(list, item, ',');) {
      if (!item.empty()) r.parts.push_back(item);
    }
    if (r.parts.empty()) throw std::invalid_argument("--parts needs at least one file");
    if (vm.count("workers") && r.workers != int(r.parts.size())) {
      throw std::invalid_argument("--workers must equal the number of --parts");
    }
    r.workers = int(r.parts.size());
    if (r.model.empty()) r.model = r.parts.front();  // any part carries the metadata and tokenizer
  }
  if (vm.count("cors")) r.cors = parse_cors_origins(vm["cors"].as<std::string>());
  r.sampling = sampling_defaults(vm);
  // Before the port is bound: an unknown name is one line at once. Parse-only
  // runs (documented commands) name files that need not exist.
  if (vm.count("chat-template") && !parse_only()) check_chat_template_choice(r.chat_template_file);
  if (!(r.template_timeout_s > 0 && r.template_timeout_s <= 3600)) {
    throw std::invalid_argument("--template-timeout must be in (0, 3600] seconds");
  }
  if (vm.count("workers") && (r.workers < 1 || r.workers > 64)) throw std::invalid_argument("--workers must be in 1..64");
  if (vm.count("gpus")) {
    std::stringstream list(vm["gpus"].as<std::string>());
    for (std::string item; std::getline(list, item, ',');) {
      size_t used = 0;
      int g = -1;
      try {
        g = std::stoi(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || g < 0) throw std::invalid_argument("--gpus takes GPU indices like 0,1; got '" + item + "'");
      r.gpus.push_back(g);
    }
    if (r.gpus.empty()) throw std::invalid_argument("--gpus needs at least one index");
  }
  if (vm.count("config")) {
    const ClusterConfig c = load_cluster_config(r.config);
    auto unset = [&](const char* name) { return !vm.count(name) || vm[name].defaulted(); };
    if (r.model.empty()) r.model = c.model;
    if (!vm.count("parts")) r.parts = c.parts;
    if (!vm.count("workers") && !vm.count("parts")) r.workers = c.workers;
    if (vm["tp"].defaulted()) r.tp = c.tp;
    if (c.ctx > 0 && unset("ctx")) r.engine.stage.n_ctx = c.ctx;
    if (c.parallel > 0 && unset("parallel")) r.engine.stage.n_seq = c.parallel;
    if (c.batch > 0 && unset("batch")) r.engine.stage.max_batch = c.batch;
    if (!c.prefix_cache) r.engine.prefix_cache = false;
    if (c.threads_per_worker > 0 && unset("threads-per-worker")) r.threads_per_worker = c.threads_per_worker;
    if (unset("link")) r.link = c.link;
    if (c.node_backend && unset("backend")) r.backend = backend_name(*c.node_backend);
    r.remote = !c.local;
    if (c.local && c.nodes.size() == size_t(r.workers)) {
      for (const NodeSpec& n : c.nodes) r.worker_mem_limits.push_back(n.memory_bytes);
    }
    r.listen = c.listen;
    r.secret_file = c.secret_file;
    // [sampling]: the file's defaults where no flag names one.
    SamplingDefaults& d = r.sampling;
    const ConfigSampling& cs = c.sampling;
    if (!d.temperature) d.temperature = cs.temperature;
    if (!d.top_p) d.top_p = cs.top_p;
    if (!d.top_k) d.top_k = cs.top_k;
    if (!d.min_p) d.min_p = cs.min_p;
    if (!d.seed && !vm.count("seed")) d.seed = cs.seed;
    if (!d.repeat_penalty) d.repeat_penalty = cs.repeat_penalty;
    if (!d.repeat_last_n) d.repeat_last_n = cs.repeat_last_n;
    if (!d.presence_penalty) d.presence_penalty = cs.presence_penalty;
    if (!d.frequency_penalty) d.frequency_penalty = cs.frequency_penalty;
  }
  // After the config: --mem-limit wins over its [[node]] memory.
  if (!r.mem_limit.empty()) {
    const uint64_t limit = parse_size(r.mem_limit);
    r.engine.mem_limit = limit;
    if (r.workers > 0) r.worker_mem_limits.assign(size_t(r.workers), limit);
  }
  // Without a model: run's default ($BATON_MODEL, the fixture, else the
  // built-in synthetic model, written to a file in serve()).
  if (r.model.empty() && !r.remote) r.model = default_model();
  if (r.model.empty() && r.remote) throw std::invalid_argument("give the model to serve with -m MODEL (see --help)");
  if (r.backend != "auto" && !backend_from_name(r.backend)) {
    throw std::invalid_argument("--backend must be auto, cpu or cuda, got '" + r.backend + "'");
  }
  if (r.tp < 1 || r.tp > 64) throw std::invalid_argument("--tp must be in 1..64");
  if (r.tp > 1) {
    if (!r.parts.empty() && !vm["tp"].defaulted()) {
      throw std::invalid_argument("--tp makes rank files from the model; rank files of baton split --tp go to --parts without it");
    }
    if (r.workers == 0) r.workers = 1;  // one stage of N ranks
    if (r.workers * r.tp > 64) throw std::invalid_argument("--workers x --tp must be at most 64 worker processes");
    // One cap per worker process: a stage's cap holds for each of its ranks.
    std::vector<uint64_t> per_rank;
    for (uint64_t limit : r.worker_mem_limits) per_rank.insert(per_rank.end(), size_t(r.tp), limit);
    r.worker_mem_limits = per_rank;
  }
  if (!r.gpus.empty() && r.workers == 0) throw std::invalid_argument("--gpus places local workers: give --workers or --parts");
  if (!net::link_mode_from_name(r.link)) throw std::invalid_argument("--link must be auto, tcp or nccl, got '" + r.link + "'");
  if (port < 0 || port > 65535) throw std::invalid_argument("--port must be in 0..65535");
  if (r.staging_mb < 1 || r.staging_mb > 4096) throw std::invalid_argument("--staging-mb must be in 1..4096");
  if (!r.engine.stage.draft_path.empty() && (r.workers > 0 || r.remote)) {
    throw std::invalid_argument("--draft serves the whole model in this process (no --workers, --parts or remote workers)");
  }
  check_draft_options(r.engine.draft);
  r.engine.staging_slot_bytes = r.staging_mb << 20;
  r.http.port = uint16_t(port);
  if (r.engine.stage.n_ctx < 0) throw std::invalid_argument("--ctx must be >= 0");
  if (r.engine.stage.n_seq < 1 || r.engine.stage.n_seq > 1024) throw std::invalid_argument("--parallel must be in 1..1024");
  if (r.engine.queue_capacity < 0) throw std::invalid_argument("--queue must be >= 0");
  if (r.engine.stage.n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (r.engine.stage.max_batch < 1) throw std::invalid_argument("--batch must be >= 1");
  if (r.http.threads < 1 || r.http.threads > 256) throw std::invalid_argument("--http-threads must be in 1..256");
  if (max_body < 1024) throw std::invalid_argument("--max-body must be at least 1024");
  r.http.max_body_bytes = max_body;
  if (r.http.max_connections < 1) throw std::invalid_argument("--max-connections must be >= 1");
  if (r.http.max_connections_per_client < 0) throw std::invalid_argument("--max-connections-per-client must be >= 0");
  for (double t : {r.request_timeout_s, r.idle_timeout_s, r.write_timeout_s}) {
    if (!(t > 0) || t > 86400) throw std::invalid_argument("timeouts must be in (0, 86400] seconds");
  }
  auto ms = [](double s) { return std::chrono::milliseconds(int64_t(s * 1000)); };
  r.http.request_timeout = ms(r.request_timeout_s);
  r.http.idle_timeout = ms(r.idle_timeout_s);
  r.http.write_timeout = ms(r.write_timeout_s);
  r.engine.model_path = r.model;
  r.engine.model_id = r.model_id;
  return r;
}

// The key is the file's first line without surrounding whitespace; it is
// never printed. A file others may read gets the cluster secret's warning.
std::string read_api_key(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO))) {
    net::log(net::LogLevel::warn, "API key file " + path + " is accessible by group or others (chmod 600 it)");
  }
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the API key file " + path);
  std::string line;
  std::getline(in, line);
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!line.empty() && is_space(line.back())) line.pop_back();
  size_t start = 0;
  while (start < line.size() && is_space(line[start])) ++start;
  line.erase(0, start);
  if (line.empty()) throw std::runtime_error("the API key file " + path + " is empty");
  return line;
}

// A fixed route name for metrics labels (never the client's path).
const char* route_name(const std::string& path) {
  if (path == "/v1/chat/completions") return "chat";
  if (path == "/v1/completions") return "completions";
  if (path == "/v1/messages") return "messages";
  if (path == "/v1/messages/count_tokens") return "count_tokens";
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return "models";
  if (path == "/health") return "health";
  if (path == "/metrics") return "metrics";
  if (path == "/tokenize") return "tokenize";
  if (path == "/detokenize") return "detokenize";
  return "other";
}

const char* error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

int serve(const ServeOptions& given) {
  ServeOptions opt = given;
  std::optional<SyntheticModelFile> synthetic;
  if (opt.model.empty()) {
    opt.model = synthetic.emplace().path();
    std::fprintf(stderr, "baton serve: no model given ($BATON_MODEL, -m): serving the built-in synthetic model\n");
  }
  std::string api_key = opt.api_key;
  if (!opt.api_key_file.empty()) api_key = read_api_key(opt.api_key_file);
  std::shared_ptr<const JinjaTemplate> chat_template;
  std::string chat_template_source;
  if (!opt.chat_template_file.empty()) {
    ChatTemplateSource loaded = load_chat_template(opt.chat_template_file);
    chat_template = std::move(loaded.tmpl);
    chat_template_source = std::move(loaded.description);
  }

  // Signals go to the main thread only (sigtimedwait below): block them
  // before any other thread starts so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A client that vanishes must not kill the process with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);

  // The start-up lines are info lines (--log-level warn keeps only warnings,
  // errors and the "listening on" line on stdout).
  const bool info = net::log_enabled(net::LogLevel::info);
  std::string backend_note;
  const Backend backend = resolve_backend(opt.backend, &backend_note);
  if (!opt.remote) {
    if (std::string why = backend_unavailable(backend); !why.empty()) throw CommandError(why, kExitRefused);
    if (info) std::fprintf(stderr, "baton serve: %s\n", backend_note.c_str());
  }
  Metrics metrics;
  HttpServerHooks hooks;
  hooks.error_body = [](int status, const std::string& message, const std::string& kind) {
    return error_body(message, error_type(status), "", kind);
  };
  hooks.on_error = [&metrics](int status, const std::string& kind) {
    metrics.error(kind);
    metrics.http_response("other", status);
  };
  const bool quiet = opt.quiet;
  hooks.access_log = [&metrics, quiet](const HttpRequest& req, int status, uint64_t bytes, double seconds,
                                       bool complete) {
    metrics.http_response(route_name(req.path), status);
    if (quiet) return;
    std::fprintf(stderr, "baton serve: %s %s %d %.1f ms %llu B %s%s\n", net::printable(req.method, 16).c_str(),
                 net::printable(req.path, 200).c_str(), status, seconds * 1000, (unsigned long long)bytes,
                 req.remote.c_str(), complete ? "" : " (cut: the connection closed first)");
  };
  // Either the model in this process, or a pipeline of local workers (the
  // cluster outlives the engine that drives it). Declared before the server
  // and the API, which use them and so go first.
  std::unique_ptr<LocalCluster> local;
  std::unique_ptr<Cluster> remote;
  std::unique_ptr<ClusterEngine> cluster_engine;
  std::unique_ptr<LocalEngine> local_engine;
  // The port is bound before the model is touched: a busy port or a host
  // that does not resolve fails at once, not after a load of minutes.
  // Connections wait in the backlog until start() below.
  std::unique_ptr<OpenAiApi> api;
  HttpHandler handler = [&api](std::shared_ptr<HttpExchange> ex) { api->handle(ex); };
  if (opt.cors.enabled()) handler = with_cors(opt.cors, std::move(handler));
  HttpServer server(opt.http, std::move(handler), hooks);
  // After the port is bound (a busy port is the first error), before the load.
  if (opt.parts.empty() && !opt.remote) {
    const GgufFile f = about_file(opt.model, [&] { return GgufFile::open(opt.model); });
    refuse_split_part(f, opt.model);
  }
  LocalEngineConfig engine_config = opt.engine;
  engine_config.backend = backend;
  // One progress line a second while loading, and one at the end.
  auto last_line = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  engine_config.on_load_progress = [last_line, info](const LoadProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (!info) return;
    if (p.done < p.total && now - *last_line < std::chrono::seconds(1)) return;
    *last_line = now;
    std::fprintf(stderr, "baton serve: loading weights: %.1f / %.1f MiB (%.0f%%), %.2f GB/s, ETA %.1f s\n",
                 double(p.done) / (1 << 20), double(p.total) / (1 << 20),
                 p.total ? 100.0 * double(p.done) / double(p.total) : 100.0, p.rate() / 1e9, p.eta());
  };
  GenerationService* service = nullptr;
  std::function<void()> wait_loaded, stop_engine;
  // --tp with local workers: the stages' rank files first (they give the stages).
  std::optional<TpRankFiles> rank_files;
  if (opt.tp > 1 && !opt.remote && opt.parts.empty()) {
    const GgufFile f = about_file(opt.model, [&] { return GgufFile::open(opt.model); });
    rank_files.emplace(opt.model, f, opt.workers, opt.tp);
  }
  const std::vector<std::string> parts = rank_files ? rank_files->paths() : opt.parts;
  // Worker processes: one per part, else one per stage rank.
  const int n_workers = parts.empty() ? opt.workers * opt.tp : int(parts.size());
  if (n_workers > 0) {
    LocalClusterOptions lo;
    lo.n_workers = n_workers;
    lo.model = std::filesystem::absolute(opt.model).string();
    for (const std::string& p : parts) lo.worker_models.push_back(std::filesystem::absolute(p).string());
    lo.threads_per_worker = opt.threads_per_worker > 0 ? opt.threads_per_worker
                                                       : std::max(1, opt.engine.stage.n_threads / n_workers);
    lo.wait_for_registration = false;
    lo.step_delay_ms = opt.worker_delay_ms;
    lo.backend = backend_name(backend);
    lo.gpus = opt.gpus;
    lo.worker_mem_limits = opt.worker_mem_limits;
    lo.staging_mb = opt.staging_mb;
    lo.cluster.link_mode = *net::link_mode_from_name(opt.link);
    ClusterEngineConfig cc;
    cc.model_path = opt.model;
    cc.model_id = opt.model_id;
    cc.n_workers = n_workers;
    cc.n_ctx = opt.engine.stage.n_ctx;
    cc.n_seq = opt.engine.stage.n_seq;
    cc.prefill_chunk = opt.engine.stage.max_batch;
    cc.batch_tokens = opt.engine.stage.max_batch;
    cc.queue_capacity = opt.engine.queue_capacity;
    cc.prefix_cache = opt.engine.prefix_cache;
    // The model's file is checked before any worker starts.
    {
      GgufFile check = about_file(opt.model, [&] { return GgufFile::open(opt.model); });
      const int n_layer = Arch::from_gguf(check)->dims().n_layer;
      if (opt.workers > n_layer && parts.empty()) {
        throw std::invalid_argument(std::to_string(opt.workers) + " workers for " + std::to_string(n_layer) +
                                    " layers: each stage needs at least one layer");
      }
    }
    Cluster* cluster = nullptr;
    if (opt.remote) {
      // Workers on other machines register here (`baton worker --coordinator
      // HOST:PORT --secret-file F --model ...`); the wait for them is long.
      ClusterOptions co;
      std::tie(co.bind_host, co.port) = net::split_host_port(opt.listen);
      co.register_timeout = std::chrono::hours(24);
      co.ready_timeout = std::chrono::hours(2);
      co.link_mode = lo.cluster.link_mode;
      remote = std::make_unique<Cluster>(net::load_secret_file(opt.secret_file), co);
      cluster = remote.get();
      if (info) std::fprintf(stderr, "baton serve: waiting for %d workers on %s\n", n_workers,
                   net::join_host_port(co.bind_host, remote->port()).c_str());
    } else {
      local = std::make_unique<LocalCluster>(lo);
      cluster = &local->cluster();
      cc.workers_alive = [&local] { return local->exited_worker(); };
    }
    cluster_engine = std::make_unique<ClusterEngine>(cc, *cluster, &metrics);
    service = cluster_engine.get();
    wait_loaded = [&] {
      cluster_engine->wait_loaded();
      if (local) local->restart_exited_workers();
    };
    stop_engine = [&] { cluster_engine->shutdown(); };
    if (info) std::fprintf(stderr, "baton serve: %s on %d %s workers (%s)\n", opt.model.c_str(), n_workers,
                 opt.remote ? "remote" : "local", chat_family_name(service->model().chat_family));
  } else {
    local_engine = about_file(opt.model, [&] { return std::make_unique<LocalEngine>(engine_config, &metrics); });
    service = local_engine.get();
    wait_loaded = [&] { local_engine->wait_loaded(); };
    stop_engine = [&] { local_engine->shutdown(); };
    if (info) std::fprintf(stderr, "baton serve: loading %s (%s, %.1f MiB planned: %s)\n", opt.model.c_str(),
                 service->model().arch.c_str(), double(local_engine->memory_plan().total()) / (1 << 20),
                 chat_family_name(service->model().chat_family));
  }
  GenerationService& engine = *service;
  const ModelInfo& model = engine.model();
  warn_beyond_trained_context("baton serve", model.n_ctx_train, model.n_ctx);

  if (chat_template) {
    if (info) std::fprintf(stderr, "baton serve: chat prompts from %s\n", chat_template_source.c_str());
    if (!model.chat_template_refused.empty()) {
      std::fprintf(stderr, "baton serve: warning: the model's own chat template does not load (%s); %s replaces it\n",
                   model.chat_template_refused.c_str(), chat_template_source.c_str());
    }
  } else if (model.chat_template && !model.chat_template_builtin.empty()) {
    if (info) {
      std::fprintf(stderr, "baton serve: chat prompts from the built-in template %s, which the model file's metadata "
                   "selects\n", model.chat_template_builtin.c_str());
    }
    if (!model.chat_template_refused.empty()) {
      std::fprintf(stderr, "baton serve: warning: the model's own chat template does not load (%s)\n",
                   model.chat_template_refused.c_str());
    }
  } else if (model.chat_template) {
    if (info) std::fprintf(stderr, "baton serve: chat prompts from the model's chat template\n");
  } else if (!model.chat_template_refused.empty()) {
    std::fprintf(stderr, "baton serve: the model's chat template is not used (%s); chat prompts use the %s format\n",
                 model.chat_template_refused.c_str(), chat_family_name(model.chat_family));
  }
  if (info && !opt.sampling.empty()) {
    std::fprintf(stderr, "baton serve: sampling defaults for requests that leave them out: %s\n",
                 describe(opt.sampling).c_str());
  }
  ApiOptions api_options;
  api_options.api_key = api_key;
  api_options.chat_template = chat_template;
  api_options.sampling = opt.sampling;
  api_options.template_timeout = std::chrono::milliseconds(int64_t(opt.template_timeout_s * 1000));
  api = std::make_unique<OpenAiApi>(engine, metrics, api_options);
  server.start();
  std::printf("baton serve: listening on http://%s\n", net::join_host_port(opt.http.host, server.port()).c_str());
  std::fflush(stdout);

  // Wait for the load, then for a signal.
  std::atomic<int> load_state{0};  // 0 loading, 1 loaded, 2 failed
  std::string load_error;
  std::thread waiter([&] {
    try {
      wait_loaded();
      std::printf("baton serve: ready (model %s, context %lld, %d slots)\n", model.id.c_str(),
                  (long long)model.n_ctx, opt.engine.stage.n_seq);
      std::fflush(stdout);
      load_state = 1;
    } catch (const std::exception& e) {
      load_error = e.what();
      load_state = 2;
    }
  });
  int signo = 0;
  while (load_state != 2) {
    timespec wait = {0, 200 * 1000 * 1000};
    int s = sigtimedwait(&signals, nullptr, &wait);
    if (s > 0) {
      signo = s;
      break;
    }
  }
  if (signo) std::fprintf(stderr, "baton serve: %s received, stopping\n", signo == SIGINT ? "SIGINT" : "SIGTERM");
  // The prompts first (renders in progress are cancelled, waiting requests
  // answered 503), then the engine: its last events go to connections that
  // still exist.
  api->stop();
  stop_engine();
  waiter.join();
  server.stop();
  if (signo == 0 && load_state == 2) throw std::runtime_error("cannot load the model: " + load_error);
  return 0;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  auto opt = parse(argc, argv);
  if (!opt || parse_only()) return 0;
  return serve(*opt);
}

}  // namespace baton
