#include "coordinator/commands/bench_serve_child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace baton::bench_serve {

namespace {

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error(std::string("cannot find the baton binary: ") + std::strerror(errno));
  return std::string(buf, size_t(n));
}

}  // namespace

ServeChild::ServeChild(const std::vector<std::string>& args, const std::string& log_path,
                       std::chrono::seconds timeout)
    : log_path_(log_path) {
  const std::string exe = self_exe();
  std::vector<std::string> argv_s = {"baton", "serve", "--host", "127.0.0.1", "--port", "0"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) {
    throw std::runtime_error(fmt::format("cannot write the server log {}: {}", log_path, std::strerror(errno)));
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    ::close(log_fd);
    throw std::runtime_error(std::string("pipe failed: ") + std::strerror(errno));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec: this process may have threads.
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(out[1], 1) < 0 || dup2(log_fd, 2) < 0) _exit(127);
    // The server goes when the benchmark goes, even by SIGKILL.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  const int fork_errno = errno;
  ::close(log_fd);
  ::close(out[1]);
  if (pid < 0) {
    ::close(out[0]);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(fork_errno));
  }
  pid_ = pid;
  out_fd_ = out[0];

  // "baton serve: listening on http://127.0.0.1:PORT" on stdout.
  const std::string listening = "baton serve: listening on http://127.0.0.1:";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string text;
  while (port_ == 0) {
    if (exited()) {
      std::fprintf(stderr, "baton bench: the server's log ends with:\n%s", log_tail().c_str());
      throw std::runtime_error(fmt::format("baton serve {} before listening", exit_text_));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop();
      std::fprintf(stderr, "baton bench: the server's log ends with:\n%s", log_tail().c_str());
      throw std::runtime_error(fmt::format("baton serve did not listen within {} s", timeout.count()));
    }
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[1024];
    const ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // closed: the exit shows next round
      continue;
    }
    text.append(buf, size_t(n));
    for (size_t nl; (nl = text.find('\n')) != std::string::npos; text.erase(0, nl + 1)) {
      const std::string line = text.substr(0, nl);
      if (line.rfind(listening, 0) == 0) port_ = std::atoi(line.c_str() + listening.size());
    }
  }
}

ServeChild::~ServeChild() { stop(); }

void ServeChild::record_exit(int status) {
  if (WIFEXITED(status)) {
    exit_text_ = fmt::format("exited with status {}", WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    exit_text_ = fmt::format("was killed by signal {}", WTERMSIG(status));
  } else {
    exit_text_ = "ended";
  }
}

bool ServeChild::exited() {
  const pid_t pid = pid_.load();
  if (pid <= 0) return true;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) != pid) return false;
  record_exit(status);
  pid_ = -1;
  return true;
}

void ServeChild::terminate() {
  const pid_t pid = pid_.load();
  if (pid > 0) kill(pid, SIGTERM);
}

void ServeChild::stop(std::chrono::seconds grace) {
  const pid_t pid = pid_.load();
  if (pid > 0) {
    kill(pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) != pid) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    record_exit(status);
    pid_ = -1;
  }
  if (out_fd_ >= 0) {
    ::close(out_fd_);
    out_fd_ = -1;
  }
}

std::string ServeChild::log_tail(int n) const {
  std::ifstream in(log_path_);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (int(lines.size()) > n) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& l : lines) out += "  " + l + "\n";
  return out.empty() ? "  (the server's log is empty)\n" : out;
}

}  // namespace baton::bench_serve
