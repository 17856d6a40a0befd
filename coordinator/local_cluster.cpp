// LocalCluster: see local_cluster.h.
#include "coordinator/local_cluster.h"

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
  std::string tmpl = (fs::temp_directory_path() / "baton-cluster-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::system_error(errno, std::generic_category(), "cannot create a temporary folder");
  dir_ = tmpl;  // mkdtemp makes it 0700
  try {
    const std::string secret_path = dir_ + "/cluster.secret";
    write_secret(secret_path);
    cluster_ = std::make_unique<Cluster>(net::load_secret_file(secret_path), opt_.cluster);
    const std::string binary = opt_.binary.empty() ? self_executable() : opt_.binary;
    const std::string coordinator = opt_.cluster.bind_host + ":" + std::to_string(cluster_->port());
    for (int i = 0; i < opt_.n_workers; ++i) {
      std::vector<std::string> args = {binary,
                                       "worker",
                                       "--coordinator",
                                       coordinator,
                                       "--listen",
                                       opt_.cluster.bind_host + ":0",
                                       "--secret-file",
                                       secret_path,
                                       "--model",
                                       opt_.model,
                                       "--name",
                                       worker_name(i),
                                       "--threads",
                                       std::to_string(opt_.threads_per_worker),
                                       "--step-delay-ms",
                                       std::to_string(opt_.step_delay_ms)};
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
      pids_.push_back(pid);
      reaped_.push_back(false);
      std::fprintf(stderr, "baton: started %s (pid %d)\n", worker_name(i).c_str(), int(pid));
    }
    cluster_->wait_for_workers(opt_.n_workers, [this] { return exited_worker(); });
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
  if (cluster_) cluster_->shutdown("run finished");
  stop_workers();
  cluster_.reset();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string LocalCluster::exited_worker() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    int status = 0;
    if (waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
      reaped_[i] = true;
      const std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                                : "was killed by signal " + std::to_string(WTERMSIG(status));
      return worker_name(int(i)) + " (pid " + std::to_string(pids_[i]) + ") " + how + " before registering";
    }
  }
  return "";
}

void LocalCluster::stop_workers() {
  // Workers exit on SHUTDOWN or when the coordinator's link closes; give
  // them a moment, then make sure.
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  for (size_t i = 0; i < pids_.size(); ++i) {
    while (!reaped_[i]) {
      int status = 0;
      const pid_t r = waitpid(pids_[i], &status, WNOHANG);
      if (r == pids_[i] || r < 0) {
        reaped_[i] = true;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(pids_[i], SIGKILL);
        waitpid(pids_[i], &status, 0);
        reaped_[i] = true;
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
}

}  // namespace baton
