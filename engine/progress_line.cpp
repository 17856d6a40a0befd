// See progress_line.h.
#include "engine/progress_line.h"

#include <atomic>
#include <cstdio>

namespace baton {

namespace {
std::atomic<bool> g_open{false};
}  // namespace

void set_progress_line_open(bool open) { g_open.store(open); }

void end_progress_line() {
  if (g_open.exchange(false)) std::fputc('\n', stderr);
}

}  // namespace baton
