// Security checks on the built binaries, with hostile but cheap clients on
// loopback: the HTTP server's limits the serving tests do not already cover
// (the connection limit, a chunked body over the limit, a header block of many
// small fields, the keep-alive idle deadline), secrets that never reach logs,
// /health or /metrics, and a worker that refuses a coordinator without the
// shared secret. (Oversized Content-Length, a single huge header, slow-loris
// 408 and silent connections: test_cli_serve.cpp. Handshake rules in
// depth: test_net_link.cpp.)
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/executor_work_guard.hpp>

#include "net/auth.h"
#include "net/connection.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string stories() { return test::model_path("stories260K.gguf"); }

std::string file_text(const std::string& path) {
  try {
    auto b = test::read_file(path);
    return std::string(b.begin(), b.end());
  } catch (...) {
    return "";
  }
}

// A child process with stdout on a pipe and stderr in a file.
class Process {
 public:
  explicit Process(const std::vector<std::string>& argv) {
    err_path_ = dir_.file("stderr.txt");
    const test::Spawned child = test::spawn_piped(argv, err_path_);
    pid_ = child.pid;
    out_fd_ = child.stdout_fd;
  }
  ~Process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_fd_);
  }
  // The next stdout line that starts with `prefix`, or "" after the timeout.
  std::string wait_line(const std::string& prefix, std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      for (size_t nl; (nl = buf_.find('\n')) != std::string::npos;) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (line.rfind(prefix, 0) == 0) return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{out_fd_, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, int(left)) <= 0) return "";
      char b[4096];
      const ssize_t n = read(out_fd_, b, sizeof b);
      if (n <= 0) return "";
      buf_.append(b, size_t(n));
    }
  }
  // SIGTERM (unless it already ended) and the exit status; -1 for a signal
  // or a process that had to be killed.
  int finish(std::chrono::seconds timeout, bool terminate = true) {
    if (pid_ <= 0) return code_;
    if (terminate) kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + timeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) != pid_) {
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return code_ = -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    pid_ = -1;
    return code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string stderr_text() const { return file_text(err_path_); }

 private:
  test::TempDir dir_;
  std::string err_path_, buf_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int code_ = -1;
};

// `baton serve` of stories260K on an ephemeral port, ready to answer.
struct Server {
  explicit Server(std::vector<std::string> extra) : proc(argv(std::move(extra))) {
    const std::string prefix = "baton serve: listening on http://127.0.0.1:";
    const std::string line = proc.wait_line(prefix, 60s);
    if (line.empty()) throw std::runtime_error("baton serve did not start: " + proc.stderr_text());
    port = std::stoi(line.substr(prefix.size()));
    if (proc.wait_line("baton serve: ready", 60s).empty()) {
      throw std::runtime_error("baton serve did not get ready: " + proc.stderr_text());
    }
  }
  static std::vector<std::string> argv(std::vector<std::string> extra) {
    std::vector<std::string> a = {test::baton_binary(), "serve", "-m", stories(), "--host", "127.0.0.1",
                                  "--port", "0", "--threads", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  Process proc;
  int port = 0;
};

int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("connect failed");
  }
  timeval tv{20, 0};  // no test waits this long for a byte: a hang fails instead of blocking
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& data) {
  for (size_t at = 0; at < data.size();) {
    const ssize_t n = send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early; the reply says why
    at += size_t(n);
  }
}

// Everything until the server closes (or the receive timeout).
std::string read_all(int fd) {
  std::string out;
  char buf[16384];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
  return out;
}

// One response on a kept-alive connection: its head and a Content-Length body.
std::string read_response(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const size_t head = out.find("\r\n\r\n");
    if (head != std::string::npos) {
      const size_t cl = out.find("Content-Length: ");
      const size_t len = cl == std::string::npos ? 0 : std::stoul(out.substr(cl + 16));
      if (out.size() >= head + 4 + len) return out;
    }
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, size_t(n));
  }
}

int status_of(const std::string& response) {
  return response.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(response.substr(9, 3)) : 0;
}

std::string body_of(const std::string& response) {
  const size_t head = response.find("\r\n\r\n");
  return head == std::string::npos ? "" : response.substr(head + 4);
}

std::string get(int port, const std::string& path, const std::string& extra_headers = "") {
  int fd = connect_to(port);
  send_all(fd, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra_headers + "\r\n");
  std::string r = read_all(fd);
  close(fd);
  return r;
}

std::string post(int port, const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  int fd = connect_to(port);
  send_all(fd, "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" +
                   extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string r = read_all(fd);
  close(fd);
  return r;
}

TEST(SecurityHttp, ConnectionsBeyondTheLimitGet503AndTheServerRecovers) {
  Server s({"--max-connections", "4", "--max-connections-per-client", "4"});
  // Four kept-alive connections, each proven accepted by one answered request.
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(connect_to(s.port));
    send_all(held.back(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_EQ(status_of(read_response(held.back())), 200) << i;
  }
  // The fifth is answered 503 with Retry-After, then closed.
  const std::string refused = get(s.port, "/health");
  EXPECT_EQ(status_of(refused), 503) << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  EXPECT_NE(refused.find("Connection: close"), std::string::npos) << refused;
  // A held connection still works.
  send_all(held[0], "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(read_response(held[0])), 200);
  for (int fd : held) close(fd);
  // Once they are gone, new clients are served again (the server notices the
  // closes asynchronously: retry briefly).
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    status = status_of(get(s.port, "/health"));
    if (status != 200) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(status, 200);
  EXPECT_EQ(s.proc.finish(30s), 0) << s.proc.stderr_text();
}

TEST(SecurityHttp, ChunkedBodyOverTheLimitAndManySmallHeadersAreRefused) {
  Server s({"--max-body", "4096"});
  // No Content-Length: the limit holds while the chunks stream in.
  {
    int fd = connect_to(s.port);
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 8; ++i) req += "400\r\n" + std::string(1024, 'a') + "\r\n";
    req += "0\r\n\r\n";
    send_all(fd, req);
    const std::string r = read_all(fd);
    EXPECT_EQ(status_of(r), 413) << r;
    EXPECT_NE(body_of(r).find("\"error\""), std::string::npos) << r;
    close(fd);
  }
  // 16 KiB of header block in 400 short fields.
  {
    std::string headers;
    for (int i = 0; i < 400; ++i) headers += "X-F" + std::to_string(i) + ": " + std::string(40, 'v') + "\r\n";
    const std::string r = get(s.port, "/health", headers);
    EXPECT_EQ(status_of(r), 431) << r;
  }
  EXPECT_EQ(status_of(get(s.port, "/health")), 200);
  EXPECT_EQ(s.proc.finish(30s), 0) << s.proc.stderr_text();
}

TEST(SecurityHttp, IdleKeepAliveConnectionsAreClosedAfterTheIdleDeadline) {
  Server s({"--idle-timeout", "1"});
  int fd = connect_to(s.port);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(status_of(read_response(fd)), 200);
  // Silence after the answer: the server closes (recv returns 0) well before
  // the client's own 20 s receive timeout.
  const auto t0 = Clock::now();
  char c;
  EXPECT_EQ(recv(fd, &c, 1, 0), 0);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 15.0);
  close(fd);
  EXPECT_EQ(s.proc.finish(30s), 0) << s.proc.stderr_text();
}

TEST(SecuritySecrets, ApiKeyNeverAppearsInLogsHealthOrMetrics) {
  test::TempDir dir;
  const std::string key = "sk-security-7d41c0ffee93";
  test::write_file(dir.file("key"), std::vector<uint8_t>(key.begin(), key.end()));
  Server s({"--api-key-file", dir.file("key")});
  const std::string body = R"({"model":"stories260K","prompt":"Once","max_tokens":2,"temperature":0})";
  // Good and bad keys (as a Bearer token or Anthropic's x-api-key), the key
  // where it does not belong (the URL, a wrong scheme), and requests that
  // fail for other reasons.
  EXPECT_EQ(status_of(post(s.port, "/v1/completions", body, "Authorization: Bearer " + key + "\r\n")), 200);
  EXPECT_EQ(status_of(post(s.port, "/v1/completions", body, "Authorization: Bearer " + key + "0\r\n")), 401);
  EXPECT_EQ(status_of(post(s.port, "/v1/completions", body, "Authorization: Basic " + key + "\r\n")), 401);
  EXPECT_EQ(status_of(post(s.port, "/v1/completions", body, "X-Api-Key: " + key + "\r\n")), 200);
  EXPECT_EQ(status_of(post(s.port, "/v1/completions", body, "X-Api-Key: " + key + "0\r\n")), 401);
  EXPECT_EQ(status_of(get(s.port, "/v1/models?key=" + key)), 401);
  EXPECT_EQ(status_of(post(s.port, "/v1/completions", "{bad", "Authorization: Bearer " + key + "\r\n")), 400);
  EXPECT_EQ(status_of(get(s.port, "/nowhere", "Authorization: Bearer " + key + "\r\n")), 404);
  const std::string health = get(s.port, "/health"), metrics = get(s.port, "/metrics");
  EXPECT_EQ(status_of(health), 200);
  EXPECT_EQ(status_of(metrics), 200);
  EXPECT_EQ(health.find(key), std::string::npos) << health;
  EXPECT_EQ(metrics.find(key), std::string::npos);
  // The file path may be logged; its content never.
  EXPECT_EQ(s.proc.finish(30s), 0);
  const std::string log = s.proc.stderr_text();
  EXPECT_FALSE(log.empty());  // access lines were written, so the check below means something
  EXPECT_EQ(log.find(key), std::string::npos) << log;
  EXPECT_EQ(log.find("7d41c0ffee93"), std::string::npos) << log;
}

// A coordinator-side listener holding secret A, running on its own thread.
struct Coordinator {
  explicit Coordinator(net::Secret secret)
      : work(boost::asio::make_work_guard(io)),
        listener(io, "127.0.0.1", 0, net::LocalIdentity{net::Role::coordinator, "coordinator"}, std::move(secret),
                 net::LinkConfig{}, [this](std::shared_ptr<net::Connection> c) {
                   std::lock_guard lock(mu);
                   accepted.push_back(std::move(c));
                 },
                 [this](std::error_code, const std::string& reason) {
                   std::lock_guard lock(mu);
                   rejected.push_back(reason);
                 }),
        thread([this] { io.run(); }) {}
  ~Coordinator() {
    {
      std::lock_guard lock(mu);
      accepted.clear();
    }
    work.reset();
    io.stop();
    thread.join();
  }
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work;
  std::mutex mu;
  std::vector<std::shared_ptr<net::Connection>> accepted;
  std::vector<std::string> rejected;
  net::Listener listener;
  std::thread thread;
};

TEST(SecurityWorker, RefusesACoordinatorWithAnotherSecretAndLogsNeither) {
  test::TempDir dir;
  const std::string mine = "worker-secret-5be1a9d07c3e44f2", theirs = "coordinator-secret-e0c8b7a6f5d4";
  const std::string file = dir.file("worker.secret");
  test::write_file(file, std::vector<uint8_t>(mine.begin(), mine.end()));
  chmod(file.c_str(), 0600);
  Coordinator coord(net::Secret(std::vector<uint8_t>(theirs.begin(), theirs.end())));

  Process worker({test::baton_binary(), "worker", "--coordinator",
                  "127.0.0.1:" + std::to_string(coord.listener.port()), "--secret-file", file, "--listen",
                  "127.0.0.1:0"});
  const int code = worker.finish(30s, /*terminate=*/false);
  const std::string log = worker.stderr_text();
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(code, -1) << "the worker hung or crashed: " << log;
  EXPECT_NE(log.find("coordinator"), std::string::npos) << log;
  EXPECT_EQ(log.find(mine), std::string::npos) << log;
  EXPECT_EQ(log.find(theirs), std::string::npos) << log;
  std::lock_guard lock(coord.mu);
  EXPECT_TRUE(coord.accepted.empty());
  EXPECT_FALSE(coord.rejected.empty());
}

}  // namespace
}  // namespace baton
