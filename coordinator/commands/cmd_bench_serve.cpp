// `baton bench --serve`: a load benchmark through the HTTP API, the way a user
// of `baton serve` sees it (docs/PERFORMANCE.md, "Serving load benchmark").
// Starts `baton serve` with the arguments after `--` as a child process,
// waits for /health to say ok, then for each concurrency N runs N clients
// that stream /v1/completions of exactly P prompt and T completion tokens
// (token-id prompts, ignore_eos, greedy), and reports per level: aggregate
// and per-stream tokens/s, TTFT and inter-token latency percentiles. The
// server is stopped at the end, on errors and on SIGINT/SIGTERM.
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "coordinator/commands/bench_serve_child.h"
#include "coordinator/commands/bench_serve_client.h"
#include "coordinator/commands/commands.h"
#include "coordinator/commands/count_list.h"
#include "engine/base/command_error.h"
#include "engine/base/command_line.h"

namespace baton {

namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace bench_serve;

struct Options {
  std::vector<int> concurrency;
  int64_t prompt_tokens = 128;
  int64_t completion_tokens = 128;
  int requests_per_client = 2;
  double duration_s = 0;  // > 0: clients start requests until then instead
  std::string csv;        // "" = stdout
  std::string server_log;
  double level_timeout_s = 600;
  double load_timeout_s = 3600;
  uint64_t seed = 1;
  std::vector<std::string> serve_args;
  std::string api_key;
};

constexpr const char* kUsage =
    "usage: baton bench --serve [options] -- SERVE-ARGS...\n\n"
    "A load benchmark through the HTTP API. Starts `baton serve SERVE-ARGS` (this\n"
    "binary) on a free loopback port, waits until /health says ok (loading progress\n"
    "on stderr), sends one unmeasured warm-up request, then for each concurrency N\n"
    "runs N clients at once; each streams /v1/completions requests of exactly\n"
    "--prompt-tokens prompt tokens (random token ids) and --completion-tokens\n"
    "completion tokens (\"ignore_eos\": true, temperature 0), one after the other.\n"
    "The server is stopped at the end, on errors and on Ctrl-C.\n\n"
    "Per concurrency: aggregate tokens/s (completion tokens of the level over its\n"
    "wall time, first request sent to last response ended), per-stream tokens/s\n"
    "(each request's tokens after its first over the time between its first and\n"
    "last text events, averaged), time to first token and inter-token latency\n"
    "(between text events) at p50 and p99; from the server's /metrics, its\n"
    "first-stage forward seconds on prompt steps and on decode steps during the\n"
    "level, and the decode tokens per second of those decode steps. CSV goes to\n"
    "stdout (or --csv FILE), a table to stderr. Columns:\n"
    "  config,concurrency,prompt_tokens,max_tokens,requests,errors,completion_tokens,\n"
    "  wall_s,agg_tps,stream_tps,ttft_p50_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,\n"
    "  prefill_busy_s,decode_busy_s,decode_step_tps\n\n"
    "The server queues what its slots cannot hold: give it --parallel (and --queue)\n"
    "of at least the largest concurrency, or requests wait (or get 429, counted as\n"
    "errors). --host and --port are the benchmark's to choose. With --api-key-file\n"
    "or --api-key among SERVE-ARGS, or $BATON_API_KEY, the clients send that key.\n\n"
    "Example:\n"
    "  baton bench --serve --concurrency 1,4,16,64 -- -m model.gguf --parallel 64\n\n";

// The value of a serve option given as "--name V" or "--name=V", if any.
std::optional<std::string> serve_option(const std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(name + "=", 0) == 0) return args[i].substr(name.size() + 1);
  }
  return std::nullopt;
}

std::string read_key(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) throw std::runtime_error("cannot read the API key file " + path);
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!line.empty() && space(line.back())) line.pop_back();
  line.erase(line.begin(), std::find_if_not(line.begin(), line.end(), space));
  return line;
}

std::optional<Options> parse(int argc, char** argv) {
  Options o;
  int split = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      split = i;
      break;
    }
  }
  for (int i = split + 1; i < argc; ++i) o.serve_args.emplace_back(argv[i]);
  std::string concurrency;
  bool serve = false;
  po::options_description desc("options");
  // clang-format off
  desc.add_options()
      ("help,h", "print this help and exit")
      ("serve", po::bool_switch(&serve), "benchmark `baton serve` through its HTTP API (this mode)")
      ("concurrency,c", po::value<std::string>(&concurrency)->default_value("1,4,16,64"),
       "comma-separated counts of concurrent clients, one measurement each")
      ("prompt-tokens,p", po::value<int64_t>(&o.prompt_tokens)->default_value(128), "prompt tokens per request")
      ("completion-tokens,n", po::value<int64_t>(&o.completion_tokens)->default_value(128),
       "completion tokens per request")
      ("requests-per-client,r", po::value<int>(&o.requests_per_client)->default_value(2),
       "requests each client sends, one after the other")
      ("duration", po::value<double>(&o.duration_s)->default_value(0),
       "seconds: each client starts requests until this much time has passed (instead of -r)")
      ("csv", po::value<std::string>(&o.csv), "write the CSV to this file instead of stdout")
      ("server-log", po::value<std::string>(&o.server_log),
       "keep the server's stderr in this file (default: a temporary file, its end shown on failure)")
      ("timeout", po::value<double>(&o.level_timeout_s)->default_value(600),
       "seconds one concurrency level may take; then the benchmark stops with an error")
      ("load-timeout", po::value<double>(&o.load_timeout_s)->default_value(3600),
       "seconds the server may take to load the model")
      ("seed", po::value<uint64_t>(&o.seed)->default_value(1), "seed of the random prompt token ids");
  // clang-format on
  if (!parse_command_line(split, argv, {.options = desc, .help_head = kUsage})) return std::nullopt;
  if (o.serve_args.empty()) throw std::invalid_argument("give baton serve's arguments after `--` (see --help)");
  for (const std::string& a : o.serve_args) {
    for (const char* own : {"--host", "--port", "--help", "-h"}) {
      if (a == own || a.rfind(std::string(own) + "=", 0) == 0) {
        throw std::invalid_argument(fmt::format("{} is not a serve argument here: the benchmark chooses it", own));
      }
    }
  }
  for (const int64_t n : parse_count_list(concurrency, "--concurrency", 4096)) o.concurrency.push_back(int(n));
  if (o.prompt_tokens < 1) throw std::invalid_argument("--prompt-tokens must be at least 1");
  if (o.completion_tokens < 1) throw std::invalid_argument("--completion-tokens must be at least 1");
  if (o.requests_per_client < 1) throw std::invalid_argument("--requests-per-client must be at least 1");
  if (!(o.duration_s >= 0)) throw std::invalid_argument("--duration must be >= 0");
  if (!(o.level_timeout_s > 0) || !(o.load_timeout_s > 0)) throw std::invalid_argument("timeouts must be > 0");
  // The key the server will want, found where it looks for one.
  if (auto key_file = serve_option(o.serve_args, "--api-key-file")) {
    o.api_key = read_key(*key_file);
  } else if (auto key = serve_option(o.serve_args, "--api-key")) {
    o.api_key = *key;
  } else if (const char* env = std::getenv("BATON_API_KEY"); env && *env) {
    o.api_key = env;
  }
  return o;
}

// SIGINT/SIGTERM go to one watching thread (blocked everywhere else: this
// must be made before any other thread starts), which runs `on_signal`.
class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void()> on_signal) : on_signal_(std::move(on_signal)) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] {
      while (!stop_) {
        timespec wait = {0, 100 * 1000 * 1000};
        if (const int s = sigtimedwait(&set_, nullptr, &wait); s > 0) {
          signal_ = s;
          on_signal_();
        }
      }
    });
  }
  ~SignalWatcher() {
    stop_ = true;
    thread_.join();
  }
  int signal() const { return signal_; }

 private:
  sigset_t set_;
  std::function<void()> on_signal_;
  std::atomic<bool> stop_{false};
  std::atomic<int> signal_{0};
  std::thread thread_;
};

void check_interrupted(const SignalWatcher& w) {
  if (w.signal()) {
    throw CommandError(w.signal() == SIGINT ? "interrupted (SIGINT); the server was stopped"
                                            : "stopped (SIGTERM); the server was stopped",
                       128 + w.signal());
  }
}

// An error about the server: its log's last lines go to stderr first (the
// error itself is printed as one line).
[[noreturn]] void server_failed(const ServeChild& child, const std::string& message) {
  std::fprintf(stderr, "baton bench: the server's log ends with:\n%s", child.log_tail().c_str());
  throw std::runtime_error(message);
}

// Polls /health until "ok", a line of loading progress a second on stderr.
void wait_ready(ServeChild& child, HttpClient& http, const Options& o, const SignalWatcher& sig) {
  const auto t0 = Clock::now();
  auto last_line = t0;
  for (;;) {
    check_interrupted(sig);
    if (child.exited()) {
      server_failed(child, fmt::format("baton serve {} while loading", child.exit_text()));
    }
    json j;
    try {
      j = json::parse(http.get("/health").body, nullptr, false);
    } catch (const std::exception&) {
      // Not answering yet: the next round asks again (the exit is checked above).
    }
    const std::string status = j.is_object() ? j.value("status", "") : "";
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    if (status == "ok") {
      std::fprintf(stderr, "baton bench: the server is ready (%.1f s)\n", elapsed);
      return;
    }
    if (elapsed > o.load_timeout_s) {
      server_failed(child, fmt::format("the server was not ready within {} s (--load-timeout)", o.load_timeout_s));
    }
    if (Clock::now() - last_line >= std::chrono::seconds(1)) {
      last_line = Clock::now();
      double done = 0, total = 0;
      std::string errors;
      if (j.is_object() && j["stages"].is_array()) {
        for (const json& s : j["stages"]) {
          done += s.value("bytes_loaded", 0.0);
          total += s.value("bytes_total", 0.0);
          if (s.contains("error") && s["error"].is_string()) errors += "; " + s["error"].get<std::string>();
        }
      }
      std::fprintf(stderr, "baton bench: server %s: %.0f%% of %.1f MiB loaded, %.0f s%s\n",
                   status.empty() ? "starting" : status.c_str(), total > 0 ? 100 * done / total : 0.0,
                   total / (1 << 20), elapsed, errors.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

struct Served {
  std::string model;
  int64_t n_vocab = 0, n_ctx = 0;
};

Served served_model(HttpClient& http) {
  const HttpReply r = http.get("/v1/models");
  const json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || !j.is_object() || !j["data"].is_array() || j["data"].empty()) {
    throw std::runtime_error(fmt::format("GET /v1/models answered {}: {}", r.status, r.body.substr(0, 300)));
  }
  const json& m = j["data"][0];
  Served s;
  s.model = m.value("id", "");
  if (m.contains("meta") && m["meta"].is_object()) {
    s.n_vocab = m["meta"].value("n_vocab", int64_t(0));
    s.n_ctx = m["meta"].value("n_ctx", int64_t(0));
  }
  if (s.n_vocab < 8) throw std::runtime_error("/v1/models does not say the vocabulary size");
  return s;
}

// A request body: P token ids drawn from the middle of the vocabulary (where
// the families Baton serves keep ordinary text tokens, not special ones),
// different for every request so that no cache could shortcut the prefill.
std::string request_body(const Served& m, const Options& o, uint64_t stream) {
  std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + stream);
  std::uniform_int_distribution<int64_t> id(m.n_vocab / 8, m.n_vocab * 3 / 4 - 1);
  json prompt = json::array();
  for (int64_t i = 0; i < o.prompt_tokens; ++i) prompt.push_back(id(rng));
  json body = {{"model", m.model},
               {"prompt", prompt},
               {"max_tokens", o.completion_tokens},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  return body.dump();
}

// N clients at once, each sending its requests one after the other; the
// records of every request. A level past --timeout has its sockets shut.
std::vector<RequestRecord> run_level(int port, const Served& m, const Options& o, int n, int per_client,
                                     double duration_s, uint64_t level, SocketRegistry& sockets, bool& timed_out) {
  std::vector<std::vector<RequestRecord>> records(static_cast<size_t>(n));
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0, finished = 0;
  bool go = false;
  std::vector<std::thread> clients;
  auto client = [&](int c) {
    HttpClient http(port, o.api_key, sockets);
    try {
      http.connect();
    } catch (const std::exception&) {
      // stream() tries again and records the failure.
    }
    {
      std::unique_lock lock(mu);
      ++ready;
      cv.notify_all();
      cv.wait(lock, [&] { return go; });
    }
    const auto start = Clock::now();
    for (int k = 0;; ++k) {
      const bool more = duration_s > 0
                            ? k == 0 || std::chrono::duration<double>(Clock::now() - start).count() < duration_s
                            : k < per_client;
      if (!more || sockets.closed()) break;
      const uint64_t stream = (level << 40) | (uint64_t(c) << 20) | uint64_t(k);
      records[size_t(c)].push_back(http.stream("/v1/completions", request_body(m, o, stream)));
    }
    std::lock_guard lock(mu);
    ++finished;
    cv.notify_all();
  };
  try {
    for (int c = 0; c < n; ++c) clients.emplace_back(client, c);
  } catch (const std::system_error& e) {
    // Those started are waiting for the start: let them go, stopped.
    sockets.shutdown_all();
    {
      std::lock_guard lock(mu);
      go = true;
    }
    cv.notify_all();
    for (auto& t : clients) t.join();
    throw std::runtime_error(fmt::format("cannot start {} client threads: {}", n, e.what()));
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return ready == n; });
    go = true;
    cv.notify_all();
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o.level_timeout_s + duration_s));
    if (!cv.wait_until(lock, deadline, [&] { return finished == n; })) {
      timed_out = true;
      sockets.shutdown_all();
    }
  }
  for (auto& t : clients) t.join();
  std::vector<RequestRecord> all;
  for (auto& r : records) all.insert(all.end(), std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
  return all;
}

struct Row {
  int concurrency = 0;
  int64_t requests = 0, errors = 0, completion_tokens = 0;
  double wall_s = 0, agg_tps = 0, stream_tps = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, itl_p50_ms = 0, itl_p99_ms = 0;
  // The server's own account of the level (its /metrics counters before and
  // after): first-stage forward time on prompt steps and on decode-only steps,
  // and the decode tokens per second of those steps. wall_s minus both busy
  // times is what the HTTP layer, scheduling and idle gaps cost.
  double prefill_busy_s = 0, decode_busy_s = 0, decode_step_tps = 0;
  std::string first_error;
};

// The forward-time counters of /metrics (docs/SERVING.md, "Metrics").
struct BusyCounters {
  double prefill_s = 0, decode_s = 0, decode_tokens = 0;
};

double metric_value(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return 0;
  return std::strtod(text.c_str() + at + key.size(), nullptr);
}

BusyCounters read_busy(HttpClient& http) {
  const HttpReply r = http.get("/metrics");
  if (r.status != 200) return {};
  return {metric_value(r.body, "baton_prefill_seconds_total"), metric_value(r.body, "baton_decode_seconds_total"),
          metric_value(r.body, "baton_decode_tokens_total")};
}

void add_busy(Row& row, const BusyCounters& before, const BusyCounters& after) {
  row.prefill_busy_s = after.prefill_s - before.prefill_s;
  row.decode_busy_s = after.decode_s - before.decode_s;
  row.decode_step_tps = row.decode_busy_s > 0 ? (after.decode_tokens - before.decode_tokens) / row.decode_busy_s : 0;
}

// Nearest-rank percentile; 0 for no samples.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(p / 100 * double(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

Row summarize(int concurrency, const std::vector<RequestRecord>& recs) {
  Row row;
  row.concurrency = concurrency;
  row.requests = int64_t(recs.size());
  if (recs.empty()) return row;
  auto first = recs.front().sent, last = recs.front().done;
  std::vector<double> ttft, itl, stream_rates;
  for (const RequestRecord& r : recs) {
    first = std::min(first, r.sent);
    last = std::max(last, r.done);
    if (!r.ok) {
      ++row.errors;
      if (row.first_error.empty()) row.first_error = r.error;
      continue;
    }
    row.completion_tokens += r.completion_tokens;
    if (r.chunks > 0) ttft.push_back(std::chrono::duration<double>(r.first_token - r.sent).count());
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    const double span = std::chrono::duration<double>(r.last_token - r.first_token).count();
    if (r.chunks > 1 && span > 0) stream_rates.push_back(double(r.completion_tokens - 1) / span);
  }
  row.wall_s = std::chrono::duration<double>(last - first).count();
  row.agg_tps = row.wall_s > 0 ? double(row.completion_tokens) / row.wall_s : 0;
  double sum = 0;
  for (double x : stream_rates) sum += x;
  row.stream_tps = stream_rates.empty() ? 0 : sum / double(stream_rates.size());
  row.ttft_p50_ms = 1000 * percentile(ttft, 50);
  row.ttft_p99_ms = 1000 * percentile(ttft, 99);
  row.itl_p50_ms = 1000 * percentile(itl, 50);
  row.itl_p99_ms = 1000 * percentile(itl, 99);
  return row;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_row(const std::string& config, const Options& o, const Row& r) {
  return fmt::format("{},{},{},{},{},{},{},{:.3f},{:.2f},{:.2f},{:.2f},{:.2f},{:.3f},{:.3f},{:.3f},{:.3f},{:.2f}\n",
                     csv_field(config), r.concurrency, o.prompt_tokens, o.completion_tokens, r.requests, r.errors,
                     r.completion_tokens, r.wall_s, r.agg_tps, r.stream_tps, r.ttft_p50_ms, r.ttft_p99_ms,
                     r.itl_p50_ms, r.itl_p99_ms, r.prefill_busy_s, r.decode_busy_s, r.decode_step_tps);
}

constexpr const char* kCsvHeader =
    "config,concurrency,prompt_tokens,max_tokens,requests,errors,completion_tokens,wall_s,agg_tps,stream_tps,"
    "ttft_p50_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,prefill_busy_s,decode_busy_s,decode_step_tps\n";

// The server's log: the named file, or a temporary one removed at the end.
struct LogFile {
  explicit LogFile(const std::string& named) {
    if (!named.empty()) {
      path = named;
      return;
    }
    std::string tmpl = (fs::temp_directory_path() / "baton-bench-serve-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary folder for the server log");
    dir = tmpl;
    path = (fs::path(dir) / "serve.log").string();
  }
  ~LogFile() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
  std::string path, dir;
};

int bench(const Options& o) {
  signal(SIGPIPE, SIG_IGN);
  std::string config;
  for (const std::string& a : o.serve_args) config += (config.empty() ? "" : " ") + a;
  LogFile log(o.server_log);
  std::fprintf(stderr, "baton bench: starting baton serve %s\n", config.c_str());
  ServeChild child(o.serve_args, log.path, std::chrono::seconds(120));
  std::fprintf(stderr, "baton bench: baton serve runs as pid %d on port %d\n", int(child.pid()), child.port());
  SocketRegistry sockets;
  // Declared after the child: it stops watching before the child is reaped.
  SignalWatcher watcher([&] {
    child.terminate();
    sockets.shutdown_all();
  });
  HttpClient control(child.port(), o.api_key, sockets);
  wait_ready(child, control, o, watcher);
  const Served m = served_model(control);
  if (m.n_ctx > 0 && o.prompt_tokens + o.completion_tokens > m.n_ctx) {
    throw std::invalid_argument(fmt::format("{} prompt + {} completion tokens exceed the server's context of {} "
                                            "(give serve a larger --ctx)",
                                            o.prompt_tokens, o.completion_tokens, m.n_ctx));
  }

  // First-use costs (allocations, graph captures) stay out of the levels.
  bool timed_out = false;
  const std::vector<RequestRecord> warm =
      run_level(child.port(), m, o, 1, 1, 0, o.concurrency.size(), sockets, timed_out);
  check_interrupted(watcher);
  if (timed_out) {
    throw std::runtime_error(fmt::format("the warm-up request took longer than --timeout {} s", o.level_timeout_s));
  }
  if (warm.size() != 1 || !warm[0].ok) {
    server_failed(child, "the warm-up request failed: " + (warm.empty() ? std::string("not sent") : warm[0].error));
  }

  std::FILE* csv = stdout;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> csv_file(nullptr, &std::fclose);
  if (!o.csv.empty()) {
    csv_file.reset(std::fopen(o.csv.c_str(), "w"));
    if (!csv_file) throw std::runtime_error("cannot write " + o.csv);
    csv = csv_file.get();
  }
  std::fputs(kCsvHeader, csv);
  std::fflush(csv);
  std::vector<Row> rows;
  for (size_t level = 0; level < o.concurrency.size(); ++level) {
    const int n = o.concurrency[level];
    std::fprintf(stderr, "baton bench: concurrency %d ...\n", n);
    const BusyCounters busy_before = read_busy(control);
    const std::vector<RequestRecord> recs =
        run_level(child.port(), m, o, n, o.requests_per_client, o.duration_s, level, sockets, timed_out);
    check_interrupted(watcher);
    if (timed_out) {
      throw std::runtime_error(fmt::format("concurrency {} took longer than --timeout {} s", n, o.level_timeout_s));
    }
    if (child.exited()) {
      server_failed(child, fmt::format("baton serve {} during the benchmark", child.exit_text()));
    }
    Row row = summarize(n, recs);
    add_busy(row, busy_before, read_busy(control));
    if (row.errors > 0) {
      std::fprintf(stderr, "baton bench: %lld of %lld requests failed at concurrency %d; the first: %s\n",
                   (long long)row.errors, (long long)row.requests, n, row.first_error.c_str());
    }
    const int64_t short_by = (row.requests - row.errors) * o.completion_tokens - row.completion_tokens;
    if (short_by != 0) {
      std::fprintf(stderr, "baton bench: the completions at concurrency %d missed %lld of their tokens\n", n,
                   (long long)short_by);
    }
    std::fputs(csv_row(config, o, row).c_str(), csv);
    std::fflush(csv);
    rows.push_back(row);
  }
  std::fprintf(stderr, "\nbaton serve %s\nprompt %lld tokens, completion %lld tokens\n", config.c_str(),
               (long long)o.prompt_tokens, (long long)o.completion_tokens);
  std::fprintf(stderr, "%11s %8s %6s %10s %12s %17s %17s %8s %17s %12s\n", "concurrency", "requests", "errors",
               "agg tok/s", "stream tok/s", "TTFT p50/p99 ms", "ITL p50/p99 ms", "wall s", "busy pre/dec s",
               "step tok/s");
  for (const Row& r : rows) {
    std::fprintf(stderr, "%11d %8lld %6lld %10.1f %12.1f %8.1f/%-8.1f %8.2f/%-8.2f %8.2f %8.2f/%-8.2f %12.1f\n",
                 r.concurrency, (long long)r.requests, (long long)r.errors, r.agg_tps, r.stream_tps, r.ttft_p50_ms,
                 r.ttft_p99_ms, r.itl_p50_ms, r.itl_p99_ms, r.wall_s, r.prefill_busy_s, r.decode_busy_s,
                 r.decode_step_tps);
  }
  if (!o.server_log.empty()) std::fprintf(stderr, "server log: %s\n", o.server_log.c_str());
  return 0;
}

}  // namespace

int cmd_bench_serve(int argc, char** argv) {
  auto o = parse(argc, argv);
  if (!o || parse_only()) return 0;
  return bench(*o);
}

}  // namespace baton
