// "host:port" addresses as the command line, configs and HELLO carry them,
// and the one place host names are resolved (Boost.Asio's resolver, so the
// system's: /etc/hosts, DNS). Every option and key that takes an address
// (--listen, --coordinator, --host, a config's listen, a worker's advertised
// address) goes through here, so names and IPv6 work the same everywhere.
#pragma once

#include <boost/asio/ip/address.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace baton::net {

// "host:port" or "[v6]:port" -> {host, port}, the host without brackets
// ("[::1]:7071" -> {"::1", 7071}). An unbracketed host with a colon is
// refused (which colon would end it?). Throws std::invalid_argument naming
// the text.
std::pair<std::string, uint16_t> split_host_port(const std::string& text);

// The inverse: "host:port", with brackets around an IPv6 host.
std::string join_host_port(const std::string& host, uint16_t port);

// The address to bind for `host`: an IP literal as it is ("[::1]" too), a
// name through the resolver, its first IPv4 address if it has one (what
// most peers dial first), else its first. Throws std::runtime_error
// "cannot resolve host 'NAME': REASON".
boost::asio::ip::address resolve_host(const std::string& host);

}  // namespace baton::net
