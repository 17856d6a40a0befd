// Cross-origin requests from web pages (baton serve --cors ORIGINS): browsers
// let a page on another origin call the API only when the answers say so.
// A preflight (OPTIONS) is answered 204 with the methods and headers the API
// takes, before authentication (browsers send no credentials with it); every
// other answer of an allowed origin carries Access-Control-Allow-Origin.
// Without a policy nothing changes: no CORS headers, and OPTIONS is an
// unknown method like any other.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/api/http_server.h"

namespace baton {

struct CorsPolicy {
  bool any = false;                  // "*": every origin
  std::vector<std::string> origins;  // exact origins, lower case: "https://app.example.com:8443"
  bool enabled() const { return any || !origins.empty(); }
};

// "*" or a comma list of origins (scheme://host[:port], http or https).
// Throws std::invalid_argument naming a malformed entry.
CorsPolicy parse_cors_origins(std::string_view list);

// The headers of an answer to a request from `origin` (the request's Origin
// header; none from clients that are not browsers): empty when the policy
// does not allow it. `preflight` adds the allowed methods and headers
// (`request_headers`: the preflight's Access-Control-Request-Headers, which
// are allowed too, so that clients' own headers pass).
HttpHeaders cors_headers(const CorsPolicy& policy, std::optional<std::string_view> origin, bool preflight,
                         std::optional<std::string_view> request_headers = std::nullopt);

// The headers a preflight always allows: those the OpenAI and Anthropic
// clients send.
inline constexpr const char* kCorsAllowedHeaders =
    "authorization, x-api-key, anthropic-version, anthropic-beta, content-type";

// Wraps a handler with a policy: OPTIONS requests are answered here (204),
// and the handler's answers carry the policy's headers.
HttpHandler with_cors(CorsPolicy policy, HttpHandler inner);

}  // namespace baton
