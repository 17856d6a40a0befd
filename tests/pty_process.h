// A program on a pseudo-terminal, driven as a user types at it (`baton chat`
// in test_cli_chat and test_cli_serve_chat).
#pragma once

#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace baton::test {

using Clock = std::chrono::steady_clock;

class PtyProcess {
 public:
  explicit PtyProcess(std::vector<std::string> args) {
    winsize ws{};
    ws.ws_row = 40;
    ws.ws_col = 200;
    pid_ = forkpty(&fd_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~PtyProcess() {
    if (pid_ > 0 && exit_code_ < 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  bool started() const { return pid_ > 0; }

  void send(const std::string& s) { ASSERT_EQ(write(fd_, s.data(), s.size()), ssize_t(s.size())); }

  // Reads until `what` appears after offset `from` of the output (carriage
  // returns dropped); its position, or nullopt after the timeout.
  std::optional<size_t> expect(const std::string& what, size_t from, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto end = Clock::now() + timeout;
    for (;;) {
      if (size_t at = out_.find(what, from); at != std::string::npos) return at;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0 || !read_some(int(left))) return std::nullopt;
    }
  }
  // Reads until the output is longer than n bytes.
  bool grow_past(size_t n, std::chrono::seconds timeout) {
    const auto end = Clock::now() + timeout;
    while (out_.size() <= n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0 || !read_some(int(left))) return false;
    }
    return true;
  }
  const std::string& out() const { return out_; }

  // Waits for the exit (the output drained); the status, -1 on a signal or a timeout.
  int wait_exit(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      read_some(100);
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return exit_code_;
      }
    }
    return -1;
  }

 private:
  bool read_some(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\r') out_ += buf[i];
    }
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int exit_code_ = -1;
  std::string out_;
};

// The answer of one turn: the text between the echoed line and the next prompt.
inline std::string pty_turn(PtyProcess& c, const std::string& line) {
  const size_t from = c.out().size();
  c.send(line + "\n");
  const auto echo = c.expect(line + "\n", from);
  EXPECT_TRUE(echo) << c.out();
  if (!echo) return "";
  const size_t begin = *echo + line.size() + 1;
  const auto prompt = c.expect("\n> ", begin);
  EXPECT_TRUE(prompt) << c.out();
  return prompt ? c.out().substr(begin, *prompt - begin) : "";
}

}  // namespace baton::test
