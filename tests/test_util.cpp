#include "tests/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <tuple>
#include <random>
#include <stdexcept>

namespace baton::test {

namespace {

[[noreturn]] void missing_fixture(const std::string& path) {
  throw std::runtime_error("missing test fixture " + path +
                           ": set BATON_SHARED to the folder that holds models/ (configured default: " +
                           BATON_SHARED_DIR + ")");
}

// In a forked child: becomes argv[0] with the arguments, or exits with 127.
[[noreturn]] void exec_argv(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

}  // namespace

std::string shared_dir() {
  const char* env = std::getenv("BATON_SHARED");
  const std::string dir = env ? env : BATON_SHARED_DIR;
  if (!std::filesystem::is_directory(dir)) missing_fixture(dir);
  return dir;
}

std::string model_path(const std::string& name) {
  const std::string path = shared_dir() + "/models/" + name;
  if (!std::filesystem::exists(path)) missing_fixture(path);
  return path;
}

std::string baton_binary() {
  const char* env = std::getenv("BATON_BINARY");
  return env && *env ? env : BATON_BINARY;
}

std::string source_path(const std::string& rel) { return std::string(BATON_SOURCE_DIR) + "/" + rel; }

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "baton-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CommandResult run_command(const std::vector<std::string>& argv) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    exec_argv(argv);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  CommandResult r;
  // Drain both pipes together so a chatty child cannot block on a full pipe.
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, size_t(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Spawned spawn_piped(const std::vector<std::string>& argv, const std::string& stderr_path) {
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out[1], 1);
    dup2(err, 2);
    close(out[0]);
    close(out[1]);
    exec_argv(argv);
  }
  close(out[1]);
  return {pid, out[0]};
}

uint64_t test_seed() {
  if (const char* env = std::getenv("BATON_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return 20261129;
}

ConnectionFlood::ConnectionFlood(uint16_t port, size_t n, std::vector<uint8_t> first_bytes) {
  thread_ = std::thread([this, port, n, bytes = std::move(first_bytes)] {
    auto open_one = [&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
          (!bytes.empty() && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != ssize_t(bytes.size()))) {
        ::close(fd);
        return -1;
      }
      return fd;
    };
    std::vector<int> fds(n, -1);
    for (int& fd : fds) fd = open_one();
    while (!stop_.load()) {
      for (int& fd : fds) {
        uint8_t buf[512];
        pollfd p{fd, POLLIN, 0};
        // Still open: nothing to read, or what the server said (CHALLENGE).
        if (fd >= 0 && (::poll(&p, 1, 0) <= 0 || ::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0)) continue;
        if (fd >= 0) ::close(fd);
        fd = open_one();
        reopened_.fetch_add(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  });
}

ConnectionFlood::~ConnectionFlood() {
  stop_.store(true);
  thread_.join();
}

namespace {

// Closes with RST rather than FIN: the peer's next read or write fails.
void reset_close(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

TcpProxy::TcpProxy(uint16_t target_port) : target_(target_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 16) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      ::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error("TcpProxy: cannot listen on 127.0.0.1");
  }
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { run(); });
}

TcpProxy::~TcpProxy() {
  stop_.store(true);
  const char c = 's';
  (void)!::write(wake_[1], &c, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void TcpProxy::cut() {
  open_.store(false);
  const char c = 'c';
  (void)!::write(wake_[1], &c, 1);
}

void TcpProxy::restore() { open_.store(true); }

void TcpProxy::run() {
  struct Pair {
    int a, b;  // accepted (client side), dialled (target side)
  };
  std::vector<Pair> pairs;
  auto drop = [&](size_t i) {
    reset_close(pairs[i].a);
    reset_close(pairs[i].b);
    pairs.erase(pairs.begin() + std::ptrdiff_t(i));
    relayed_.store(int(pairs.size()));
  };
  std::vector<uint8_t> buf(1 << 16);
  while (!stop_.load()) {
    if (!open_.load()) {
      while (!pairs.empty()) drop(pairs.size() - 1);
    }
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const Pair& p : pairs) {
      fds.push_back({p.a, POLLIN, 0});
      fds.push_back({p.b, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
    if (fds[0].revents) {
      char sink[64];
      while (::read(wake_[0], sink, sizeof sink) > 0) {
      }
      continue;  // cut or stop: seen at the top
    }
    // Relay what arrived; a side that closed or failed takes its pair down.
    for (size_t k = pairs.size(); k-- > 0;) {
      const short ra = fds[2 + 2 * k].revents, rb = fds[3 + 2 * k].revents;
      bool ok = true;
      for (auto [from, to, r] : {std::tuple{pairs[k].a, pairs[k].b, ra}, std::tuple{pairs[k].b, pairs[k].a, rb}}) {
        if (!ok || !(r & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::recv(from, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n > 0) {
          ok = write_all(to, buf.data(), size_t(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          ok = false;
        }
      }
      if (!ok) drop(k);
    }
    if (fds[1].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        accepted_.fetch_add(1);
        int t = -1;
        if (open_.load()) {
          t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_port = htons(target_);
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (t >= 0 && ::connect(t, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            ::close(t);
            t = -1;
          }
        }
        if (t < 0) {
          reset_close(c);
        } else {
          pairs.push_back({c, t});
          relayed_.store(int(pairs.size()));
        }
      }
    }
  }
  while (!pairs.empty()) drop(pairs.size() - 1);
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

double rel_err(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace baton::test
