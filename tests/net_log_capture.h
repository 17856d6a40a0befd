// Captures the net log (net/log.h) for the duration of a test, so that tests
// can check what a link or handshake said, and say it in a failure message.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "net/log.h"

namespace baton::test {

// Lines are "LEVEL: text". The sink before is back when the capture dies.
class LogCapture {
 public:
  LogCapture() {
    prev_ = net::set_log_sink([this](net::LogLevel level, std::string_view line) {
      std::lock_guard lock(mu_);
      lines_.push_back(std::string(net::level_name(level)) + ": " + std::string(line));
    });
  }
  ~LogCapture() { net::set_log_sink(prev_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }
  bool contains(const std::string& s) const {
    std::lock_guard lock(mu_);
    for (const std::string& l : lines_) {
      if (l.find(s) != std::string::npos) return true;
    }
    return false;
  }
  std::string all() const {
    std::lock_guard lock(mu_);
    std::string s;
    for (const std::string& l : lines_) s += l + "\n";
    return s;
  }

 private:
  net::LogSink prev_;
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

}  // namespace baton::test
