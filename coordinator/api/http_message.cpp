// Turning Beast's requests into HttpRequests, and the heads of responses: the
// HTTP text the server writes itself.
#include "coordinator/api/http_request_from_beast.h"

#include <fmt/format.h>

#include <cctype>

namespace baton {

namespace http = boost::beast::http;

const char* http_reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case kStatusClientGone: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Header names and values come from our own code, but a CR or LF in one would
// split the response: drop such headers rather than trust every caller.
bool header_safe(std::string_view s) { return s.find_first_of("\r\n") == std::string_view::npos; }

}  // namespace

std::string http_response_head(int status, const std::string& content_type, const HttpHeaders& headers, bool keep_alive) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\n", status, http_reason(status));
  if (!content_type.empty() && header_safe(content_type)) h += "Content-Type: " + content_type + "\r\n";
  for (const auto& [k, v] : headers) {
    if (header_safe(k) && header_safe(v)) h += k + ": " + v + "\r\n";
  }
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return h;
}

HttpRequest http_request_from(http::request<http::string_body>&& msg, std::string remote) {
  HttpRequest req;
  auto method = msg.method_string();
  auto target = msg.target();
  req.method.assign(method.data(), method.size());
  req.target.assign(target.data(), target.size());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& f : msg) {
    auto name = f.name_string();
    auto value = f.value();
    req.headers.emplace_back(lower(std::string_view(name.data(), name.size())), std::string(value.data(), value.size()));
  }
  req.body = std::move(msg.body());
  req.remote = std::move(remote);
  return req;
}

}  // namespace baton
