#include "coordinator/api/cors.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <stdexcept>
#include <utility>

namespace baton {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// scheme://host[:port] with nothing after: what browsers send as Origin.
bool valid_origin(std::string_view o) {
  size_t rest = 0;
  if (o.rfind("http://", 0) == 0) {
    rest = 7;
  } else if (o.rfind("https://", 0) == 0) {
    rest = 8;
  } else {
    return false;
  }
  if (rest == o.size()) return false;
  return std::all_of(o.begin() + long(rest), o.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
  });
}

// A header name as HTTP spells tokens; anything else in a preflight's list is dropped.
bool header_token(std::string_view s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

// The names of a comma list, lower case, without blanks.
std::vector<std::string> split_names(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    out.push_back(lower(trim(list.substr(0, comma))));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return out;
}

// The allowed headers: the fixed ones, then those the preflight asks for (at
// most 32 more, each once).
std::string allowed_headers(std::optional<std::string_view> requested) {
  std::vector<std::string> names = split_names(kCorsAllowedHeaders);
  const size_t limit = names.size() + 32;
  if (requested) {
    for (std::string& name : split_names(*requested)) {
      if (names.size() == limit) break;
      if (header_token(name) && std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(std::move(name));
      }
    }
  }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Forwards everything to the server's exchange, adding the CORS headers to
// the answer.
class CorsExchange final : public HttpExchange {
 public:
  CorsExchange(std::shared_ptr<HttpExchange> inner, HttpHeaders extra)
      : inner_(std::move(inner)), extra_(std::move(extra)) {}

  const HttpRequest& request() const override { return inner_->request(); }
  void respond(int status, std::string content_type, std::string body, HttpHeaders headers) override {
    headers.insert(headers.end(), extra_.begin(), extra_.end());
    inner_->respond(status, std::move(content_type), std::move(body), std::move(headers));
  }
  void begin_stream(int status, std::string content_type, HttpHeaders headers) override {
    headers.insert(headers.end(), extra_.begin(), extra_.end());
    inner_->begin_stream(status, std::move(content_type), std::move(headers));
  }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void end() override { inner_->end(); }
  void on_abort(std::function<void()> callback) override { inner_->on_abort(std::move(callback)); }
  bool aborted() const override { return inner_->aborted(); }

 private:
  std::shared_ptr<HttpExchange> inner_;
  HttpHeaders extra_;
};

}  // namespace

CorsPolicy parse_cors_origins(std::string_view list) {
  CorsPolicy p;
  std::string_view rest = list;
  while (true) {
    const size_t comma = rest.find(',');
    std::string origin = lower(trim(rest.substr(0, comma)));
    while (origin.size() > 1 && origin.back() == '/') origin.pop_back();
    if (origin == "*") {
      p.any = true;
    } else if (!origin.empty()) {
      if (!valid_origin(origin)) {
        throw std::invalid_argument("--cors takes '*' or origins like https://app.example.com:8443; got '" + origin +
                                    "'");
      }
      p.origins.push_back(origin);
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (!p.enabled()) throw std::invalid_argument("--cors needs '*' or at least one origin");
  return p;
}

HttpHeaders cors_headers(const CorsPolicy& policy, std::optional<std::string_view> origin, bool preflight,
                         std::optional<std::string_view> request_headers) {
  HttpHeaders h;
  if (!policy.enabled()) return h;
  if (policy.any) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    // The answer depends on Origin: caches must keep one per origin.
    h.emplace_back("Vary", "Origin");
    const std::string o = origin ? lower(trim(*origin)) : std::string();
    if (std::find(policy.origins.begin(), policy.origins.end(), o) == policy.origins.end()) return h;
    h.emplace_back("Access-Control-Allow-Origin", o);
  }
  if (preflight) {
    h.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    h.emplace_back("Access-Control-Allow-Headers", allowed_headers(request_headers));
    h.emplace_back("Access-Control-Max-Age", "86400");
  } else {
    h.emplace_back("Access-Control-Expose-Headers", "Retry-After");
  }
  return h;
}

HttpHandler with_cors(CorsPolicy policy, HttpHandler inner) {
  return [policy = std::move(policy), inner = std::move(inner)](std::shared_ptr<HttpExchange> ex) {
    const HttpRequest& req = ex->request();
    if (req.method == "OPTIONS") {
      HttpHeaders h = cors_headers(policy, req.header("origin"), true, req.header("access-control-request-headers"));
      h.emplace_back("Allow", "GET, POST, OPTIONS");
      ex->respond(204, "", "", std::move(h));
      return;
    }
    HttpHeaders extra = cors_headers(policy, req.header("origin"), false);
    inner(std::make_shared<CorsExchange>(std::move(ex), std::move(extra)));
  };
}

}  // namespace baton
