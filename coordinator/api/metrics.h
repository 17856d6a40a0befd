// Serving metrics in the Prometheus text exposition format (GET /metrics).
// The HTTP layer counts requests and errors, the generation service counts
// tokens and times its stage forwards; gauges that describe the present
// (queue depth, busy slots, memory) are read from ServiceHealth at scrape time.
// Every method is thread-safe. docs/SERVING.md lists the series.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/api/generation.h"

namespace baton {

// Cumulative buckets with fixed upper bounds (seconds), Prometheus style.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // name_bucket{labels,le="..."} lines, then name_sum and name_count.
  void render(std::string& out, std::string_view name, std::string_view labels) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 (the last is +Inf)
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

class Metrics {
 public:
  Metrics();

  // One HTTP response sent: endpoint is a fixed route name ("chat", "completions",
  // "models", "health", "metrics", "other"), never client text.
  void http_response(std::string_view endpoint, int status);
  // A refused or failed request, by kind (bad_request, unauthorized, not_found,
  // too_large, timeout, queue_full, context_length, unavailable, internal...).
  void error(std::string_view kind);
  // Streaming responses open now.
  void stream_opened() { streams_open_.fetch_add(1, std::memory_order_relaxed); }
  void stream_closed() { streams_open_.fetch_sub(1, std::memory_order_relaxed); }

  // A generation ended (any reason), with its final usage.
  void generation_finished(FinishReason reason, const Usage& usage);
  // Drafting paused: its steps fell below plain steps' rate (DraftPacer).
  void draft_paused() { draft_pauses_.fetch_add(1, std::memory_order_relaxed); }
  // One forward of `n_tokens` tokens on stage `stage` took `seconds` (-1: a
  // whole route of worker stages, timed by the coordinator).
  void stage_forward(int stage, bool prefill, int64_t n_tokens, double seconds);

  std::string render(const ServiceHealth& health) const;

  // For tests and logs.
  uint64_t completion_tokens() const { return completion_tokens_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  // Tokens and busy seconds of one phase per wall-clock second, over the last
  // kWindow seconds: the tokens/s gauges.
  static constexpr int kWindow = 10;
  struct Second {
    int64_t second = -1;
    int64_t tokens = 0;
    double busy_s = 0;
  };
  struct Phase {
    uint64_t tokens = 0;
    double busy_s = 0;
    std::array<Second, kWindow + 2> window{};
  };
  double recent_rate(const Phase& p, int64_t now_s) const;
  int64_t now_second() const;

  const Clock::time_point start_ = Clock::now();
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;  // (endpoint, status)
  std::map<std::string, uint64_t> errors_;
  std::map<std::string, uint64_t> finished_;  // by finish reason
  std::map<std::pair<int, bool>, std::unique_ptr<Histogram>> stage_latency_;  // (stage, prefill)
  Phase prefill_, decode_;

  std::atomic<uint64_t> prompt_tokens_{0}, cached_tokens_{0}, completion_tokens_{0};
  std::atomic<uint64_t> draft_tokens_{0}, draft_accepted_{0};  // Usage::draft_n, draft_n_accepted
  std::atomic<uint64_t> draft_pauses_{0};
  std::atomic<int64_t> streams_open_{0};
  Histogram ttft_, queue_time_, request_time_;
};

}  // namespace baton
