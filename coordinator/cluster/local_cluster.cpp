// LocalCluster: see local_cluster.h.
#include "coordinator/cluster/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <thread>

#include "net/auth.h"

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

// The secret file is created 0600 with O_EXCL inside a 0700 folder of our
// own, so no other user can read it or swap it.
void write_secret(const std::string& path) {
  const std::string text = hex(net::random_nonce()) + "\n";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot create the cluster secret file");
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write the cluster secret file");
}

std::string self_executable() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this program's path to start workers");
  return p.string();
}

}  // namespace

std::string LocalCluster::worker_name(int i) { return "worker-" + std::to_string(i); }

LocalCluster::LocalCluster(LocalClusterOptions opt) : opt_(std::move(opt)) {
  if (opt_.n_workers < 1) throw std::invalid_argument("a local cluster needs at least one worker");
  if (!opt_.worker_models.empty() && int(opt_.worker_models.size()) != opt_.n_workers) {
    throw std::invalid_argument("one model file per worker is needed");
  }
  std::string tmpl = (fs::temp_directory_path() / "baton-cluster-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::system_error(errno, std::generic_category(), "cannot create a temporary folder");
  dir_ = tmpl;  // mkdtemp makes it 0700
  try {
    secret_path_ = dir_ + "/cluster.secret";
    write_secret(secret_path_);
    cluster_ = std::make_unique<Cluster>(net::load_secret_file(secret_path_), opt_.cluster);
    binary_ = opt_.binary.empty() ? self_executable() : opt_.binary;
    {
      std::lock_guard lock(mu_);
      pids_.assign(size_t(opt_.n_workers), -1);
      reaped_.assign(size_t(opt_.n_workers), true);
      for (size_t i = 0; i < pids_.size(); ++i) spawn(i);
    }
    if (opt_.wait_for_registration) cluster_->wait_for_workers(opt_.n_workers, [this] { return exited_worker(); });
  } catch (...) {
    if (cluster_) cluster_->shutdown("start-up failed");
    stop_workers();
    cluster_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
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
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void LocalCluster::spawn(size_t i) {
  const std::string model = opt_.worker_models.empty() ? opt_.model : opt_.worker_models[i];
  const std::string coordinator = opt_.cluster.bind_host + ":" + std::to_string(cluster_->port());
  std::vector<std::string> args = {binary_,
                                   "worker",
                                   "--coordinator",
                                   coordinator,
                                   "--listen",
                                   opt_.cluster.bind_host + ":0",
                                   "--secret-file",
                                   secret_path_,
                                   "--model",
                                   model,
                                   "--name",
                                   worker_name(int(i)),
                                   "--threads",
                                   std::to_string(opt_.threads_per_worker),
                                   "--step-delay-ms",
                                   std::to_string(opt_.step_delay_ms),
                                   "--backend",
                                   opt_.backend};
  if (!opt_.gpus.empty()) {
    args.push_back("--gpu");
    args.push_back(std::to_string(opt_.gpus[i % opt_.gpus.size()]));
  }
  if (!opt_.worker_fault.empty()) {
    args.push_back("--fault");
    args.push_back(opt_.worker_fault);
  }
  if (i < opt_.worker_mem_limits.size() && opt_.worker_mem_limits[i] > 0) {
    args.push_back("--mem-limit");
    args.push_back(std::to_string(opt_.worker_mem_limits[i]));
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "cannot start a worker");
  if (pid == 0) {
    // Workers write nothing to stdout; keep the run's output clean.
    int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  pids_[i] = pid;
  reaped_[i] = false;
  std::fprintf(stderr, "baton: started %s (pid %d)\n", worker_name(int(i)).c_str(), int(pid));
}

std::string LocalCluster::reap(size_t i, bool block) {
  if (reaped_[i]) return "";
  int status = 0;
  if (waitpid(pids_[i], &status, block ? 0 : WNOHANG) != pids_[i]) return "";
  reaped_[i] = true;
  const std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                            : "was killed by signal " + std::to_string(WTERMSIG(status));
  return worker_name(int(i)) + " (pid " + std::to_string(pids_[i]) + ") " + how;
}

std::string LocalCluster::exited_worker() {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < pids_.size(); ++i) {
    std::string why = reap(i, false);
    if (!why.empty()) return why + " before registering";
  }
  return "";
}

void LocalCluster::restart_exited_workers() {
  std::lock_guard lock(mu_);
  if (supervisor_.joinable()) return;
  supervisor_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, 200ms);
      for (size_t i = 0; i < pids_.size() && !stopping_; ++i) {
        const std::string why = reap(i, false);
        if (why.empty()) continue;
        std::fprintf(stderr, "baton: %s; starting it again\n", why.c_str());
        // A second's pause: a worker that cannot start does not spin.
        cv_.wait_for(lock, 1s, [&] { return stopping_; });
        if (stopping_) break;
        try {
          spawn(i);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "baton: cannot restart %s: %s\n", worker_name(int(i)).c_str(), e.what());
        }
      }
    }
  });
}

void LocalCluster::stop_workers() {
  // Workers exit on SHUTDOWN or when the coordinator's link closes; give
  // them a moment, then make sure.
  std::lock_guard lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  for (size_t i = 0; i < pids_.size(); ++i) {
    while (!reaped_[i]) {
      if (!reap(i, false).empty()) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(pids_[i], SIGKILL);
        reap(i, true);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
}

}  // namespace baton
