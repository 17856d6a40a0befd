// LocalCluster: see local_cluster.h.
#include "coordinator/cluster/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

#include "net/address.h"
#include "net/auth.h"
#include "net/log.h"

namespace baton {

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string hex(const net::Nonce& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::string self_executable() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this program's path to start workers");
  return p.string();
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "cannot make a pipe");
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  int take_r() { return std::exchange(r, -1); }
};

std::string seconds_text(std::chrono::milliseconds ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", double(ms.count()) / 1000.0);
  return b;
}

}  // namespace

std::string LocalCluster::worker_name(int i) { return "worker-" + std::to_string(i); }

LocalCluster::LocalCluster(LocalClusterOptions opt) : opt_(std::move(opt)) {
  if (opt_.n_workers < 1) throw std::invalid_argument("a local cluster needs at least one worker");
  if (!opt_.worker_models.empty() && int(opt_.worker_models.size()) != opt_.n_workers) {
    throw std::invalid_argument("one model file per worker is needed");
  }
  secret_text_ = hex(net::random_nonce());
  opt_.cluster.on_worker_lost = [this](const std::string& name, Clock::time_point registered) {
    on_worker_lost(name, registered);
  };
  try {
    cluster_ = std::make_unique<Cluster>(net::Secret({secret_text_.begin(), secret_text_.end()}), opt_.cluster);
    binary_ = opt_.binary.empty() ? self_executable() : opt_.binary;
    {
      std::lock_guard lock(mu_);
      procs_.assign(size_t(opt_.n_workers), Proc{});
      {
        std::lock_guard elock(err_mu_);
        last_line_.assign(size_t(opt_.n_workers), "");
      }
      for (size_t i = 0; i < procs_.size(); ++i) spawn(i);
    }
    if (opt_.wait_for_registration) cluster_->wait_for_workers(opt_.n_workers, [this] { return exited_worker(); });
  } catch (...) {
    if (cluster_) cluster_->shutdown("start-up failed");
    stop_workers();
    cluster_.reset();
    join_finished_relays();
    std::fill(secret_text_.begin(), secret_text_.end(), '\0');
    throw;
  }
}

LocalCluster::~LocalCluster() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (supervisor_.joinable()) supervisor_.join();
  if (cluster_) cluster_->shutdown("run finished");
  stop_workers();
  cluster_.reset();
  join_finished_relays();  // every worker is gone: each relay has seen its end
  std::fill(secret_text_.begin(), secret_text_.end(), '\0');
}

void LocalCluster::spawn(size_t i) {
  const std::string model = opt_.worker_models.empty() ? opt_.model : opt_.worker_models[i];
  const std::string coordinator = net::join_host_port(opt_.cluster.bind_host, cluster_->port());
  std::vector<std::string> args = {binary_,
                                   "worker",
                                   "--coordinator",
                                   coordinator,
                                   "--listen",
                                   net::join_host_port(opt_.cluster.bind_host, 0),
                                   "--secret-file",
                                   "/dev/fd/3",
                                   "--model",
                                   model,
                                   "--name",
                                   worker_name(int(i)),
                                   "--threads",
                                   std::to_string(opt_.threads_per_worker),
                                   "--step-delay-ms",
                                   std::to_string(opt_.step_delay_ms),
                                   "--backend",
                                   opt_.backend,
                                   // the coordinator's log level (run -v, serve --log-level)
                                   "--log-level",
                                   std::string(net::level_name(net::log_level())),
                                   // the coordinator is this process: when it is gone, so is the worker
                                   "--exit-with-coordinator"};
  if (!opt_.gpus.empty()) {
    args.push_back("--gpu");
    args.push_back(std::to_string(opt_.gpus[i % opt_.gpus.size()]));
  }
  if (!opt_.worker_fault.empty()) {
    args.push_back("--fault");
    args.push_back(opt_.worker_fault);
  }
  if (opt_.staging_mb > 0) {
    args.push_back("--staging-mb");
    args.push_back(std::to_string(opt_.staging_mb));
  }
  if (i < opt_.worker_mem_limits.size() && opt_.worker_mem_limits[i] > 0) {
    args.push_back("--mem-limit");
    args.push_back(std::to_string(opt_.worker_mem_limits[i]) + "B");
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  join_finished_relays();
  // The secret waits in the pipe (65 bytes: far below its buffer) for the
  // worker to read; the write end is closed before the fork.
  Pipe secret;
  const std::string line = secret_text_ + "\n";
  if (::write(secret.w, line.data(), line.size()) != ssize_t(line.size())) {
    throw std::system_error(errno, std::generic_category(), "cannot hand the secret to a worker");
  }
  ::close(std::exchange(secret.w, -1));
  Pipe err;
  const long open_max = std::max(1024L, ::sysconf(_SC_OPEN_MAX));
  const pid_t pid = fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "cannot start a worker");
  if (pid == 0) {
    // Only async-signal-safe calls until exec. Workers write nothing to
    // stdout; keep the run's output clean.
    int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, 1);
    ::dup2(err.w, 2);
    if (secret.r == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else {
      ::dup2(secret.r, 3);
    }
    // Nothing else of ours reaches the worker: not the listening sockets,
    // the clients' connections, nor the other workers' links and pipes.
    if (::close_range(4, ~0U, 0) != 0) {
      for (long fd = 4; fd < open_max; ++fd) ::close(int(fd));
    }
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  procs_[i].pid = pid;
  procs_[i].reaped = false;
  procs_[i].started = Clock::now();
  procs_[i].restart_pending = false;
  {
    std::lock_guard elock(err_mu_);
    last_line_[i].clear();
    auto r = std::make_unique<Relay>();
    r->worker = i;
    Relay* raw = r.get();
    const int fd = err.take_r();
    raw->thread = std::thread([this, fd, raw] { relay(fd, raw); });
    relays_.push_back(std::move(r));
  }
  if (net::log_enabled(net::LogLevel::info)) {
    std::fprintf(stderr, "baton: started %s (pid %d)\n", worker_name(int(i)).c_str(), int(pid));
  }
}

void LocalCluster::relay(int fd, Relay* r) {
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, size_t(n));
    size_t nl = 0;
    while ((nl = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      std::fprintf(stderr, "%s\n", line.c_str());
      remember_error(r->worker, line);
    }
  }
  ::close(fd);
  if (!pending.empty()) std::fprintf(stderr, "%s\n", pending.c_str());
  remember_error(r->worker, pending);
  {
    std::lock_guard lock(err_mu_);
    r->done = true;
  }
  err_cv_.notify_all();
}

void LocalCluster::remember_error(size_t worker, const std::string& line) {
  // The line cli/ prints when a command fails; after a '\r' progress line
  // it may follow the progress text on the same line.
  static const std::string kPrefix = "baton worker: ";
  const size_t at = line.rfind(kPrefix);
  if (at == std::string::npos || (at != 0 && line[at - 1] != '\r' && line[at - 1] != ' ')) return;
  std::lock_guard lock(err_mu_);
  last_line_[worker] = line.substr(at);
}

void LocalCluster::join_finished_relays() {
  std::vector<std::unique_ptr<Relay>> finished;
  {
    std::lock_guard lock(err_mu_);
    auto it = std::stable_partition(relays_.begin(), relays_.end(), [](const auto& r) { return !r->done; });
    std::move(it, relays_.end(), std::back_inserter(finished));
    relays_.erase(it, relays_.end());
  }
  for (auto& r : finished) r->thread.join();
  if (stopping_ || !cluster_) {
    // Destruction: every worker has been reaped, so every relay ends.
    std::vector<std::unique_ptr<Relay>> rest;
    {
      std::lock_guard lock(err_mu_);
      rest = std::move(relays_);
      relays_.clear();
    }
    for (auto& r : rest) r->thread.join();
  }
}

std::string LocalCluster::last_error(size_t i) {
  std::unique_lock lock(err_mu_);
  // The process is gone; its last bytes may still be on their way through
  // the relay.
  err_cv_.wait_for(lock, 500ms, [&] {
    return std::none_of(relays_.begin(), relays_.end(), [&](const auto& r) { return r->worker == i && !r->done; });
  });
  return last_line_[i];
}

std::string LocalCluster::reap(size_t i, bool block) {
  Proc& p = procs_[i];
  if (p.reaped) return "";
  int status = 0;
  if (waitpid(p.pid, &status, block ? 0 : WNOHANG) != p.pid) return "";
  p.reaped = true;
  std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                      : "was killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    const std::string last = last_error(i);
    if (!last.empty()) how += ": " + last;
  }
  return worker_name(int(i)) + " (pid " + std::to_string(p.pid) + ") " + how;
}

std::string LocalCluster::exited_worker() {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < procs_.size(); ++i) {
    std::string why = reap(i, false);
    if (!why.empty()) return why + " (before registering)";
  }
  return "";
}

void LocalCluster::on_worker_lost(const std::string& name, Clock::time_point registered) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  for (size_t i = 0; i < procs_.size(); ++i) {
    Proc& p = procs_[i];
    // Only the process that made that link: a successor started after it
    // registered is left alone.
    if (worker_name(int(i)) != name || p.reaped || p.started > registered) continue;
    std::fprintf(stderr, "baton: %s (pid %d) lost its link to the coordinator; stopping it\n", name.c_str(),
                 int(p.pid));
    ::kill(p.pid, SIGKILL);
  }
  cv_.notify_all();
}

void LocalCluster::restart_exited_workers() {
  std::lock_guard lock(mu_);
  if (supervisor_.joinable()) return;
  supervisor_ = std::thread([this] { supervise(); });
}

void LocalCluster::supervise() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, 100ms);
    if (stopping_) break;
    // A worker that has loaded is healthy: its next failure starts the
    // back-off over.
    for (const WorkerStatus& w : cluster_->workers()) {
      for (size_t i = 0; i < procs_.size(); ++i) {
        if (w.state == "loaded" && w.name == worker_name(int(i))) procs_[i].failures = 0;
      }
    }
    const auto now = Clock::now();
    for (size_t i = 0; i < procs_.size() && !stopping_; ++i) {
      Proc& p = procs_[i];
      const std::string why = reap(i, false);
      if (!why.empty()) {
        const auto delay = std::min<std::chrono::milliseconds>(kMaxRestartDelay,
                                                                kFirstRestartDelay * (1LL << std::min(p.failures, 16)));
        ++p.failures;
        p.restart_pending = true;
        p.restart_at = now + delay;
        std::fprintf(stderr, "baton: %s; starting it again in %s\n", why.c_str(), seconds_text(delay).c_str());
        cluster_->report_worker_failure(why);
      }
      if (p.restart_pending && now >= p.restart_at) {
        try {
          spawn(i);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "baton: cannot restart %s: %s\n", worker_name(int(i)).c_str(), e.what());
          p.restart_at = now + kMaxRestartDelay;
        }
      }
    }
  }
}

void LocalCluster::stop_workers() {
  // Workers exit on SHUTDOWN or when the coordinator's link closes; give
  // them a moment, then make sure.
  std::lock_guard lock(mu_);
  const auto deadline = Clock::now() + 3s;
  for (size_t i = 0; i < procs_.size(); ++i) {
    while (!procs_[i].reaped) {
      if (!reap(i, false).empty()) break;
      if (Clock::now() >= deadline) {
        kill(procs_[i].pid, SIGKILL);
        reap(i, true);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
}

}  // namespace baton
