// The HTTP server (coordinator/api/http_server.h) in process, with handlers
// that answer late, never, or from other threads, against clients that
// pipeline, leave early, reset, or hold many sockets from one address:
// answers in order, exchanges that end exactly once (aborted when the client
// goes, one access-log call each), and connection admission that keeps room
// for other clients. The same attacks on `baton serve`: test_cli_serve_attacks.cpp.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "coordinator/api/connection_admission.h"
#include "coordinator/api/http_server.h"
#include "tests/serve_client.h"

namespace baton {
namespace {

using namespace std::chrono_literals;
using namespace serve_test;

struct LogLine {
  std::string path;
  int status;
  bool complete;
};

// An HttpServer on an ephemeral loopback port that records its access log.
class LoggedServer {
 public:
  LoggedServer(HttpServerConfig cfg, HttpHandler handler) {
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    HttpServerHooks hooks;
    hooks.access_log = [this](const HttpRequest& req, int status, uint64_t, double, bool complete) {
      std::lock_guard lock(mu_);
      log_.push_back({req.path, status, complete});
      cv_.notify_all();
    };
    server_ = std::make_unique<HttpServer>(cfg, std::move(handler), hooks);
    server_->start();
  }
  int port() const { return server_->port(); }
  HttpServer& server() { return *server_; }
  // The log once it holds n lines (or after the timeout: generous, since a
  // loaded machine under the sanitizers can take seconds to log 300 requests).
  std::vector<LogLine> wait_log(size_t n, std::chrono::milliseconds timeout = 30s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return log_.size() >= n; });
    return log_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<LogLine> log_;
  std::unique_ptr<HttpServer> server_;
};

// Runs work on threads of its own, joined on destruction: declared after the
// server, so that the handlers' threads end before it is destroyed.
class Later {
 public:
  ~Later() {
    for (auto& t : threads_) t.join();
  }
  void run(std::function<void()> f) {
    std::lock_guard lock(mu_);
    threads_.emplace_back(std::move(f));
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

std::string get(const std::string& path, bool keep_alive = true) {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + (keep_alive ? "" : "Connection: close\r\n") + "\r\n";
}

void reset_on_close(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

TEST(HttpServerPipelining, RequestsSentTogetherAreAnsweredInOrder) {
  std::unique_ptr<Later> later = std::make_unique<Later>();
  LoggedServer s({}, [&](std::shared_ptr<HttpExchange> ex) {
    // Answered late, from another thread: nothing is pending on the
    // connection meanwhile but the requests behind this one.
    later->run([ex] {
      std::this_thread::sleep_for(20ms);
      ex->respond(200, "text/plain", ex->request().path);
    });
  });
  for (int round = 0; round < 10; ++round) {
    int fd = connect_to(s.port());
    ASSERT_TRUE(send_all(fd, get("/a") + get("/b") + get("/c", false)));
    std::string buf;
    for (const char* want : {"/a", "/b", "/c"}) {
      const Response r = read_response(fd, buf);
      EXPECT_EQ(r.status, 200) << "round " << round << ", " << want;
      EXPECT_EQ(r.body, want) << "round " << round;
    }
    EXPECT_EQ(read_all(fd), "");  // then closed, as the last request asked
    close(fd);
  }
  EXPECT_EQ(s.wait_log(30).size(), 30u);
  later.reset();
}

TEST(HttpServerPipelining, AClientThatLeavesAbortsTheExchangeAndEveryRequestIsLogged) {
  std::mutex mu;
  std::vector<std::shared_ptr<HttpExchange>> held;
  std::atomic<int> aborted{0};
  LoggedServer s({}, [&](std::shared_ptr<HttpExchange> ex) {
    // Never answered: a generation that would run to max_tokens.
    ex->on_abort([&] { aborted.fetch_add(1); });
    std::lock_guard lock(mu);
    held.push_back(ex);
  });
  int fd = connect_to(s.port());
  ASSERT_TRUE(send_all(fd, get("/long") + get("/next")));
  for (int i = 0; i < 200; ++i) {
    std::lock_guard lock(mu);
    if (!held.empty()) break;
    std::this_thread::sleep_for(5ms);
  }
  close(fd);
  for (int i = 0; i < 400 && aborted.load() == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(aborted.load(), 1);
  const auto log = s.wait_log(2);
  ASSERT_EQ(log.size(), 2u);
  for (const LogLine& l : log) {
    EXPECT_EQ(l.status, kStatusClientGone) << l.path;
    EXPECT_FALSE(l.complete) << l.path;
  }
  std::lock_guard lock(mu);
  EXPECT_EQ(held.size(), 1u);  // the request behind was never handled
  held.clear();
}

TEST(HttpServerExchange, AnExchangeLetGoWithoutAnAnswerGets500OrACutStream) {
  LoggedServer s({}, [](std::shared_ptr<HttpExchange> ex) {
    if (ex->request().path == "/stream") {
      ex->begin_stream(200, "text/event-stream");
      ex->write("data: 1\n\n");
    }
    // ... and the handler lets go of it.
  });
  Response r = http(s.port(), "GET", "/plain");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("dropped"), std::string::npos) << r.body;
  Response st = http(s.port(), "GET", "/stream");
  EXPECT_EQ(st.status, 200);
  EXPECT_TRUE(st.chunked);
  EXPECT_FALSE(st.complete);  // never made to look finished
  const auto log = s.wait_log(2);
  ASSERT_EQ(log.size(), 2u);
}

TEST(HttpServerAccessLog, EveryRequestIsLoggedOnceWhateverTheClientDoes) {
  std::unique_ptr<Later> later = std::make_unique<Later>();
  LoggedServer s({}, [&](std::shared_ptr<HttpExchange> ex) {
    const std::string& path = ex->request().path;
    if (path.rfind("/slow/", 0) == 0) {
      later->run([ex] {
        std::this_thread::sleep_for(100ms);
        ex->respond(200, "text/plain", "late");
      });
    } else if (path == "/big") {
      ex->respond(200, "application/octet-stream", std::string(size_t(32) << 20, 'x'));
    } else {
      ex->respond(200, "text/plain", path);
    }
  });
  // Sequential clients that reset the connection as soon as they have the
  // answer: the reset can be seen before the write's completion.
  constexpr int kQuick = 300, kLeavers = 20;
  for (int i = 0; i < kQuick; ++i) {
    int fd = connect_to(s.port());
    send_all(fd, get("/q/" + std::to_string(i)));
    std::string buf;
    ASSERT_EQ(read_response(fd, buf).status, 200);
    reset_on_close(fd);
    close(fd);
  }
  // Clients that leave before the answer.
  for (int i = 0; i < kLeavers; ++i) {
    int fd = connect_to(s.port());
    send_all(fd, get("/slow/" + std::to_string(i)));
    std::this_thread::sleep_for(5ms);
    reset_on_close(fd);
    close(fd);
  }
  // A client that resets in the middle of a large answer.
  {
    int fd = connect_to(s.port());
    send_all(fd, get("/big"));
    char b[65536];
    size_t got = 0;
    while (got < (size_t(1) << 20)) {
      const ssize_t n = recv(fd, b, sizeof b, 0);
      ASSERT_GT(n, 0);
      got += size_t(n);
    }
    reset_on_close(fd);
    close(fd);
  }
  const auto log = s.wait_log(kQuick + kLeavers + 1);
  std::this_thread::sleep_for(200ms);  // a second line for any request would show now
  const auto final_log = s.wait_log(0, 0ms);
  ASSERT_EQ(final_log.size(), size_t(kQuick + kLeavers + 1));
  std::map<std::string, int> seen;
  for (const LogLine& l : final_log) {
    ++seen[l.path];
    if (l.path.rfind("/q/", 0) == 0) {
      EXPECT_EQ(l.status, 200);
    } else if (l.path.rfind("/slow/", 0) == 0) {
      EXPECT_EQ(l.status, kStatusClientGone) << l.path;
      EXPECT_FALSE(l.complete);
    } else {
      EXPECT_EQ(l.path, "/big");
      EXPECT_EQ(l.status, 200);
      EXPECT_FALSE(l.complete);
    }
  }
  for (const auto& [path, n] : seen) EXPECT_EQ(n, 1) << path;
  later.reset();
}

TEST(ConnectionAdmission, CapsPerAddressAndKeepsAReserveForLightClients) {
  ConnectionAdmission a(16, 0);
  EXPECT_EQ(a.max_per_client(), 8);
  EXPECT_EQ(a.reserve(), 4);
  using V = ConnectionAdmission::Verdict;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.try_admit("hog"), V::admit);
  EXPECT_EQ(a.try_admit("hog"), V::client_full);
  // A second heavy address reaches the reserve at 12 connections in all.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.try_admit("hog2"), V::admit);
  EXPECT_EQ(a.total(), 12);
  EXPECT_EQ(a.try_admit("hog2"), V::client_full);
  // Light clients still get in, up to the total.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.try_admit("light"), V::admit);
  EXPECT_EQ(a.try_admit("new"), V::admit);
  EXPECT_EQ(a.try_admit("another"), V::server_full);
  a.release("hog");
  EXPECT_EQ(a.try_admit("another"), V::admit);
  EXPECT_EQ(a.of("hog"), 7);
  for (int i = 0; i < 7; ++i) a.release("hog");
  EXPECT_EQ(a.of("hog"), 0);
  EXPECT_EQ(a.total(), 9);
}

// Sockets from `source` that the server took (still open, nothing to read)
// and those it refused: each refusal must be a 503 with Retry-After, never a
// reset or a silent close.
struct Opened {
  std::vector<int> held;
  int refused = 0;
  std::string bad;  // the first answer that was not a proper 503
};

std::vector<int> open_from(const std::string& source, int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = connect_from(source, port, 5s);
    if (fd >= 0) fds.push_back(fd);
  }
  return fds;
}

Opened classify(const std::vector<int>& fds) {
  // Refusals come at once; give the server a moment to look at each.
  std::this_thread::sleep_for(300ms);
  Opened out;
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) == 0) {
      out.held.push_back(fd);
      continue;
    }
    std::string buf;
    const Response r = read_response(fd, buf);
    close(fd);
    ++out.refused;
    if ((r.status != 503 || r.headers.count("retry-after") == 0 || !r.complete) && out.bad.empty()) {
      out.bad = buf.empty() && r.status == 0 ? "<reset or closed without an answer>" : "status " + std::to_string(r.status);
    }
  }
  return out;
}

Opened open_many(const std::string& source, int port, int n) { return classify(open_from(source, port, n)); }

int successes(int port, const std::string& source, int n) {
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    const int fd = connect_from(source, port, 5s);
    if (fd < 0) continue;
    send_all(fd, get("/health", false));
    ok += parse_response(read_all(fd)).status == 200;
    close(fd);
  }
  return ok;
}

TEST(HttpServerAdmission, OneAddressHoldingSocketsLeavesRoomForOthersAndRefusalsAre503) {
  HttpServerConfig cfg;
  cfg.max_connections = 16;  // 8 per address, the last 4 for light clients
  LoggedServer s(cfg, [](std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "ok"); });
  const int port = s.port();
  Opened hog = open_many("127.0.0.2", port, 30);
  EXPECT_EQ(hog.held.size(), 8u);
  EXPECT_EQ(hog.refused, 22);
  EXPECT_EQ(hog.bad, "");
  EXPECT_EQ(successes(port, "127.0.0.1", 20), 20);
  // A second heavy address stops at the reserve; light clients still get in.
  Opened hog2 = open_many("127.0.0.3", port, 10);
  EXPECT_EQ(hog2.held.size(), 4u);
  EXPECT_EQ(hog2.bad, "");
  EXPECT_EQ(s.server().connections(), 12);
  EXPECT_EQ(successes(port, "127.0.0.1", 20), 20);
  // The light clients' last closes are noticed asynchronously: the flood
  // starts once only the two hogs' 12 are held, so that it meets 4 free rooms.
  for (int i = 0; i < 500 && s.server().connections() != 12; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(s.server().connections(), 12);
  // Past every limit, many times over: still an answer each, never a reset.
  // All open at once, so that the refusals outnumber the sessions kept for them.
  std::vector<int> fds;
  for (int a = 4; a < 14; ++a) {
    auto more = open_from("127.0.0." + std::to_string(a), port, 12);
    fds.insert(fds.end(), more.begin(), more.end());
  }
  Opened flood = classify(fds);
  EXPECT_EQ(flood.held.size(), 4u);  // the reserve filled up: 16 in all
  EXPECT_EQ(flood.refused, 116);
  EXPECT_EQ(flood.bad, "");
  EXPECT_EQ(s.server().connections(), 16);
  for (const Opened* o : {&hog, &hog2, &flood}) {
    for (int fd : o->held) close(fd);
  }
  // Served again once they are gone (closes are noticed asynchronously).
  int ok = 0;
  for (int i = 0; i < 100 && ok == 0; ++i) {
    ok = successes(port, "127.0.0.1", 1);
    if (!ok) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(ok, 1);
}

}  // namespace
}  // namespace baton
