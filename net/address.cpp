#include "net/address.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <stdexcept>

namespace baton::net {

namespace {

std::string unbracket(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

}  // namespace

std::pair<std::string, uint16_t> split_host_port(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw std::invalid_argument("expected HOST:PORT, got '" + text + "'");
  }
  const std::string host = text.substr(0, colon);
  const bool bracketed = host.front() == '[';
  if (bracketed ? host.size() < 3 || host.back() != ']' : host.find_first_of(":[]") != std::string::npos) {
    throw std::invalid_argument("bad host in '" + text + "' (an IPv6 address goes in brackets: [::1]:7071)");
  }
  const std::string port_text = text.substr(colon + 1);
  size_t used = 0;
  unsigned long port = 0;
  try {
    port = std::stoul(port_text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != port_text.size() || port > 65535) throw std::invalid_argument("bad port in '" + text + "'");
  return {unbracket(host), uint16_t(port)};
}

std::string join_host_port(const std::string& host, uint16_t port) {
  const std::string h = unbracket(host);
  return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(port);
}

boost::asio::ip::address resolve_host(const std::string& text) {
  namespace asio = boost::asio;
  const std::string host = unbracket(text);
  boost::system::error_code ec;
  const asio::ip::address literal = asio::ip::make_address(host, ec);
  if (!ec) return literal;
  if (host.empty()) throw std::runtime_error("cannot resolve an empty host name");
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  const auto results = resolver.resolve(host, "", ec);
  if (ec || results.empty()) {
    throw std::runtime_error("cannot resolve host '" + host + "': " + (ec ? ec.message() : "no address"));
  }
  for (const auto& r : results) {
    if (r.endpoint().address().is_v4()) return r.endpoint().address();
  }
  return results.begin()->endpoint().address();
}

}  // namespace baton::net
