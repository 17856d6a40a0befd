// `baton serve` binds its port before it touches the model, and takes host
// names and IPv6 addresses for --host (net/address.h resolves them). The
// early failures use a model path that does not exist: an error naming the
// port or the host, not the file, shows the bind came first.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
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

// GET /health over a socket of `family` to `addr`:port; the status line.
std::string health_status_line(int family, const std::string& addr, int port) {
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
  return got.substr(0, got.find("\r\n"));
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
    std::string out;
    char ch;
    while (out.find("baton serve: ready") == std::string::npos && read(child.stdout_fd, &ch, 1) == 1) out += ch;
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

}  // namespace
}  // namespace baton
