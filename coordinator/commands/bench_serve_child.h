// `baton serve` as a child process of `baton bench --serve`: the same binary,
// on a free loopback port (--port 0, the port read from the "listening on"
// line), its stderr in a log file. It is stopped when the object dies, and
// the kernel stops it (SIGTERM) should the benchmark die without unwinding.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

namespace baton::bench_serve {

class ServeChild {
 public:
  // Starts `baton serve --host 127.0.0.1 --port 0 ARGS...` and waits until it
  // listens; throws (with the log's last lines) when it exits or stays silent
  // for `timeout` before that.
  ServeChild(const std::vector<std::string>& args, const std::string& log_path, std::chrono::seconds timeout);
  ~ServeChild();
  ServeChild(const ServeChild&) = delete;
  ServeChild& operator=(const ServeChild&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_.load(); }  // -1 once reaped
  // True once the process has ended (its exit status is then in exit_text()).
  bool exited();
  std::string exit_text() const { return exit_text_; }
  // SIGTERM without waiting; safe from any thread.
  void terminate();
  // SIGTERM, then SIGKILL after `grace`; waits for the exit. Idempotent.
  void stop(std::chrono::seconds grace = std::chrono::seconds(30));
  // The last `n` lines of the server's log, for error messages.
  std::string log_tail(int n = 15) const;

 private:
  void record_exit(int status);

  std::atomic<pid_t> pid_{-1};
  int out_fd_ = -1;
  int port_ = 0;
  std::string log_path_;
  std::string exit_text_;
};

}  // namespace baton::bench_serve
