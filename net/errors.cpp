#include "net/errors.h"

namespace baton::net {

namespace {

class NetCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "baton.net"; }
  std::string message(int ev) const override {
    switch (Errc(ev)) {
      case Errc::ok:
        return "ok";
      case Errc::frame_too_large:
        return "frame length exceeds the limit";
      case Errc::unknown_message_type:
        return "unknown message type";
      case Errc::malformed_payload:
        return "malformed payload";
      case Errc::trailing_bytes:
        return "trailing bytes after the payload";
      case Errc::invalid_field:
        return "invalid field value";
      case Errc::truncated_frame:
        return "truncated frame";
      case Errc::version_mismatch:
        return "protocol version mismatch";
      case Errc::auth_failed:
        return "authentication failed";
      case Errc::handshake_timeout:
        return "handshake timed out";
      case Errc::heartbeat_timeout:
        return "peer silent past the heartbeat timeout";
      case Errc::unexpected_message:
        return "unexpected message";
      case Errc::peer_error:
        return "peer reported an error";
      case Errc::peer_closed:
        return "peer closed the connection";
      case Errc::send_queue_full:
        return "send queue over its limit";
      case Errc::closed_locally:
        return "closed locally";
      case Errc::io_error:
        return "socket error";
      case Errc::too_many_handshakes:
        return "too many handshakes in progress";
      case Errc::handler_failed:
        return "message handler failed";
    }
    return "unknown net error";
  }
};

}  // namespace

const std::error_category& net_category() {
  static const NetCategory cat;
  return cat;
}

std::error_code make_error_code(Errc e) { return {int(e), net_category()}; }

}  // namespace baton::net
