// Stage links end to end on the CPU (docs/PROTOCOL.md, "Link negotiation"):
// CPU workers get TCP links and /health and `baton run --json` say why; a
// worker that claims NCCL but fails to set it up (fault injection) falls
// back to TCP with the same tokens; `--link nccl` refuses a route that
// cannot have it. The NCCL data path itself is tests/test_cuda_nccl.cpp.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::string stories() { return test::model_path("stories260K.gguf"); }

json run_json(std::vector<std::string> extra, int expect_exit = 0, std::string* err = nullptr) {
  std::vector<std::string> argv = {test::baton_binary(), "run", "-m", stories(), "-p", "Once upon a time",
                                   "-n", "40", "--temp", "0", "--json", "-t", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const test::CommandResult r = test::run_command(argv);
  if (err) *err = r.err;
  EXPECT_EQ(r.exit_code, expect_exit) << r.err;
  if (r.exit_code != 0) return json();
  return json::parse(r.out);
}

TEST(ClusterLink, CpuWorkersUseTcpAndSayWhy) {
  const json single = run_json({});
  const json two = run_json({"--workers", "2"});
  ASSERT_TRUE(two.is_object());
  EXPECT_EQ(two.at("tokens"), single.at("tokens"));
  const json& stages = two.at("stages");
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].at("link"), "tcp") << stages.dump();
  EXPECT_NE(stages[0].at("link_reason").get<std::string>().find("runs on the CPU"), std::string::npos)
      << stages.dump();
  EXPECT_TRUE(stages[1].at("link").is_null()) << "the last stage has no link to a next stage";
}

TEST(ClusterLink, FailedNcclSetupFallsBackToTcpWithTheSameTokens) {
  const json single = run_json({});
  ASSERT_TRUE(single.is_object());
  for (const char* mode : {"auto", "nccl"}) {
    SCOPED_TRACE(std::string("--link ") + mode);
    std::string err;
    const json three = run_json({"--workers", "3", "--link", mode, "--worker-fault", "nccl-init"}, 0, &err);
    ASSERT_TRUE(three.is_object()) << err;
    EXPECT_EQ(three.at("tokens"), single.at("tokens"));
    const json& stages = three.at("stages");
    ASSERT_EQ(stages.size(), 3u);
    for (int i : {0, 1}) {
      EXPECT_EQ(stages[i].at("link"), "tcp") << stages.dump();
      EXPECT_NE(stages[i].at("link_reason").get<std::string>().find("injected fault"), std::string::npos)
          << stages.dump();
    }
    EXPECT_NE(err.find("falls back to TCP"), std::string::npos) << err;
  }
}

TEST(ClusterLink, ForcedNcclIsRefusedWhenALinkCannotHaveIt) {
  std::string err;
  run_json({"--workers", "2", "--link", "nccl"}, 1, &err);
  EXPECT_NE(err.find("--link nccl: the link from stage 0 to stage 1 cannot use NCCL: worker-0 runs on the CPU"),
            std::string::npos)
      << err;
  run_json({"--workers", "2", "--link", "fast"}, 1, &err);
  EXPECT_NE(err.find("--link must be auto, tcp or nccl"), std::string::npos) << err;
}

// ---- /health of `baton serve --workers 2` ----

std::string http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == ssize_t(req.size())) {
      char buf[8192];
      for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
    }
  }
  close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

TEST(ClusterLink, HealthReportsEachLinkAndWhy) {
  test::TempDir dir;
  const std::string err_path = dir.file("stderr.txt");
  std::vector<std::string> argv = {test::baton_binary(), "serve", "-m", stories(), "--workers", "3",
                                   "--port", "0", "--threads", "1", "--ctx", "256"};
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out[1], 1);
    dup2(err, 2);
    close(out[0]);
    close(out[1]);
    std::vector<char*> args;
    for (auto& s : argv) args.push_back(s.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  // Read stdout until the port and "ready" lines (bounded).
  int port = 0;
  bool ready = false;
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!ready && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    char buf[1024];
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, size_t(n));
    const std::string listening = "listening on http://127.0.0.1:";
    if (size_t at = text.find(listening); at != std::string::npos && port == 0) {
      port = std::atoi(text.c_str() + at + listening.size());
    }
    ready = text.find("baton serve: ready") != std::string::npos;
  }
  json h;
  if (ready && port > 0) h = json::parse(http_get(port, "/health"), nullptr, false);
  kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200 && waitpid(pid, &status, WNOHANG) != pid; ++i) std::this_thread::sleep_for(50ms);
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  close(out[0]);
  ASSERT_TRUE(ready) << text;
  ASSERT_TRUE(h.is_object()) << "no JSON from /health";
  ASSERT_EQ(h.at("stages").size(), 3u) << h.dump();
  for (int i : {0, 1}) {
    const json& link = h["stages"][i]["link"];
    EXPECT_EQ(link.at("kind"), "tcp") << h.dump();
    EXPECT_NE(link.at("reason").get<std::string>().find("runs on the CPU"), std::string::npos) << h.dump();
  }
  EXPECT_TRUE(h["stages"][2]["link"].is_null()) << h.dump();
}

}  // namespace
}  // namespace baton
