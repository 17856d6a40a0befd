#include "coordinator/api/metrics.h"
#include "engine/model/layer_range_text.h"

#include <fmt/format.h>

#include <algorithm>

namespace baton {

namespace {

// Latency buckets from 1 ms to 2 min: stage forwards on tiny models take well
// under a millisecond, a long prompt's time to first token on a big one minutes.
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// Label values may come from worker names: escape what the format reserves.
std::string label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < bounds_.size() ? fmt::format("{}", bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, le, cumulative);
  }
  const std::string braces = labels.empty() ? "" : fmt::format("{{{}}}", labels);
  out += fmt::format("{}_sum{} {}\n", name, braces, sum_.load(std::memory_order_relaxed));
  out += fmt::format("{}_count{} {}\n", name, braces, count_.load(std::memory_order_relaxed));
}

Metrics::Metrics() : ttft_(latency_bounds()), queue_time_(latency_bounds()), request_time_(latency_bounds()) {}

void Metrics::http_response(std::string_view endpoint, int status) {
  std::lock_guard lock(mu_);
  ++responses_[{std::string(endpoint), status}];
}

void Metrics::error(std::string_view kind) {
  std::lock_guard lock(mu_);
  ++errors_[std::string(kind)];
}

void Metrics::generation_finished(FinishReason reason, const Usage& usage) {
  prompt_tokens_.fetch_add(uint64_t(usage.prompt_tokens), std::memory_order_relaxed);
  cached_tokens_.fetch_add(uint64_t(usage.cached_tokens), std::memory_order_relaxed);
  completion_tokens_.fetch_add(uint64_t(usage.completion_tokens), std::memory_order_relaxed);
  draft_tokens_.fetch_add(uint64_t(usage.draft_n), std::memory_order_relaxed);
  draft_accepted_.fetch_add(uint64_t(usage.draft_n_accepted), std::memory_order_relaxed);
  if (usage.completion_tokens > 0) ttft_.observe(usage.time_to_first_token_s);
  queue_time_.observe(usage.queue_s);
  request_time_.observe(usage.queue_s + usage.prefill_s + usage.decode_s);
  std::lock_guard lock(mu_);
  ++finished_[finish_reason_name(reason)];
}

int64_t Metrics::now_second() const {
  return std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_).count();
}

void Metrics::stage_forward(int stage, bool prefill, int64_t n_tokens, double seconds) {
  const int64_t now = now_second();
  std::lock_guard lock(mu_);
  auto& h = stage_latency_[{stage, prefill}];
  if (!h) h = std::make_unique<Histogram>(latency_bounds());
  h->observe(seconds);
  // Every token passes the first stage once: throughput is counted there
  // (stage -1 is a whole route of worker stages, timed by the coordinator).
  Phase& p = prefill ? prefill_ : decode_;
  if (stage <= 0) {
    p.tokens += uint64_t(n_tokens);
    p.busy_s += seconds;
    Second& s = p.window[size_t(now % int64_t(p.window.size()))];
    if (s.second != now) s = {now, 0, 0};
    s.tokens += n_tokens;
    s.busy_s += seconds;
  }
}

double Metrics::recent_rate(const Phase& p, int64_t now_s) const {
  int64_t tokens = 0;
  double busy = 0;
  for (const Second& s : p.window) {
    if (s.second >= 0 && s.second > now_s - kWindow) {
      tokens += s.tokens;
      busy += s.busy_s;
    }
  }
  return busy > 0 ? double(tokens) / busy : 0.0;
}

std::string Metrics::render(const ServiceHealth& health) const {
  std::string out;
  const int64_t now = now_second();
  std::lock_guard lock(mu_);

  header(out, "baton_http_responses_total", "counter", "HTTP responses sent, by route and status code.");
  for (const auto& [key, n] : responses_) {
    out += fmt::format("baton_http_responses_total{{endpoint=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, n);
  }
  header(out, "baton_errors_total", "counter", "Refused or failed requests, by kind.");
  for (const auto& [kind, n] : errors_) out += fmt::format("baton_errors_total{{kind=\"{}\"}} {}\n", kind, n);

  header(out, "baton_generations_total", "counter", "Generations that ended, by finish reason.");
  for (const char* r : {"stop", "length", "cancelled", "error"}) {
    auto it = finished_.find(r);
    out += fmt::format("baton_generations_total{{finish=\"{}\"}} {}\n", r, it == finished_.end() ? 0 : it->second);
  }
  header(out, "baton_prompt_tokens_total", "counter", "Prompt tokens of ended generations.");
  out += fmt::format("baton_prompt_tokens_total {}\n", prompt_tokens_.load());
  header(out, "baton_prompt_tokens_cached_total", "counter",
         "Prompt tokens of ended generations whose KV the prefix cache reused instead of computing them.");
  out += fmt::format("baton_prompt_tokens_cached_total {}\n", cached_tokens_.load());
  header(out, "baton_completion_tokens_total", "counter",
         "Tokens generated (end-of-generation tokens excluded), as reported in usage.");
  out += fmt::format("baton_completion_tokens_total {}\n", completion_tokens_.load());
  header(out, "baton_draft_tokens_total", "counter",
         "Tokens the drafter guessed and the model checked (speculative decoding), of ended generations.");
  out += fmt::format("baton_draft_tokens_total {}\n", draft_tokens_.load());
  header(out, "baton_draft_accepted_total", "counter", "Guessed tokens the model kept, of ended generations.");
  out += fmt::format("baton_draft_accepted_total {}\n", draft_accepted_.load());
  header(out, "baton_draft_pauses_total", "counter",
         "Times drafting paused because its steps gave fewer tokens per second than plain steps (it probes again later).");
  out += fmt::format("baton_draft_pauses_total {}\n", draft_pauses_.load());

  header(out, "baton_prefill_tokens_total", "counter", "Prompt tokens run through the first stage.");
  out += fmt::format("baton_prefill_tokens_total {}\n", prefill_.tokens);
  header(out, "baton_prefill_seconds_total", "counter", "First-stage forward time spent on prompts.");
  out += fmt::format("baton_prefill_seconds_total {}\n", prefill_.busy_s);
  header(out, "baton_decode_tokens_total", "counter", "Generated tokens run through the first stage.");
  out += fmt::format("baton_decode_tokens_total {}\n", decode_.tokens);
  header(out, "baton_decode_seconds_total", "counter", "First-stage forward time spent on generated tokens.");
  out += fmt::format("baton_decode_seconds_total {}\n", decode_.busy_s);
  header(out, "baton_prefill_tokens_per_second", "gauge",
         "Prompt tokens per second of forward time over the last 10 s (0 when idle).");
  out += fmt::format("baton_prefill_tokens_per_second {}\n", recent_rate(prefill_, now));
  header(out, "baton_decode_tokens_per_second", "gauge",
         "Generated tokens per second of forward time over the last 10 s (0 when idle).");
  out += fmt::format("baton_decode_tokens_per_second {}\n", recent_rate(decode_, now));

  header(out, "baton_time_to_first_token_seconds", "histogram", "From submission to the first generated token.");
  ttft_.render(out, "baton_time_to_first_token_seconds", "");
  header(out, "baton_queue_seconds", "histogram", "From submission to admission into a sequence slot.");
  queue_time_.render(out, "baton_queue_seconds", "");
  header(out, "baton_generation_seconds", "histogram", "From submission to the end of the generation.");
  request_time_.render(out, "baton_generation_seconds", "");
  header(out, "baton_stage_forward_seconds", "histogram", "Latency of one forward of one stage, by phase.");
  for (const auto& [key, h] : stage_latency_) {
    h->render(out, "baton_stage_forward_seconds",
              fmt::format("stage=\"{}\",phase=\"{}\"", key.first < 0 ? "route" : std::to_string(key.first),
                          key.second ? "prefill" : "decode"));
  }

  header(out, "baton_queue_depth", "gauge", "Requests waiting for a sequence slot.");
  out += fmt::format("baton_queue_depth {}\n", health.queue_depth);
  header(out, "baton_queue_capacity", "gauge", "Most requests that may wait; more get 429.");
  out += fmt::format("baton_queue_capacity {}\n", health.queue_capacity);
  header(out, "baton_slots_busy", "gauge", "Sequence slots (KV cache) in use.");
  out += fmt::format("baton_slots_busy {}\n", health.slots_busy);
  header(out, "baton_slots_total", "gauge", "Sequence slots (KV cache) in all.");
  out += fmt::format("baton_slots_total {}\n", health.slots_total);
  header(out, "baton_streams_open", "gauge", "Streaming responses in progress.");
  out += fmt::format("baton_streams_open {}\n", streams_open_.load());
  header(out, "baton_up", "gauge", "1 when every stage is loaded and serving.");
  out += fmt::format("baton_up {}\n", health.status == "ok" ? 1 : 0);

  header(out, "baton_memory_bytes", "gauge",
         "Memory per node: planned (the memory plan), used (allocated for it), rss (process resident).");
  for (const StageHealth& s : health.stages) {
    uint64_t planned = 0;
    for (const auto& line : s.memory_planned) planned += line.second;
    std::string node = fmt::format("node=\"{}\",layers=\"{}\"", label_value(s.node),
                                   layer_range_text(s.first_layer, s.last_layer));
    if (s.tp > 1) node += fmt::format(",tp_rank=\"{}\",tp_size=\"{}\"", s.rank, s.tp);
    out += fmt::format("baton_memory_bytes{{{},kind=\"planned\"}} {}\n", node, planned);
    out += fmt::format("baton_memory_bytes{{{},kind=\"used\"}} {}\n", node, s.memory_used);
    out += fmt::format("baton_memory_bytes{{{},kind=\"rss\"}} {}\n", node, s.rss_bytes);
  }
  return out;
}

}  // namespace baton
