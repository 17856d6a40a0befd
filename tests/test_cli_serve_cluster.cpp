// `baton serve --workers K`: the server over a pipeline of local worker
// processes (tests/serve_client.h). The official client and the load test as
// for one process, then failure and healing: a killed or stalled worker fails
// the requests in flight quickly and is replaced, hostile bytes on the
// coordinator's and a worker's port change nothing, and the quick chaos run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "net/auth.h"
#include "net/codec.h"
#include "net/protocol.h"
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
  // The stalled process wakes to a closed link and exits; it is replaced.
  kill(victim, SIGCONT);
  ASSERT_TRUE(wait_status(port, "ok", 60s)) << health(port).dump() << server.stderr_text();
  Response after = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
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
  std::smatch m;
  const std::string err = server.stderr_text();
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(worker-0: registered with the coordinator at 127\.0\.0\.1:(\d+), listening on 127\.0\.0\.1:(\d+))")))
      << err;
  const int ports[2] = {std::stoi(m[1].str()), std::stoi(m[2].str())};

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
