// The server's HttpRequest from a request Beast parsed, and the head of a
// response. Apart from http_server.h so that only the files that parse HTTP
// themselves (the server and the HTTP fuzz target) include Beast.
#pragma once

// Boost 1.74's Asio needs <utility> before it under C++20.
#include <utility>

// Beast's parser trips GCC's -Wmaybe-uninitialized on a boost::optional
// (a false positive inside Boost); keep our own code's warnings on. Clang has
// no such warning (the HTTP fuzz target builds with it).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <boost/beast/http.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <string>

#include "coordinator/api/http_server.h"

namespace baton {

// Header names in lower case (HTTP's are case-insensitive, the API looks them
// up by lower-case name); `remote` is the client's "ip:port".
HttpRequest http_request_from(boost::beast::http::request<boost::beast::http::string_body>&& msg, std::string remote);

// Status line, Content-Type, the headers and Connection, each line ended by
// CRLF (the caller adds the length or chunking and the blank line). Names or
// values with CR or LF are dropped: they would split the response.
std::string http_response_head(int status, const std::string& content_type, const HttpHeaders& headers,
                               bool keep_alive);

}  // namespace baton
