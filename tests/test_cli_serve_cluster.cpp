// `baton serve --workers K`: the server over a pipeline of local worker
// processes (tests/serve_client.h). The official client and the load test as
// for one process, then failure and healing: a killed or stalled worker fails
// the requests in flight quickly and is replaced, hostile bytes on the
// coordinator's and a worker's port change nothing, and the quick chaos run.
#include <gtest/gtest.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "net/auth.h"
#include "net/codec.h"
#include "net/protocol.h"
#include "tests/json_schema_check.h"
#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using namespace serve_test;
using namespace std::chrono_literals;

// ---- the official openai npm client ----

TEST(ServeCluster, OfficialOpenAiNodeClientOnTwoWorkers) { check_official_client({"--workers", "2"}); }

// accept_token is shared, so ignore_eos holds through the worker pipeline too.
TEST(ServeCluster, IgnoreEosRunsToMaxTokensOnTwoWorkers) {
  ServeProcess server({"-m", stories(), "--workers", "2", "--quiet"});
  check_ignore_eos(server.port());
}

// Structured output through the pipeline: the coordinator masks, the last
// stage samples. The same seed gives the same JSON as in process, and it
// follows the schema; an unsupported keyword is a 400 naming it.
TEST(ServeCluster, JsonSchemaResponseFormatMatchesInProcessOnTwoWorkers) {
  const json schema = json::parse(R"({"type": "object", "properties": {"title": {"type": "string", "maxLength": 10},
      "n": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
      "required": ["title", "n", "tags"]})");
  const json body = {{"model", "stories260K"},
                     {"messages", json::array({{{"role", "user"}, {"content", "Give me JSON."}}})},
                     {"max_tokens", 300},
                     {"temperature", 1},
                     {"seed", 42},
                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}}}};
  std::string alone;
  {
    ServeProcess server({"-m", stories(), "--quiet"});
    const Response r = post(server.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    alone = r.j()["choices"][0]["message"]["content"].get<std::string>();
  }
  ServeProcess server({"-m", stories(), "--workers", "2", "--quiet"});
  const Response r = post(server.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "stop");
  const std::string text = r.j()["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_EQ(text, alone);
  const auto doc = nlohmann::ordered_json::parse(text, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << text;
  const auto oschema = nlohmann::ordered_json::parse(schema.dump());
  EXPECT_EQ(test::schema_violation(doc, oschema, oschema), "") << text;

  json bad = body;
  bad["response_format"]["json_schema"]["schema"]["properties"]["title"]["pattern"] = "^[a-z]+$";
  const Response refused = post(server.port(), "/v1/chat/completions", bad);
  EXPECT_EQ(refused.status, 400);
  EXPECT_NE(refused.body.find("'pattern' is not supported (at #/properties/title)"), std::string::npos) << refused.body;
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

// tool_choice "required" with Qwen 2.5's template: the model is made to
// write one Hermes call, which the response returns as tool_calls, the same
// in process and through the pipeline.
TEST(ServeCluster, RequiredToolChoiceGivesACallOnTwoWorkers) {
  const std::string tmpl = test::shared_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja";
  const json body = json::parse(R"({"model": "stories260K", "max_tokens": 300, "temperature": 1, "seed": 9,
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 0}},
      "required": ["city"]}}}],
    "tool_choice": "required"})");
  json alone;
  {
    ServeProcess server({"-m", stories(), "--quiet", "--chat-template", tmpl});
    const Response r = post(server.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    alone = r.j()["choices"][0];
  }
  ServeProcess server({"-m", stories(), "--workers", "2", "--quiet", "--chat-template", tmpl});
  const Response r = post(server.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = r.j()["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << choice.dump();
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice.dump();
  const json& fn = choice["message"]["tool_calls"][0]["function"];
  EXPECT_EQ(fn["name"], "get_weather");
  const json args = json::parse(fn["arguments"].get<std::string>());
  ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << args.dump();
  EXPECT_EQ(fn, alone["message"]["tool_calls"][0]["function"]);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

// ---- batching through the pipeline ----

// Six different prompts at once through two workers, four KV slots and a
// step budget of 8 tokens: micro-batches mix prompt chunks and decode tokens
// of several sequences, sequences start and end at different steps, and the
// last two wait for a slot. Each gets the text it gets alone in process.
// serve --workers passes --staging-mb to the workers it starts: each
// reports the ring it loaded with.
TEST(ServeCluster, StagingMbReachesTheLocalWorkers) {
  ServeProcess server({"-m", stories(), "--workers", "2", "--staging-mb", "8", "--quiet"});
  // The workers write their line before READY; the coordinator relays
  // their stderr on a thread of its own, so the lines may trail "ready".
  std::string err;
  int n = 0;
  for (int tries = 0; tries < 100 && n < 2; ++tries) {
    if (tries) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    err = server.stderr_text();
    n = 0;
    const std::string ring = "(staging 4 x 8 MiB)";
    for (size_t p = err.find(ring); p != std::string::npos; p = err.find(ring, p + 1)) ++n;
  }
  EXPECT_EQ(n, 2) << err;
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServeCluster, ConcurrentRequestsThroughMicroBatchesGetTheirTextAlone) {
  const std::vector<std::string> prompts = {"Once upon a time", "The cat", "Tom and his dog went to the park",
                                            "Lily", "One day, a little bird", "The sun was hot and"};
  auto body = [](const std::string& p) {
    return json{{"model", "stories260K"}, {"prompt", p}, {"max_tokens", 24}, {"temperature", 0}};
  };
  std::vector<std::string> alone;
  {
    ServeProcess server({"-m", stories(), "--parallel", "1", "--quiet"});
    for (const std::string& p : prompts) {
      const Response r = post(server.port(), "/v1/completions", body(p));
      ASSERT_EQ(r.status, 200) << r.body;
      alone.push_back(r.j()["choices"][0]["text"].get<std::string>());
    }
  }
  ServeProcess server({"-m", stories(), "--workers", "2", "--parallel", "4", "--batch", "8", "--quiet"});
  std::vector<std::string> got(prompts.size());
  std::vector<int> status(prompts.size(), 0);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      const Response r = post(server.port(), "/v1/completions", body(prompts[i]));
      status[i] = r.status;
      if (r.status == 200) got[i] = r.j()["choices"][0]["text"].get<std::string>();
    });
  }
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    EXPECT_EQ(status[i], 200);
    EXPECT_FALSE(alone[i].empty());
    EXPECT_EQ(got[i], alone[i]);
  }
}

// ---- load ----

// The same load through a pipeline of two worker processes
// (BATON_SERVE_LOAD_WORKERS changes the count; the soak uses it).
TEST(ServeCluster, LoadStreamsAllFinishAndMetricsMatch) {
  run_load_test({"--workers", std::to_string(env_int("BATON_SERVE_LOAD_WORKERS", 2))},
                env_int("BATON_SERVE_LOAD_CLIENTS", 16), env_int("BATON_SERVE_LOAD_SECONDS", 10));
}

// ---- failure and healing ----

TEST(ServeCluster, KilledWorkerFailsTheStreamWithinTwoSecondsThenTheRouteHeals) {
  // Slow workers keep the stream going long enough to kill one inside it.
  ServeProcess server({"-m", stories(), "--workers", "3", "--worker-delay-ms", "20", "--ctx", "1024"});
  const int port = server.port();
  const json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  Response before = post(port, "/v1/completions", req);
  ASSERT_EQ(before.status, 200) << before.body;
  const std::string want = before.j()["choices"][0]["text"];
  json h = health(port);
  ASSERT_EQ(h["stages"].size(), 3u) << h.dump();
  for (const json& st : h["stages"]) EXPECT_EQ(st["state"], "loaded") << h.dump();

  const pid_t victim = worker_pid(server, 1);
  ASSERT_GT(victim, 0) << server.stderr_text();
  int fd = start_long_stream(port, 900);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string rest = read_all(fd);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_LT(seconds, 2.0) << rest;
  EXPECT_NE(rest.find("generation failed"), std::string::npos) << rest;
  EXPECT_NE(rest.find("worker-1"), std::string::npos) << rest;
  EXPECT_NE(rest.find("stage 1"), std::string::npos) << rest;

  // The coordinator stays up; the worker is started again, loads, and the
  // route heals without restarting anything else.
  // The coordinator stays up and says the route is incomplete until the
  // worker is back (503 for probes), naming what is missing.
  Response broken = http(port, "GET", "/health");
  ASSERT_TRUE(broken.status == 503 || broken.status == 200) << broken.status;
  if (broken.status == 503) {
    EXPECT_EQ(broken.j()["status"], "error") << broken.body;
    EXPECT_NE(broken.body.find("worker-1"), std::string::npos) << broken.body;
  }
  ASSERT_TRUE(wait_status(port, "ok", 60s)) << health(port).dump() << server.stderr_text();
  EXPECT_NE(worker_pid(server, 1), victim);
  EXPECT_NE(server.stderr_text().find("starting it again"), std::string::npos);
  Response after = post(port, "/v1/completions", req);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.j()["choices"][0]["text"], want);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

// Regression: a stalled worker (SIGSTOP, a hung disk read, a deadlock) was
// declared dead but never replaced, since only exited workers were
// restarted: the outage lasted as long as the stall. Now the coordinator
// kills it and starts another.
TEST(ServeCluster, StalledWorkerFailsRequestsAndIsReplaced) {
  ServeProcess server({"-m", stories(), "--workers", "2", "--worker-delay-ms", "20", "--ctx", "1024"});
  const int port = server.port();
  const pid_t victim = worker_pid(server, 0);
  ASSERT_GT(victim, 0);
  int fd = start_long_stream(port, 900);
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string rest = read_all(fd);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  // A stall is noticed by the heartbeat timeout (1.5 s).
  EXPECT_LT(seconds, 2.5) << rest;
  EXPECT_NE(rest.find("worker-0"), std::string::npos) << rest;
  // While the route is broken, requests get 503 rather than hanging.
  Response during = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_TRUE(during.status == 503 || during.status == 200) << during.status << during.body;
  // The process stays stopped: it is killed and replaced all the same.
  const bool healed = wait_status(port, "ok", 15s);
  const double replaced = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill(victim, SIGCONT);
  ASSERT_TRUE(healed) << health(port).dump() << server.stderr_text();
  std::printf("stalled worker replaced, route whole again %.2f s after SIGSTOP\n", replaced);
  EXPECT_NE(worker_pid(server, 0), victim);
  EXPECT_NE(server.stderr_text().find("lost its link to the coordinator; stopping it"), std::string::npos);
  Response after = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

// The sockets and pipes a process holds, by fd: "socket:[inode]", "pipe:[inode]".
std::map<int, std::string> endpoints_of(pid_t pid) {
  std::map<int, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (!ec && (target.rfind("socket:", 0) == 0 || target.rfind("pipe:", 0) == 0)) {
      out[std::stoi(e.path().filename().string())] = target;
    }
  }
  return out;
}

// Regression: spawn() forked without closing inherited descriptors, so
// workers (restarted ones most of all) held the HTTP listener, the cluster
// listener, open client connections and the other workers' links.
TEST(ServeCluster, WorkersInheritNoDescriptorOfTheCoordinator) {
  ServeProcess server({"-m", stories(), "--workers", "2"});
  const int port = server.port();
  // A client connection is open while worker-1 is started again.
  const int client = connect_to(port, 10s);
  const pid_t first = worker_pid(server, 1);
  ASSERT_EQ(kill(first, SIGKILL), 0);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (worker_pid(server, 1) == first && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_NE(worker_pid(server, 1), first) << server.stderr_text();
  ASSERT_TRUE(wait_status(port, "ok", 30s)) << health(port).dump() << server.stderr_text();
  std::set<std::string> coordinator;
  for (const auto& [fd, what] : endpoints_of(server.pid())) coordinator.insert(what);
  ASSERT_FALSE(coordinator.empty());
  for (int i = 0; i < 2; ++i) {
    const pid_t w = worker_pid(server, i);
    SCOPED_TRACE("worker-" + std::to_string(i) + " pid " + std::to_string(w));
    const auto held = endpoints_of(w);
    ASSERT_FALSE(held.empty());
    for (const auto& [fd, what] : held) {
      // stdout and stderr are the worker's own: /dev/null and its log pipe.
      if (fd <= 2) continue;
      EXPECT_EQ(coordinator.count(what), 0u) << "fd " << fd << " (" << what << ") is the coordinator's";
    }
  }
  ::close(client);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

// Regression: a worker that could not load restarted every second forever,
// and /health and the 503 body said only "disconnected: peer closed the
// connection" while the cause was on the worker's stderr alone.
TEST(ServeCluster, AWorkerThatCannotLoadBacksOffAndHealthSaysWhy) {
  test::TempDir dir;
  const std::string model = dir.file("stories260K.gguf");  // the model id is the file stem
  fs::copy_file(stories(), model);
  ServeProcess server({"-m", model, "--workers", "2"});
  const int port = server.port();
  fs::resize_file(model, fs::file_size(model) / 2);
  ASSERT_EQ(kill(worker_pid(server, 1), SIGKILL), 0);
  const std::string cause = "extends past the end of the file";
  const auto deadline = std::chrono::steady_clock::now() + 6s;
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    seen = health(port).dump().find(cause) != std::string::npos;
    if (!seen) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(seen) << health(port).dump() << server.stderr_text();
  Response r = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find(cause), std::string::npos) << r.body;
  // Restarts 0.5 s, 1 s, 2 s apart... (the first after the kill).
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (server.stderr_text().find("starting it again in 2.0 s") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(100ms);
  }
  const std::string log = server.stderr_text();
  for (const char* delay : {"starting it again in 0.5 s", "starting it again in 1.0 s", "starting it again in 2.0 s"}) {
    EXPECT_NE(log.find(delay), std::string::npos) << delay << "\n" << log;
  }
  EXPECT_NE(log.find("route broken: worker-1 (pid"), std::string::npos) << log;
  EXPECT_EQ(server.stop(), 0) << log;
}

// Regression: the private folder holding a local cluster's secret stayed in
// the temporary folder when the coordinator was SIGKILLed. The secret now
// reaches the workers through a pipe and nothing is written.
TEST(ServeCluster, ASigkilledCoordinatorLeavesNoSecretBehind) {
  test::TempDir tmp;
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", tmp.path().c_str(), 1);
  std::vector<pid_t> workers;
  {
    ServeProcess server({"-m", stories(), "--workers", "2"});
    if (old) {
      ::setenv("TMPDIR", saved.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
    for (int i = 0; i < 2; ++i) workers.push_back(worker_pid(server, i));
    ASSERT_EQ(kill(server.pid(), SIGKILL), 0);
    server.stop();
  }
  for (pid_t w : workers) kill(w, SIGKILL);  // they would exit on the lost link; do not wait for it
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    EXPECT_EQ(e.path().filename().string().rfind("baton-cluster-", 0), std::string::npos) << e.path() << " is left";
  }
}

// The coordinator's cluster port and worker-0's listening port, from the
// worker's log line; empty when not found.
std::vector<int> cluster_ports(const ServeProcess& server) {
  std::smatch m;
  const std::string err = server.stderr_text();
  static const std::regex line(
      R"(worker-0: registered with the coordinator at 127\.0\.0\.1:(\d+), listening on 127\.0\.0\.1:(\d+))");
  if (!std::regex_search(err, m, line)) return {};
  return {std::stoi(m[1].str()), std::stoi(m[2].str())};
}

// Regression: 64 silent connections on the coordinator's cluster port,
// reopened as the handshake timeout closed them, filled every handshake slot,
// so each restarted worker was refused and the route stayed down for as long
// as the flood lasted. A newcomer now takes the slot of the oldest silent one.
TEST(ServeCluster, AHandshakeFloodOnTheClusterPortDoesNotStopHealing) {
  ServeProcess server({"-m", stories(), "--workers", "2"});
  const int port = server.port();
  const std::vector<int> ports = cluster_ports(server);
  ASSERT_EQ(ports.size(), 2u) << server.stderr_text();
  test::ConnectionFlood flood(uint16_t(ports[0]), 64);  // the coordinator's max_pending_handshakes
  std::this_thread::sleep_for(300ms);
  const pid_t victim = worker_pid(server, 1);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + 20s;
  while (worker_pid(server, 1) == victim && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(wait_status(port, "ok", 20s)) << health(port).dump() << server.stderr_text();
  std::printf("route healed %.2f s after the kill, under a flood of 64 silent connections\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  Response after = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

// A free loopback port (bound, read, released: the caller binds it next).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("no free port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// `baton serve --config` of a remote cluster of three `baton worker`s that
// this test starts, worker-1 behind a test::TcpProxy: worker-1 advertises
// the proxy's port (--advertise), so worker-0's link to it runs through the
// proxy, which the test cuts and restores while every process stays up.
struct ProxiedCluster {
  explicit ProxiedCluster(std::vector<std::string> serve_args = {}) {
    const std::string secret = dir.file("secret");
    const std::string key(64, 's');
    test::write_file(secret, std::vector<uint8_t>(key.begin(), key.end()));
    fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
    const std::string cfg = dir.file("remote.toml");
    const std::string text = "[model]\npath = \"" + stories() + "\"\n[cluster]\nworkers = 3\nlocal = false\n" +
                             "listen = \"127.0.0.1:0\"\nsecret_file = \"" + secret + "\"\n";
    test::write_file(cfg, std::vector<uint8_t>(text.begin(), text.end()));
    serve_args.insert(serve_args.begin(), {"--config", cfg});
    server = std::make_unique<ServeProcess>(serve_args, /*wait_ready=*/false);
    std::smatch m;
    static const std::regex waiting(R"(waiting for 3 workers on 127\.0\.0\.1:(\d+))");
    std::string err;
    for (int i = 0; i < 200 && !std::regex_search(err = server->stderr_text(), m, waiting); ++i) {
      std::this_thread::sleep_for(50ms);
    }
    if (m.empty()) throw std::runtime_error("the coordinator did not listen: " + err);
    const std::string coordinator = "127.0.0.1:" + m[1].str();
    const int behind = free_port();
    proxy = std::make_unique<test::TcpProxy>(uint16_t(behind));
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> argv = {test::baton_binary(), "worker", "--coordinator", coordinator, "--secret-file",
                                       secret, "--model", stories(), "--name", "worker-" + std::to_string(i),
                                       "--backend", "cpu", "--step-delay-ms", "5"};
      if (i == 1) {
        for (const std::string& a : {std::string("--listen"), "127.0.0.1:" + std::to_string(behind),
                                     std::string("--advertise"), "127.0.0.1:" + std::to_string(proxy->port())}) {
          argv.push_back(a);
        }
      }
      const test::Spawned w = test::spawn_piped(argv, dir.file("worker-" + std::to_string(i) + ".err"));
      ::close(w.stdout_fd);
      workers.push_back(w.pid);
    }
  }
  ~ProxiedCluster() {
    server->stop();
    for (pid_t w : workers) {
      kill(w, SIGTERM);
      int status = 0;
      waitpid(w, &status, 0);
    }
  }
  std::string logs() const {
    std::string all = server->stderr_text();
    for (int i = 0; i < 3; ++i) {
      const auto b = test::read_file(dir.file("worker-" + std::to_string(i) + ".err"));
      all += "\n--- worker-" + std::to_string(i) + " ---\n" + std::string(b.begin(), b.end());
    }
    return all;
  }

  test::TempDir dir;
  std::unique_ptr<ServeProcess> server;
  std::unique_ptr<test::TcpProxy> proxy;
  std::vector<pid_t> workers;
};

// ---- start order: a remote worker waits for its coordinator ----

// `baton serve --config` of a remote cluster of one worker on a fixed
// coordinator port, and one `baton worker` that the test starts on its own.
struct RestartableCoordinator {
  RestartableCoordinator() : coordinator("127.0.0.1:" + std::to_string(free_port())) {
    const std::string key(64, 'r');
    test::write_file(secret, std::vector<uint8_t>(key.begin(), key.end()));
    fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
    const std::string text = "[model]\npath = \"" + stories() + "\"\n[cluster]\nworkers = 1\nlocal = false\n" +
                             "listen = \"" + coordinator + "\"\nsecret_file = \"" + secret + "\"\n";
    test::write_file(cfg, std::vector<uint8_t>(text.begin(), text.end()));
  }
  ~RestartableCoordinator() {
    server.reset();
    if (worker > 0) {
      kill(worker, SIGTERM);
      int status = 0;
      waitpid(worker, &status, 0);
    }
  }
  void start_worker() {
    const test::Spawned w =
        test::spawn_piped({test::baton_binary(), "worker", "--coordinator", coordinator, "--secret-file", secret,
                           "--model", stories(), "--name", "w-0", "--backend", "cpu"},
                          worker_err);
    ::close(w.stdout_fd);
    worker = w.pid;
  }
  void start_server() { server = std::make_unique<ServeProcess>(std::vector<std::string>{"--config", cfg}); }
  bool worker_running() { return worker > 0 && waitpid(worker, nullptr, WNOHANG) == 0; }
  std::string worker_log() const {
    const auto b = test::read_file(worker_err);
    return std::string(b.begin(), b.end());
  }
  int completion() const {
    const json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
    return post(server->port(), "/v1/completions", req).status;
  }

  test::TempDir dir;
  const std::string secret = dir.file("secret"), cfg = dir.file("remote.toml"), worker_err = dir.file("w-0.err");
  const std::string coordinator;
  std::unique_ptr<ServeProcess> server;
  pid_t worker = -1;
};

// A worker started before its coordinator does not exit ("Connection
// refused"): it dials again with backoff, saying what it waits for, and
// registers once the coordinator is up.
TEST(ServeCluster, ARemoteWorkerStartedBeforeItsCoordinatorRegistersWhenItComes) {
  RestartableCoordinator c;
  c.start_worker();
  std::this_thread::sleep_for(1500ms);
  ASSERT_TRUE(c.worker_running()) << c.worker_log();
  const std::string log = c.worker_log();
  EXPECT_NE(log.find("w-0: waiting for the coordinator at " + c.coordinator), std::string::npos) << log;
  // 0.2 + 0.4 + 0.8 s of backoff: at most 2 lines of waiting (one every 5 s).
  size_t lines = 0;
  for (size_t at = 0; (at = log.find("waiting for the coordinator", at)) != std::string::npos; ++at) ++lines;
  EXPECT_LE(lines, 2u) << log;
  const auto t0 = std::chrono::steady_clock::now();
  c.start_server();  // returns once the worker's stage is loaded ("ready")
  std::printf("registered %.2f s after the coordinator started\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_EQ(c.completion(), 200) << c.server->stderr_text() << c.worker_log();
  EXPECT_TRUE(c.worker_running());
}

// When the coordinator stops (SIGTERM: it sends SHUTDOWN) and comes back on
// the same port, the same worker process drops its stage, registers again
// and serves: it never exits.
TEST(ServeCluster, ARemoteWorkerRegistersAgainAfterItsCoordinatorRestarts) {
  RestartableCoordinator c;
  c.start_worker();
  c.start_server();
  ASSERT_EQ(c.completion(), 200) << c.server->stderr_text() << c.worker_log();
  EXPECT_EQ(c.server->stop(), 0) << c.server->stderr_text();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(c.worker_running()) << c.worker_log();
  EXPECT_NE(c.worker_log().find("w-0: the coordinator at " + c.coordinator + " went away"), std::string::npos)
      << c.worker_log();
  c.start_server();
  std::printf("registered again %.2f s after the coordinator stopped\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_EQ(c.completion(), 200) << c.server->stderr_text() << c.worker_log();
  ASSERT_TRUE(c.worker_running()) << c.worker_log();
  const std::string log = c.worker_log();
  size_t registered = 0;
  for (size_t at = 0; (at = log.find("w-0: registered with the coordinator", at)) != std::string::npos; ++at) {
    ++registered;
  }
  EXPECT_EQ(registered, 2u) << log;
}

// Regression: a link between two workers that dropped while both processes
// stayed up (a NAT or firewall reset) was never dialled again: every request
// failed with 500 while /health said 200 ok. Now the stage that dials the
// link says it is down (the route is broken: a stream in flight ends with an
// error naming the unreachable worker, requests get 503, /health says why)
// and dials it again with backoff; the route heals within 2 s of the way
// being open again.
TEST(ServeCluster, ADroppedLinkBetweenLiveWorkersBreaksTheRouteThenHeals) {
  ProxiedCluster c({"--ctx", "1024"});
  const int port = c.server->port();
  ASSERT_TRUE(wait_status(port, "ok", 60s)) << c.logs();
  ASSERT_EQ(c.proxy->relayed(), 1) << c.logs();
  const json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
  const Response before = post(port, "/v1/completions", req);
  ASSERT_EQ(before.status, 200) << before.body;

  int fd = start_long_stream(port, 900);
  c.proxy->cut();
  const auto t_cut = std::chrono::steady_clock::now();
  const std::string rest = read_all(fd);
  ::close(fd);
  const double stream_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_cut).count();
  EXPECT_LT(stream_s, 2.0) << rest;
  EXPECT_NE(rest.find("generation failed"), std::string::npos) << rest;
  EXPECT_NE(rest.find("worker worker-1 (stage 1"), std::string::npos) << rest;
  EXPECT_NE(rest.find("unreachable from stage 0"), std::string::npos) << rest;

  // While the link is down: 503 with the reason, /health not ok and why.
  Response h = http(port, "GET", "/health");
  EXPECT_EQ(h.status, 503) << h.body;
  EXPECT_EQ(h.j()["status"], "error") << h.body;
  EXPECT_NE(h.j()["stages"][1]["error"].dump().find("unreachable from stage 0"), std::string::npos) << h.body;
  const Response during = post(port, "/v1/completions", req);
  EXPECT_EQ(during.status, 503) << during.body;
  EXPECT_NE(during.body.find("worker-1"), std::string::npos) << during.body;
  // Several dials fail meanwhile (the proxy resets each), so the backoff
  // grows; BATON_LINK_CUT_MS changes how long the link stays cut, and so
  // where in the dialling the way opens again.
  const int cut_ms = env_int("BATON_LINK_CUT_MS", 1500);
  std::this_thread::sleep_for(std::chrono::milliseconds(cut_ms));
  EXPECT_EQ(http(port, "GET", "/health").status, 503);
  if (cut_ms >= 1000) EXPECT_GE(c.proxy->accepted(), 4) << c.logs();  // the first link and 3 dials at least

  c.proxy->restore();
  const auto t_open = std::chrono::steady_clock::now();
  auto since_open = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_open).count(); };
  while (health(port)["status"] != "ok" && since_open() < 10) std::this_thread::sleep_for(10ms);
  const double whole_s = since_open();
  Response after;
  while (since_open() < 10) {
    after = post(port, "/v1/completions", req);
    if (after.status == 200) break;
    std::this_thread::sleep_for(10ms);
  }
  const double heal_s = since_open();
  std::printf("link cut: stream failed in %.2f s; after the way was open again: /health ok in %.2f s, "
              "first 200 in %.2f s\n", stream_s, whole_s, heal_s);
  ASSERT_EQ(after.status, 200) << after.body << c.logs();
  EXPECT_LT(heal_s, 2.0) << c.logs();
  EXPECT_EQ(after.j()["choices"][0]["text"], before.j()["choices"][0]["text"]);
  EXPECT_EQ(health(port)["status"], "ok");
  // Nothing was restarted: the same three processes serve.
  for (pid_t w : c.workers) EXPECT_EQ(kill(w, 0), 0);
}

// Wrong secret, wrong version, a truncated frame, an oversized length and
// random bytes on the coordinator's port and on a worker's port: each closes
// only that connection; the cluster serves on, with the same tokens.
TEST(ServeCluster, HostileBytesOnCoordinatorAndWorkerPortsChangeNothing) {
  ServeProcess server({"-m", stories(), "--workers", "2"});
  const int port = server.port();
  const json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
  Response before = post(port, "/v1/completions", req);
  ASSERT_EQ(before.status, 200) << before.body;
  const std::vector<int> ports = cluster_ports(server);
  ASSERT_EQ(ports.size(), 2u) << server.stderr_text();

  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto hello = [] {
    net::Hello h;
    h.role = net::Role::worker;
    h.node_name = "intruder";
    h.nonce = net::random_nonce();
    return h;
  };
  // Sends the bytes and expects the peer to close within 10 s.
  auto closed_after = [](int p, const std::vector<uint8_t>& bytes, bool half_close) {
    int fd = connect_to(p, 10s);
    send_all(fd, std::string(bytes.begin(), bytes.end()));
    if (half_close) shutdown(fd, SHUT_WR);
    char buf[4096];
    ssize_t n = 0;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
    }
    ::close(fd);
    return n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE));
  };
  for (int p : ports) {
    SCOPED_TRACE("port " + std::to_string(p));
    std::vector<uint8_t> noise(4096);
    for (auto& b : noise) b = uint8_t(rng());
    EXPECT_TRUE(closed_after(p, noise, false));
    std::vector<uint8_t> huge = {0xf0, 0xff, 0xff, 0xff, 0x01, 0x00};  // 4 GiB HELLO
    EXPECT_TRUE(closed_after(p, huge, false));
    std::vector<uint8_t> truncated = net::Codec::encode(hello());
    truncated.resize(truncated.size() - 5);
    EXPECT_TRUE(closed_after(p, truncated, true));
    net::Hello old = hello();
    old.protocol_version = net::kProtocolVersion + 1;
    EXPECT_TRUE(closed_after(p, net::Codec::encode(old), false));
    // A full HELLO, then a proof made without the secret.
    int fd = connect_to(p, 10s);
    const std::vector<uint8_t> h = net::Codec::encode(hello());
    send_all(fd, std::string(h.begin(), h.end()));
    net::FrameDecoder dec(net::kHandshakeMaxPayload);
    net::Message msg;
    std::error_code ec;
    char buf[4096];
    bool got = false;
    while (!got) {
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      dec.feed(std::span<const uint8_t>(reinterpret_cast<uint8_t*>(buf), size_t(n)));
      got = dec.next(msg, ec);
    }
    ASSERT_TRUE(got && std::holds_alternative<net::Challenge>(msg));
    const std::vector<uint8_t> bad = net::Codec::encode(net::AuthResponse{});
    send_all(fd, std::string(bad.begin(), bad.end()));
    ssize_t n = 0;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
    }
    EXPECT_LE(n, 0);
    ::close(fd);
  }
  Response after = post(port, "/v1/completions", req);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.j()["choices"][0]["text"], before.j()["choices"][0]["text"]);
  EXPECT_EQ(health(port)["status"], "ok");
  const std::string log = server.stderr_text();
  EXPECT_NE(log.find("intruder"), std::string::npos) << "the refusals are logged";
  EXPECT_EQ(server.stop(), 0) << log;
}

// The quick form of the chaos run (tests/reliability/chaos.py; the long form
// is one command in docs/RELIABILITY.md): workers killed, stalled and cut in
// a prefill while clients send requests; every request completes or fails
// clearly, and after recovery every request succeeds.
TEST(ServeCluster, ChaosQuick) {
  if (test::run_command({"/usr/bin/env", "python3", "--version"}).exit_code != 0) GTEST_SKIP() << "no python3";
  const std::string script = test::source_path("tests/reliability/chaos.py");
  auto r = test::run_command({"/usr/bin/env", "python3", script, "--baton", test::baton_binary(), "--model", stories(),
                              "--seconds", "15", "--clients", "3", "--recovery-requests", "5", "--seed",
                              std::to_string(test::test_seed())});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("chaos: PASS"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace baton
