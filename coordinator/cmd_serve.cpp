// `baton serve`: the OpenAI-compatible HTTP server (docs/SERVING.md). Today
// the model runs in this process (LocalEngine); the distributed coordinator
// will plug in behind the same GenerationService.
#include <signal.h>
#include <time.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "coordinator/http_server.h"
#include "coordinator/local_engine.h"
#include "coordinator/metrics.h"
#include "coordinator/openai_api.h"
#include "net/log.h"

namespace baton {

namespace {

namespace po = boost::program_options;

struct ServeOptions {
  std::string model;
  std::string config;
  int workers = 0;
  std::string api_key_file;
  std::string model_id;
  LocalEngineConfig engine;
  HttpServerConfig http;
  double request_timeout_s = 10, idle_timeout_s = 60, write_timeout_s = 30;
  bool quiet = false;
};

std::string usage_text(const po::options_description& desc) {
  std::string s =
      "usage: baton serve (-m MODEL | --config FILE) [--host H] [--port P] [--api-key-file F] [options]\n\n"
      "Serves a GGUF model over an OpenAI-compatible HTTP API:\n"
      "  POST /v1/chat/completions   chat (messages rendered with the model's chat template)\n"
      "  POST /v1/completions        plain text completion\n"
      "  GET  /v1/models             the served model\n"
      "  GET  /health                route state: stages, layers, loading progress, memory\n"
      "  GET  /metrics               Prometheus metrics\n"
      "Both completion routes stream server-sent events with \"stream\": true.\n\n"
      "Concurrent requests share the model by continuous batching: up to --parallel\n"
      "sequences hold a KV slot and advance in turns (prompt chunks of --batch tokens,\n"
      "then one token at a time); up to --queue more wait, and beyond that requests get\n"
      "429 with Retry-After. A client that disconnects has its generation cancelled.\n\n"
      "Once the port is open, stdout gets one line\n"
      "  baton serve: listening on http://HOST:PORT\n"
      "(with the real port when --port 0), then \"baton serve: ready ...\" when the\n"
      "model is loaded. Logs and one line per request go to stderr. SIGINT or SIGTERM\n"
      "stops the server: generations in flight end, connections close.\n\n"
      "With --api-key-file, every /v1/ request needs 'Authorization: Bearer KEY' (the\n"
      "file's first line); /health and /metrics stay open for probes and scrapers.\n\n"
      "--workers and --config (a cluster of worker processes) are not available yet:\n"
      "they come with the distributed runtime.\n\n";
  std::ostringstream o;
  o << desc;
  return s + o.str() + "\n";
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
      ("model,m", po::value<std::string>(&r.model), "GGUF model file to serve")
      ("config", po::value<std::string>(&r.config), "cluster topology file (not available yet)")
      ("workers", po::value<int>(&r.workers), "run the model on K local worker processes (not available yet)")
      ("host", po::value<std::string>(&r.http.host)->default_value("127.0.0.1"),
       "address to listen on (an IP address; 0.0.0.0 for every interface)")
      ("port", po::value<int>(&port)->default_value(8080), "TCP port; 0 = any free port (printed on stdout)")
      ("api-key-file", po::value<std::string>(&r.api_key_file),
       "file whose first line is the API key clients must send as a Bearer token")
      ("model-id", po::value<std::string>(&r.model_id),
       "the name clients pass as \"model\" (default: the file name without .gguf)")
      ("ctx", po::value<int64_t>(&r.engine.stage.n_ctx)->default_value(0),
       "context per sequence in tokens (prompt + completion); 0 = the model's, at most 4096")
      ("parallel", po::value<int>(&r.engine.stage.n_seq)->default_value(4),
       "sequences generated concurrently (each holds a KV cache slot of --ctx tokens)")
      ("queue", po::value<int>(&r.engine.queue_capacity)->default_value(64),
       "requests that may wait for a slot; more get 429")
      ("threads,t", po::value<int>(&r.engine.stage.n_threads)->default_value(hw),
       "CPU threads for the forward pass (default: all cores)")
      ("batch,b", po::value<int64_t>(&r.engine.stage.max_batch)->default_value(64),
       "prompt tokens per forward pass (one prefill step)")
      ("http-threads", po::value<int>(&r.http.threads)->default_value(2), "threads serving HTTP connections")
      ("max-body", po::value<uint64_t>(&max_body)->default_value(max_body),
       "largest request body in bytes; larger gets 413")
      ("max-connections", po::value<int>(&r.http.max_connections)->default_value(256),
       "open connections at most; more get 503")
      ("request-timeout", po::value<double>(&r.request_timeout_s)->default_value(10),
       "seconds a request may take to arrive once it started; slower gets 408")
      ("idle-timeout", po::value<double>(&r.idle_timeout_s)->default_value(60),
       "seconds an idle keep-alive connection stays open")
      ("write-timeout", po::value<double>(&r.write_timeout_s)->default_value(30),
       "seconds a client may take to accept each write before it is dropped")
      ("quiet,q", po::bool_switch(&r.quiet), "no per-request log lines");
  // clang-format on
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
  if (vm.count("help")) {
    std::cout << usage_text(desc);
    return std::nullopt;
  }
  po::notify(vm);
  if (vm.count("workers")) {
    throw std::invalid_argument(
        "--workers is not available yet: serving on worker processes comes with the distributed runtime; "
        "serve in this process with -m MODEL");
  }
  if (vm.count("config")) {
    throw std::invalid_argument(
        "--config is not available yet: cluster topologies come with the distributed runtime; "
        "serve in this process with -m MODEL");
  }
  if (r.model.empty()) throw std::invalid_argument("give the model to serve with -m MODEL (see --help)");
  if (port < 0 || port > 65535) throw std::invalid_argument("--port must be in 0..65535");
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
// never printed.
std::string read_api_key(const std::string& path) {
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
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return "models";
  if (path == "/health") return "health";
  if (path == "/metrics") return "metrics";
  return "other";
}

const char* error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

int serve(const ServeOptions& opt) {
  std::string api_key;
  if (!opt.api_key_file.empty()) api_key = read_api_key(opt.api_key_file);

  // Signals go to the main thread only (sigtimedwait below): block them
  // before any other thread starts so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A client that vanishes must not kill the process with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);

  Metrics metrics;
  LocalEngineConfig engine_config = opt.engine;
  // One progress line a second while loading, and one at the end.
  auto last_line = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  engine_config.on_load_progress = [last_line](const LoadProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.done < p.total && now - *last_line < std::chrono::seconds(1)) return;
    *last_line = now;
    std::fprintf(stderr, "baton serve: loading weights: %.1f / %.1f MiB (%.0f%%), %.2f GB/s, ETA %.1f s\n",
                 double(p.done) / (1 << 20), double(p.total) / (1 << 20),
                 p.total ? 100.0 * double(p.done) / double(p.total) : 100.0, p.rate() / 1e9, p.eta());
  };
  LocalEngine engine(engine_config, &metrics);
  const ModelInfo& model = engine.model();
  std::fprintf(stderr, "baton serve: loading %s (%s, %.1f MiB planned: %s)\n", model.path.c_str(), model.arch.c_str(),
               double(engine.memory_plan().total()) / (1 << 20), chat_family_name(model.chat_family));

  OpenAiApi api(engine, metrics, {api_key});
  HttpServerHooks hooks;
  hooks.error_body = [](int status, const std::string& message, const std::string& kind) {
    return error_body(message, error_type(status), "", kind);
  };
  hooks.on_error = [&metrics](int status, const std::string& kind) {
    metrics.error(kind);
    metrics.http_response("other", status);
  };
  const bool quiet = opt.quiet;
  hooks.access_log = [&metrics, quiet](const HttpRequest& req, int status, uint64_t bytes, double seconds) {
    metrics.http_response(route_name(req.path), status);
    if (quiet) return;
    std::fprintf(stderr, "baton serve: %s %s %d %.1f ms %llu B %s\n", net::printable(req.method, 16).c_str(),
                 net::printable(req.path, 200).c_str(), status, seconds * 1000, (unsigned long long)bytes,
                 req.remote.c_str());
  };
  HttpServer server(opt.http, [&api](std::shared_ptr<HttpExchange> ex) { api.handle(ex); }, hooks);
  server.start();
  std::printf("baton serve: listening on http://%s:%u\n", opt.http.host.c_str(), unsigned(server.port()));
  std::fflush(stdout);

  // Wait for the load, then for a signal.
  std::atomic<int> load_state{0};  // 0 loading, 1 loaded, 2 failed
  std::string load_error;
  std::thread waiter([&] {
    try {
      engine.wait_loaded();
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
  // The engine first: its last events go to connections that still exist.
  engine.shutdown();
  waiter.join();
  server.stop();
  if (signo == 0 && load_state == 2) throw std::runtime_error("cannot load the model: " + load_error);
  return 0;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  try {
    auto opt = parse(argc, argv);
    if (!opt) return 0;
    return serve(*opt);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::fprintf(stderr, "baton serve: %s\n", msg.c_str());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "baton serve: unknown error\n");
    return 1;
  }
}

}  // namespace baton
