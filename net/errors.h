// Error codes of the net layer. Decoding and link failures are reported as
// std::error_code values of this category at the boundary that detects them
// (the codec, the connection), never as exceptions into the io loop.
#pragma once

#include <string>
#include <system_error>

namespace baton::net {

enum class Errc {
  ok = 0,
  frame_too_large = 1,       // length above the connection's limit (nothing allocated)
  unknown_message_type = 2,  // type code outside the enum
  malformed_payload = 3,     // cereal could not read the payload, or a count exceeds the bytes left
  trailing_bytes = 4,        // the payload decoded with bytes left over
  invalid_field = 5,         // decoded, but a value is out of range or sizes disagree
  truncated_frame = 6,       // the stream ended inside a frame
  version_mismatch = 7,
  auth_failed = 8,
  handshake_timeout = 9,
  heartbeat_timeout = 10,
  unexpected_message = 11,   // a valid message at the wrong time
  peer_error = 12,           // the peer sent ERROR
  peer_closed = 13,          // the peer closed the socket
  send_queue_full = 14,      // the peer reads slower than we send, past the limit
  closed_locally = 15,       // close() was called
  io_error = 16,             // socket error (the reason text says which)
  too_many_handshakes = 17,  // the listener's handshake slots are full
  handler_failed = 18,       // the message handler threw
};

const std::error_category& net_category();
std::error_code make_error_code(Errc e);

}  // namespace baton::net

template <>
struct std::is_error_code_enum<baton::net::Errc> : std::true_type {};
