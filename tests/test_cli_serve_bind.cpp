// `baton serve` binds its port before it touches the model, and takes host
// names and IPv6 addresses for --host (net/address.h resolves them). The
// early failures use a model path that does not exist: an error naming the
// port or the host, not the file, shows the bind came first.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

struct Finished {
  int exit_code = -1;  // -1: still running after the deadline (then killed)
  double seconds = 0;
  std::string err;
};

// Runs `baton serve ARGS` and waits at most `deadline` for it to exit.
Finished serve_until_exit(const std::vector<std::string>& args, std::chrono::seconds deadline) {
  test::TempDir dir;
  std::vector<std::string> argv = {test::baton_binary(), "serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto t0 = std::chrono::steady_clock::now();
  const test::Spawned child = test::spawn_piped(argv, dir.file("err"));
  close(child.stdout_fd);
  Finished f;
  for (;;) {
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) {
      f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    if (std::chrono::steady_clock::now() - t0 > deadline) {
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto bytes = test::read_file(dir.file("err"));
  f.err.assign(bytes.begin(), bytes.end());
  return f;
}

int count_lines_with(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t p = text.find(part); p != std::string::npos; p = text.find(part, p + 1)) ++n;
  return n;
}

TEST(ServeBind, BusyPortIsReportedBeforeTheModelIsOpened) {
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(held, 1), 0);
  socklen_t len = sizeof a;
  getsockname(held, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  const Finished f = serve_until_exit({"-m", "/nonexistent/model.gguf", "--backend", "cpu", "--host", "127.0.0.1",
                                       "--port", port},
                                      20s);
  close(held);
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_EQ(count_lines_with(f.err, "baton serve: cannot listen on 127.0.0.1:" + port + ": "), 1) << f.err;
  EXPECT_EQ(f.err.find("model.gguf"), std::string::npos) << "the model was opened first:\n" << f.err;
  EXPECT_LT(f.seconds, 10.0);
}

TEST(ServeBind, HostThatDoesNotResolveIsOneLineAtOnce) {
  const Finished f =
      serve_until_exit({"-m", "/nonexistent/model.gguf", "--backend", "cpu", "--host", "no-such-host.invalid",
                        "--port", "0"},
                       20s);
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_EQ(count_lines_with(f.err, "cannot resolve host 'no-such-host.invalid'"), 1) << f.err;
  EXPECT_EQ(f.err.find("model.gguf"), std::string::npos) << f.err;
  // The error is the last line, and a single one.
  ASSERT_FALSE(f.err.empty());
  const std::string last = f.err.substr(f.err.rfind('\n', f.err.size() - 2) + 1);
  EXPECT_NE(last.find("cannot resolve host"), std::string::npos) << f.err;
}

// A worker's --coordinator or --listen host that does not resolve: exit 1
// with one line naming the option's address, before any link is tried.
TEST(ServeBind, WorkerHostsThatDoNotResolveAreOneLine) {
  test::TempDir dir;
  const std::string secret = dir.file("secret");
  const std::string key(64, 'a');
  test::write_file(secret, std::vector<uint8_t>(key.begin(), key.end()));
  chmod(secret.c_str(), 0600);
  struct Case {
    std::string coordinator, listen, want;
  };
  for (const Case& c : {Case{"no-such-host.invalid:7070", "127.0.0.1:0",
                             "baton worker: cannot connect to the coordinator at no-such-host.invalid:7070: "
                             "cannot resolve host 'no-such-host.invalid': "},
                        Case{"127.0.0.1:9", "no-such-host.invalid:0",
                             "baton worker: cannot listen on no-such-host.invalid:0: cannot resolve host "
                             "'no-such-host.invalid': "}}) {
    const test::CommandResult r =
        test::run_command({test::baton_binary(), "worker", "--coordinator", c.coordinator, "--listen", c.listen,
                           "--secret-file", secret, "--backend", "cpu"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind(c.want, 0), 0u) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  }
}

// This machine's first IPv4 address that is not loopback; "" when none.
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &a->sin_addr, text, sizeof text)) found = text;
  }
  freeifaddrs(list);
  return found;
}

// A worker whose --listen name resolves to loopback while its coordinator is
// on a real address says that no other machine can dial it.
TEST(ServeBind, WorkerListeningOnLoopbackForARemoteCoordinatorWarns) {
  const std::string ip = non_loopback_ipv4();
  if (ip.empty()) GTEST_SKIP() << "this machine has no IPv4 address besides loopback";
  test::TempDir dir;
  const std::string secret = dir.file("secret");
  const std::string key(64, 'a');
  test::write_file(secret, std::vector<uint8_t>(key.begin(), key.end()));
  chmod(secret.c_str(), 0600);
  auto run = [&](const std::string& coordinator, const std::string& listen) {
    // Nothing listens on port 9 (discard): the worker fails to register
    // right after the check, exit 1 (it would wait for the coordinator
    // without --exit-with-coordinator).
    return test::run_command({test::baton_binary(), "worker", "--coordinator", coordinator, "--listen", listen,
                              "--secret-file", secret, "--backend", "cpu", "--name", "w", "--exit-with-coordinator"});
  };
  const std::string warning = "a stage on another machine cannot reach this one";
  auto r = run(ip + ":9", "localhost:0");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("w: --listen localhost:0 is the loopback address 127.0.0.1 while the coordinator is at " + ip +
                       ":9: " + warning),
            std::string::npos)
      << r.err;
  r = run(ip + ":9", ip + ":0");
  EXPECT_EQ(r.err.find(warning), std::string::npos) << r.err;
  r = run("127.0.0.1:9", "localhost:0");
  EXPECT_EQ(r.err.find(warning), std::string::npos) << "both on this machine: " << r.err;
}

// GET /health over a socket of `family` to `addr`:port; the whole response.
std::string health_response(int family, const std::string& addr, int port) {
  const int s = socket(family, SOCK_STREAM, 0);
  if (s < 0) return "socket failed";
  int rc = -1;
  if (family == AF_INET6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(uint16_t(port));
    inet_pton(AF_INET6, addr.c_str(), &a.sin6_addr);
    rc = connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
    rc = connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0) {
    close(s);
    return "connect failed";
  }
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)!write(s, req.data(), req.size());
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(s, buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
  close(s);
  return got;
}

std::string health_status_line(int family, const std::string& addr, int port) {
  const std::string r = health_response(family, addr, port);
  return r.substr(0, r.find("\r\n"));
}

// Reads `fd` until the text holds `part` or `deadline` passes; the text.
std::string read_until(int fd, const std::string& part, std::chrono::seconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::string out;
  char buf[256];
  while (out.find(part) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, int(left.count())) <= 0) break;
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

TEST(ServeBind, HostNamesAndIpv6Serve) {
  const std::string model = test::model_path("stories260K.gguf");
  struct Case {
    std::string host, url_host, connect_addr;
    int family;
  };
  for (const Case& c : {Case{"localhost", "localhost", "127.0.0.1", AF_INET}, Case{"::1", "[::1]", "::1", AF_INET6},
                        Case{"[::1]", "[::1]", "::1", AF_INET6}}) {
    SCOPED_TRACE(c.host);
    test::TempDir dir;
    const test::Spawned child = test::spawn_piped(
        {test::baton_binary(), "serve", "-m", model, "--backend", "cpu", "--threads", "1", "--host", c.host, "--port",
         "0"},
        dir.file("err"));
    const std::string out = read_until(child.stdout_fd, "baton serve: ready", 60s);
    const std::string prefix = "baton serve: listening on http://" + c.url_host + ":";
    const size_t at = out.find(prefix);
    const int port = at == std::string::npos ? 0 : std::stoi(out.substr(at + prefix.size()));
    EXPECT_GT(port, 0) << out;
    if (port > 0) {
      EXPECT_EQ(health_status_line(c.family, c.connect_addr, port), "HTTP/1.1 200 OK");
    }
    kill(child.pid, SIGTERM);
    int status = 0;
    waitpid(child.pid, &status, 0);
    close(child.stdout_fd);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

// Polls `path` until it holds `part`; the text, or "" after the deadline.
std::string wait_for_text(const std::string& path, const std::string& part, std::chrono::seconds deadline) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < deadline) {
    std::string text;
    try {
      const auto b = test::read_file(path);
      text.assign(b.begin(), b.end());
    } catch (...) {
    }
    if (text.find(part) != std::string::npos) return text;
    std::this_thread::sleep_for(50ms);
  }
  return "";
}

// Every address option takes names and bracketed IPv6: a remote cluster
// listening on "localhost:0", workers dialing it by name, one listening on
// localhost and one on [::1], the previous stage dialing what it advertised.
TEST(ServeBind, RemoteWorkersRegisterAndLinkByHostName) {
  test::TempDir dir;
  const std::string model = test::model_path("stories260K.gguf");
  const std::string secret = dir.file("secret");
  const std::string key(64, 'a');
  test::write_file(secret, std::vector<uint8_t>(key.begin(), key.end()));
  chmod(secret.c_str(), 0600);
  const std::string cfg = dir.file("remote.toml");
  const std::string text = "[model]\npath = \"" + model + "\"\n[cluster]\nworkers = 2\nlocal = false\n" +
                           "listen = \"localhost:0\"\nsecret_file = \"" + secret + "\"\n";
  test::write_file(cfg, std::vector<uint8_t>(text.begin(), text.end()));
  const test::Spawned serve = test::spawn_piped(
      {test::baton_binary(), "serve", "--config", cfg, "--host", "localhost", "--port", "0", "--threads", "1"},
      dir.file("serve.err"));
  std::vector<test::Spawned> workers;
  auto stop_all = [&] {
    kill(serve.pid, SIGTERM);
    int status = 0;
    waitpid(serve.pid, &status, 0);
    close(serve.stdout_fd);
    for (const test::Spawned& w : workers) {
      kill(w.pid, SIGTERM);
      waitpid(w.pid, &status, 0);
      close(w.stdout_fd);
    }
  };
  const std::string waiting = "waiting for 2 workers on localhost:";
  const std::string err = wait_for_text(dir.file("serve.err"), waiting, 30s);
  if (err.empty()) {
    stop_all();
    FAIL() << "the coordinator did not listen";
  }
  const int port = std::stoi(err.substr(err.find(waiting) + waiting.size()));
  for (const char* listen : {"[::1]:0", "localhost:0"}) {
    // Stages follow the names: the [::1] worker is stage 1, which stage 0
    // dials at the "[::1]:PORT" it advertised.
    const std::string name = std::string("w-") + (listen[0] == '[' ? "b" : "a");
    workers.push_back(test::spawn_piped({test::baton_binary(), "worker", "--coordinator",
                                         "localhost:" + std::to_string(port), "--listen", listen, "--secret-file",
                                         secret, "--model", model, "--name", name, "--backend", "cpu"},
                                        dir.file(name + ".err")));
  }
  const std::string out = read_until(serve.stdout_fd, "baton serve: ready", 60s);
  const std::string prefix = "listening on http://localhost:";
  const size_t at = out.find(prefix);
  const int http_port = at == std::string::npos ? 0 : std::stoi(out.substr(at + prefix.size()));
  EXPECT_NE(out.find("baton serve: ready"), std::string::npos) << out << wait_for_text(dir.file("serve.err"), "", 1s);
  std::string health;
  if (http_port > 0) health = health_response(AF_INET, "127.0.0.1", http_port);
  stop_all();
  // Ready means both stages loaded and stage 0 linked to stage 1.
  EXPECT_EQ(health.rfind("HTTP/1.1 200 OK", 0), 0u) << health;
  EXPECT_NE(health.find("\"state\":\"loaded\""), std::string::npos) << health;
}

}  // namespace
}  // namespace baton
