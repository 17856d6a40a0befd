#include "coordinator/api/generation_link.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <mutex>
#include <stdexcept>

#include "coordinator/api/metrics.h"
#include "coordinator/api/request_json.h"

namespace baton {

std::string make_request_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

namespace {

// The link between the service's events and the HTTP response. Stream events
// that arrive before the response head was sent wait here, so chunks can
// never overtake the head.
struct GenerationLink {
  GenerationLink(std::unique_ptr<ResponseShaper> shaper, std::shared_ptr<HttpExchange> ex, Metrics& metrics,
                 bool stream)
      : shaper(std::move(shaper)), ex(std::move(ex)), metrics(metrics), stream(stream) {}
  ~GenerationLink() {
    if (opened) metrics.stream_closed();
  }

  void on_event(GenerationEvent&& ev) {
    if (stream) {
      std::lock_guard lock(mu);
      for (auto& chunk : shaper->stream_chunks(ev)) {
        if (head_sent) {
          ex->write(std::move(chunk));
        } else {
          pending.push_back(std::move(chunk));
        }
      }
      if (ev.finish) {
        if (head_sent) {
          ex->end();
        } else {
          ended = true;
        }
      }
      return;
    }
    shaper->add(ev);
    if (!ev.finish) return;
    if (*ev.finish == FinishReason::error) {
      metrics.error("internal");
      ex->respond(500, "application/json", shaper->error_body(500, "generation failed: " + ev.error));
    } else if (*ev.finish == FinishReason::cancelled) {
      ex->respond(503, "application/json",
                  shaper->error_body(503, "the request was cancelled (the server is stopping)"));
    } else {
      ex->respond(200, "application/json", shaper->body());
    }
  }

  void send_head() {
    std::lock_guard lock(mu);
    ex->begin_stream(200, "text/event-stream");
    metrics.stream_opened();
    opened = true;
    head_sent = true;
    for (auto& chunk : pending) ex->write(std::move(chunk));
    pending.clear();
    if (ended) ex->end();
  }

  std::unique_ptr<ResponseShaper> shaper;
  std::shared_ptr<HttpExchange> ex;
  Metrics& metrics;
  const bool stream;
  std::mutex mu;
  bool head_sent = false, ended = false, opened = false;
  std::vector<std::string> pending;
};

}  // namespace

void run_generation(GenerationService& service, Metrics& metrics, const std::shared_ptr<HttpExchange>& ex,
                    GenerationRequest gen, std::unique_ptr<ResponseShaper> shaper, bool stream) {
  auto link = std::make_shared<GenerationLink>(std::move(shaper), ex, metrics, stream);
  uint64_t gen_id = 0;
  try {
    gen_id = service.submit(std::move(gen), [link](GenerationEvent&& ev) { link->on_event(std::move(ev)); });
  } catch (const QueueFullError& e) {
    ApiError err(429, e.what(), "rate_limit_error", "", "rate_limit_exceeded", "queue_full");
    err.headers.emplace_back("Retry-After", std::to_string(std::max(1, e.retry_after_s)));
    throw err;
  } catch (const UnavailableError& e) {
    ApiError err(503, e.what(), "server_error", "", "service_unavailable", "unavailable");
    err.headers.emplace_back("Retry-After", "1");
    throw err;
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "", "invalid_value", "bad_request");
  }
  if (stream) link->send_head();
  ex->on_abort([&service, gen_id] { service.cancel(gen_id); });
}

}  // namespace baton
