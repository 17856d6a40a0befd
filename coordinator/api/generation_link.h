// One generation's path from the GenerationService to the HTTP response,
// shared by the API routes: each route's ResponseShaper turns the events
// into its JSON (an SSE stream, or one body at the end), and run_generation
// submits the request, maps the service's refusals to ApiErrors and cancels
// the generation when the client leaves.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/api/generation.h"
#include "coordinator/api/http_server.h"

namespace baton {

class Metrics;

// What a route makes of a generation's events. Calls come one at a time.
class ResponseShaper {
 public:
  virtual ~ResponseShaper() = default;
  // Streaming: the SSE text this event produces (in order; the last event's
  // text ends the stream, an error included).
  virtual std::vector<std::string> stream_chunks(const GenerationEvent& ev) = 0;
  // Not streaming: folds the event in; after the final one, body() is the response.
  virtual void add(const GenerationEvent& ev) = 0;
  virtual std::string body() const = 0;
  // The body of a non-streaming generation that failed (500) or was
  // cancelled by the server stopping (503).
  virtual std::string error_body(int status, const std::string& message) const = 0;
};

// A fresh random id: prefix + 24 hex digits.
std::string make_request_id(const char* prefix);

// Submits `gen` to the service; its events go through `shaper` to `ex`, as a
// text/event-stream when `stream`. Throws ApiError when the service refuses
// it: 429 (queue full, with Retry-After), 503 (loading, route incomplete,
// stopping), 400 (a request it cannot run).
void run_generation(GenerationService& service, Metrics& metrics, const std::shared_ptr<HttpExchange>& ex,
                    GenerationRequest gen, std::unique_ptr<ResponseShaper> shaper, bool stream);

}  // namespace baton
