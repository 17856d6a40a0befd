#include "coordinator/commands/load_report.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "engine/base/progress_line.h"

namespace baton {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
}  // namespace

std::function<void(const LoadProgress&)> stderr_load_progress(std::string what) {
  using Clock = std::chrono::steady_clock;
  auto last = std::make_shared<Clock::time_point>(Clock::now() - std::chrono::seconds(1));
  return [what = std::move(what), last](const LoadProgress& p) {
    const auto now = Clock::now();
    if (p.done < p.total && now - *last < std::chrono::milliseconds(500)) return;
    *last = now;
    print_progress_line("loading " + what + ": " + format_progress(p), p.done == p.total);
  };
}

void warn_beyond_trained_context(const char* command, int64_t n_ctx_train, int64_t n_ctx) {
  if (n_ctx_train <= 0 || n_ctx <= n_ctx_train) return;
  std::fprintf(stderr, "%s: warning: --ctx %lld is beyond the model's trained context of %lld tokens; text past it may degrade\n",
               command, (long long)n_ctx, (long long)n_ctx_train);
}

std::string load_summary(const StageRunner& r) {
  const LoadStats& s = r.load_stats();
  std::string out = fmt::format("loaded {:.2f} GiB in {:.2f} s ({:.2f} GB/s{})", double(s.bytes) / kGiB, s.seconds,
                                s.gbps(), s.direct_io ? ", O_DIRECT" : "");
  const uint64_t grew = s.rss_peak > s.rss_before ? s.rss_peak - s.rss_before : 0;
  out += fmt::format("; host RSS peak {:.0f} MiB, {} {:.0f} MiB before", double(s.rss_peak) / kMiB,
                     s.rss_peak_reset ? fmt::format("+{:.0f} MiB over", double(grew) / kMiB) : std::string("vs"),
                     double(s.rss_before) / kMiB);
  if (s.staging_bytes) out += fmt::format(" (staging ring {:.0f} MiB)", double(s.staging_bytes) / kMiB);
  const DeviceMemoryReport m = r.device_memory();
  if (m.planned) {
    out += fmt::format("; {}: plan {:.1f} MiB, allocated {:.1f} MiB, cudaMemGetInfo {:.1f} MiB ({:+.2f}%)", m.device,
                       double(m.planned) / kMiB, double(m.allocated) / kMiB, double(m.measured) / kMiB,
                       m.planned ? 100.0 * (double(m.measured) - double(m.planned)) / double(m.planned) : 0.0);
  }
  return out;
}

}  // namespace baton
