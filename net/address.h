// "host:port" addresses as the command line, configs and HELLO carry them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace baton::net {

// "host:port" -> {host, port} (the last colon splits, so "[::1]:80" style
// hosts keep theirs); throws std::invalid_argument naming the text.
std::pair<std::string, uint16_t> split_host_port(const std::string& text);

}  // namespace baton::net
