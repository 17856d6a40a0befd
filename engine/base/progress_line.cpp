// See progress_line.h.
#include "engine/base/progress_line.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace baton {

namespace {

using Clock = std::chrono::steady_clock;
// Into a file or a pipe, a report at most this often (and the last one).
constexpr auto kPipeInterval = std::chrono::seconds(5);

std::atomic<bool> g_open{false};
std::mutex g_mutex;
Clock::time_point g_last_piped;
bool g_piped_any = false;

bool stderr_is_terminal() {
  static const bool tty = isatty(STDERR_FILENO) == 1;
  return tty;
}

}  // namespace

void print_progress_line(std::string_view text, bool done) {
  std::lock_guard lock(g_mutex);
  if (stderr_is_terminal()) {
    std::fprintf(stderr, "\r%.*s   %s", int(text.size()), text.data(), done ? "\n" : "");
    g_open.store(!done);
  } else {
    const Clock::time_point now = Clock::now();
    if (!done && g_piped_any && now - g_last_piped < kPipeInterval) return;
    g_last_piped = now;
    g_piped_any = true;
    std::fprintf(stderr, "%.*s\n", int(text.size()), text.data());
  }
  std::fflush(stderr);
}

void end_progress_line() {
  if (g_open.exchange(false)) std::fputc('\n', stderr);
}

}  // namespace baton
