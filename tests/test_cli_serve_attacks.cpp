// Attacks on `baton serve` over loopback (docs/RELIABILITY.md, "Attacks,
// second round: the HTTP server"): requests pipelined behind a generation,
// clients that leave pipelined connections, clients that reset as soon as
// they have an answer, deeply nested JSON, one address holding connections,
// and an API key file others may read. The HTTP server alone, in process:
// test_cli_serve_http.cpp.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;
using namespace std::chrono_literals;

// A POST that keeps the connection open (request_text asks to close it).
std::string keep_alive_post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

const std::string kHealthThenClose = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

// A completion that runs until cancelled (EOS banned).
json long_completion(bool stream = false) {
  return {{"model", kModel},   {"prompt", "Once upon a time"}, {"max_tokens", 2000},
          {"temperature", 0},  {"stream", stream},             {"logit_bias", {{"2", -100}}}};
}

void reset_on_close(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

// Every baton_http_responses_total series but the scrapes' own.
double responses_counted(int port) {
  std::istringstream in(http(port, "GET", "/metrics").body);
  double sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("baton_http_responses_total{", 0) == 0 && line.find("endpoint=\"metrics\"") == std::string::npos) {
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return sum;
}

bool wait_slots_free(int port, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (metric(port, "baton_slots_busy") == 0 && metric(port, "baton_queue_depth") == 0) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ServeAttacks, RequestsPipelinedBehindACompletionAreAnsweredInOrder) {
  ServeProcess server({"-m", stories(), "--ctx", "2048"});
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    json req = long_completion(stream);
    req["max_tokens"] = 1000;
    const int fd = connect_to(server.port());
    ASSERT_TRUE(send_all(fd, keep_alive_post("/v1/completions", req.dump())));
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(send_all(fd, kHealthThenClose));
    std::string buf;
    const Response first = read_response(fd, buf);
    EXPECT_EQ(first.status, 200);
    EXPECT_TRUE(first.complete);
    if (stream) {
      const auto events = sse_events(first.body);
      ASSERT_FALSE(events.empty());
      EXPECT_EQ(events.back(), "[DONE]");
    } else {
      EXPECT_EQ(first.j()["choices"][0]["finish_reason"], "length") << first.body;
      EXPECT_EQ(first.j()["usage"]["completion_tokens"], 1000);
    }
    const Response second = read_response(fd, buf);
    EXPECT_EQ(second.status, 200);
    EXPECT_EQ(second.j()["status"], "ok") << second.body;
    close(fd);
  }
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(ServeAttacks, ClientsThatLeavePipelinedConnectionsHaveTheirGenerationsCancelled) {
  ServeProcess server({"-m", stories(), "--parallel", "4", "--ctx", "2048"});
  const int port = server.port();
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    fds.push_back(connect_to(port));
    ASSERT_TRUE(send_all(fds.back(), keep_alive_post("/v1/completions", long_completion(i % 2).dump())));
  }
  std::this_thread::sleep_for(50ms);
  for (int fd : fds) ASSERT_TRUE(send_all(fd, kHealthThenClose));
  std::this_thread::sleep_for(100ms);
  for (int fd : fds) close(fd);
  EXPECT_TRUE(wait_slots_free(port, 10s));
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"cancelled\"}"), 4);
  EXPECT_EQ(metric(port, "baton_streams_open"), 0);
  // The completions and the requests behind them, each counted once.
  EXPECT_EQ(metric(port, "baton_http_responses_total{endpoint=\"completions\",code=\"499\"}") +
                metric(port, "baton_http_responses_total{endpoint=\"completions\",code=\"200\"}"),
            4);
  EXPECT_EQ(metric(port, "baton_http_responses_total{endpoint=\"health\",code=\"499\"}"), 4);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(ServeAttacks, EveryRequestIsCountedAndLoggedOnceWhateverTheClientDoes) {
  ServeProcess server({"-m", stories(), "--ctx", "2048"});
  const int port = server.port();
  // Clients that reset the connection as soon as they have the answer.
  constexpr int kQuick = 200, kLeavers = 8;
  for (int i = 0; i < kQuick; ++i) {
    const int fd = connect_to(port);
    ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
    std::string buf;
    ASSERT_EQ(read_response(fd, buf).status, 200);
    reset_on_close(fd);
    close(fd);
  }
  // Clients that leave in the middle of a generation.
  for (int i = 0; i < kLeavers; ++i) {
    const int fd = connect_to(port);
    ASSERT_TRUE(send_all(fd, keep_alive_post("/v1/completions", long_completion(i % 2).dump())));
    std::this_thread::sleep_for(30ms);
    if (i % 4 == 0) reset_on_close(fd);
    close(fd);
  }
  ASSERT_TRUE(wait_slots_free(port, 10s));
  EXPECT_EQ(responses_counted(port), kQuick + kLeavers);
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"cancelled\"}"), kLeavers);
  EXPECT_EQ(server.stop(), 0);
  const std::string log = server.stderr_text();
  EXPECT_EQ(count_of(log, "baton serve: GET /health "), size_t(kQuick));
  EXPECT_EQ(count_of(log, "baton serve: POST /v1/completions "), size_t(kLeavers));
}

// /proc/PID/status fields in bytes.
uint64_t status_bytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// What one request adds to the server's peak resident memory (the peak is
// reset first: /proc/PID/clear_refs).
int64_t request_peak(const ServeProcess& server, const std::string& body, Response* out) {
  {
    std::ofstream reset("/proc/" + std::to_string(server.pid()) + "/clear_refs");
    reset << "5";
    reset.flush();
    EXPECT_TRUE(reset.good()) << "cannot reset the peak RSS";
  }
  const uint64_t before = status_bytes(server.pid(), "VmRSS");
  *out = http(server.port(), "POST", "/v1/completions", body);
  return int64_t(status_bytes(server.pid(), "VmHWM")) - int64_t(before);
}

TEST(ServeAttacks, JsonThatWouldBuildAHugeTreeIsRefusedWithoutBuildingIt) {
  ServeProcess server({"-m", stories()});
  const std::string head = R"({"model":"stories260K","prompt":"Once","max_tokens":1,"x":)";
  auto nested = [&](size_t depth) { return head + std::string(depth, '[') + std::string(depth, ']') + "}"; };
  // Up to the limit (64 with the body's own object), fields nobody reads are fine.
  EXPECT_EQ(http(server.port(), "POST", "/v1/completions", nested(63)).status, 200);
  expect_error(http(server.port(), "POST", "/v1/completions", nested(64)), 400, "invalid_json");
  Response r = http(server.port(), "POST", "/v1/completions", nested(1000000));
  expect_error(r, 400, "invalid_json");
  EXPECT_NE(r.body.find("deeper than 64"), std::string::npos) << r.body;
  // Bodies up to the size limit cost about the body itself: brackets (tens
  // of bytes of tree per level), and two million zeros (per value).
  const size_t size = (size_t(4) << 20) - 1024;
  std::string zeros = head + "[0";
  while (zeros.size() + 4 < size) zeros += ",0";
  zeros += "]}";
  for (const std::string& body : {std::string(size, '['), zeros}) {
    const int64_t peak = request_peak(server, body, &r);
    expect_error(r, 400, "invalid_json");
    std::printf("[json-memory] %zu bytes starting %s: peak +%.1f MiB\n", body.size(), body.substr(0, 8).c_str(),
                double(peak) / (1 << 20));
    EXPECT_LT(peak, int64_t(3 * body.size() + (size_t(16) << 20))) << body.substr(0, 80);
  }
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(ServeAttacks, OneAddressCannotTakeEveryConnection) {
  ServeProcess server({"-m", stories(), "--max-connections", "8", "--max-connections-per-client", "2"});
  const int port = server.port();
  std::vector<int> held = {connect_from("127.0.0.2", port), connect_from("127.0.0.2", port)};
  const int third = connect_from("127.0.0.2", port);
  ASSERT_GE(third, 0);
  const Response refused = parse_response(read_all(third));
  close(third);
  expect_error(refused, 503, "too_many_connections");
  EXPECT_EQ(refused.headers.at("retry-after"), "1");
  EXPECT_NE(refused.body.find("your address"), std::string::npos) << refused.body;
  EXPECT_EQ(http(port, "GET", "/health").status, 200);  // another address is served
  for (int fd : held) close(fd);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(ServeAttacks, AnApiKeyFileOthersCanReadIsWarnedAbout) {
  test::TempDir dir;
  const std::string file = dir.file("key.txt");
  test::write_file(file, {'s', 'k', '-', '1', '2', '3', '\n'});
  const std::string warning = "API key file " + file + " is accessible by group or others (chmod 600 it)";
  for (mode_t mode : {0644, 0640, 0600}) {
    SCOPED_TRACE(mode);
    ASSERT_EQ(chmod(file.c_str(), mode), 0);
    ServeProcess server({"-m", stories(), "--api-key-file", file});
    EXPECT_EQ(server.stop(), 0);
    const std::string log = server.stderr_text();
    EXPECT_EQ(log.find(warning) != std::string::npos, mode != 0600) << log;
    EXPECT_EQ(log.find("sk-123"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace baton
