// What the progress lines of `baton convert` and `baton synth` share: sizes in
// GiB, the percentage, and the rule for when a line is due.
#pragma once

#include <chrono>
#include <cstdint>

namespace baton {

inline double gib(uint64_t b) { return double(b) / double(uint64_t(1) << 30); }

// 100 for an empty total, so that the last line of an empty file says done.
inline double percent(uint64_t done, uint64_t total) { return total ? 100.0 * double(done) / double(total) : 100.0; }

// A line at most twice a second (more would only flicker), and always the
// last one, so that the final figures are on screen; none with --quiet.
class ProgressThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ProgressThrottle(bool quiet) : quiet_(quiet), last_(Clock::now()) {}
  // The half second counts from `now`.
  void restart(Clock::time_point now) { last_ = now; }
  bool due(Clock::time_point now, uint64_t done, uint64_t total) {
    if (quiet_ || (done < total && now - last_ < std::chrono::milliseconds(500))) return false;
    last_ = now;
    return true;
  }

 private:
  bool quiet_;
  Clock::time_point last_;
};

}  // namespace baton
