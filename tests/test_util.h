// Shared helpers for the GoogleTest suites.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace baton::test {

// Folder with the read-only fixtures (shared/models...): $BATON_SHARED, else the BATON_SHARED
// the build was configured with (../shared beside the checkout). Missing fixtures fail the test
// that needs them instead of skipping it, so a run without them cannot pass vacuously: both
// throw, naming the path and how to point the tests at the fixtures.
std::string shared_dir();
std::string model_path(const std::string& name);  // shared_dir()/models/name, which must exist
// Path of the `baton` binary the CLI suites drive: $BATON_BINARY, else the one built beside
// them (a packed build on another machine names its own).
std::string baton_binary();
// A file or folder of the checkout, by its path from the top (e.g. "configs",
// "tests/serve"): the source folder the build was configured from, so that it
// does not depend on the folder a test runs in or on how __FILE__ was spelled.
std::string source_path(const std::string& rel);

// A fresh temporary folder, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;     // stdout
  std::string err;     // stderr
};
// Runs argv[0] with the arguments (no shell), capturing stdout and stderr.
CommandResult run_command(const std::vector<std::string>& argv);

// A started child: argv[0] with the arguments (no shell), its stdout on a pipe
// the caller reads from `stdout_fd` (and closes), its stderr written to a file
// so that it can be read after the child is gone. The caller waits for it.
struct Spawned {
  pid_t pid;
  int stdout_fd;
};
Spawned spawn_piped(const std::vector<std::string>& argv, const std::string& stderr_path);

// A seed for randomised tests: $BATON_TEST_SEED when set, else a fixed value.
// Tests print it (SCOPED_TRACE) so a failure can be replayed.
uint64_t test_seed();

// An attacker on a port: a thread holds `n` TCP connections to
// 127.0.0.1:port open, sends `first_bytes` on each (empty: stays silent) and
// reopens every one the server closes, until destroyed.
class ConnectionFlood {
 public:
  ConnectionFlood(uint16_t port, size_t n, std::vector<uint8_t> first_bytes = {});
  ~ConnectionFlood();
  ConnectionFlood(const ConnectionFlood&) = delete;
  ConnectionFlood& operator=(const ConnectionFlood&) = delete;
  int reopened() const { return reopened_.load(); }  // connections the server closed

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> reopened_{0};
  std::thread thread_;
};

// A TCP relay on 127.0.0.1 (a free port) to 127.0.0.1:target_port, standing
// in for a NAT or firewall between two processes: cut() resets every
// connection through it (RST both ways) and resets each new one at once,
// so both ends see the link drop while their processes stay up, until
// restore() lets connections through again.
class TcpProxy {
 public:
  explicit TcpProxy(uint16_t target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;
  uint16_t port() const { return port_; }
  void cut();
  void restore();
  int relayed() const { return relayed_.load(); }  // connections currently relayed
  int accepted() const { return accepted_.load(); }  // connections accepted, relayed or reset

 private:
  void run();
  uint16_t target_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> open_{true};
  std::atomic<bool> stop_{false};
  std::atomic<int> relayed_{0};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

std::vector<uint8_t> read_file(const std::string& path);

// max |a - b| over max |b|: a row of logits' error relative to its scale
// (infinite for a non-finite value of a or rows of other sizes).
double rel_err(std::span<const float> a, std::span<const float> b);
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace baton::test
