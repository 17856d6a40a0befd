#include "net/address.h"

#include <stdexcept>

namespace baton::net {

std::pair<std::string, uint16_t> split_host_port(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw std::invalid_argument("expected HOST:PORT, got '" + text + "'");
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
  return {text.substr(0, colon), uint16_t(port)};
}

}  // namespace baton::net
