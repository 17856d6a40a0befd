// Framing and serialization: the one place that turns messages into bytes and
// bytes into messages. A frame is
//
//   [u32 LE length][u16 LE type][payload: `length` bytes]
//
// and the payload is a cereal PortableBinary archive written little-endian
// (its first byte is cereal's endianness marker, always 1). The length is
// checked against the receiver's limit from the header alone, before any
// buffer is allocated. Decoding never throws: every failure is an error code
// (net/errors.h) with an optional detail text for the log.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "net/errors.h"
#include "net/protocol.h"

namespace baton::net {

inline constexpr size_t kFrameHeaderBytes = 6;
inline constexpr uint32_t kDefaultMaxPayload = 64u << 20;    // authenticated links (activations)
inline constexpr uint32_t kHandshakeMaxPayload = 64u << 10;  // before authentication

struct FrameHeader {
  uint32_t length = 0;  // payload bytes after the 6-byte header
  MsgType type{};
};

class Codec {
 public:
  // The whole frame, header included. Throws std::invalid_argument when the
  // message fails validate() (a bug of the sender: nothing invalid is ever
  // put on the wire) and std::length_error past 4 GiB.
  static std::vector<uint8_t> encode(const Message& m);

  // Reads a frame header (header.size() must be kFrameHeaderBytes).
  // frame_too_large when length > max_payload, unknown_message_type when the
  // type is not a known MsgType. Allocates nothing.
  static std::error_code parse_header(std::span<const uint8_t> header, uint32_t max_payload, FrameHeader& out,
                                      std::string* detail = nullptr) noexcept;

  // Decodes and validates one payload of the given type. Every element count
  // is checked against the bytes left in the payload before anything is
  // allocated, so a decode allocates at most a few times payload.size().
  static std::error_code decode(MsgType type, std::span<const uint8_t> payload, Message& out,
                                std::string* detail = nullptr) noexcept;

  // The value checks decode() applies after reading (enum ranges, sizes
  // that must agree, finite floats, string limits).
  static std::error_code validate(const Message& m, std::string* detail = nullptr) noexcept;
};

// Incremental decoder over a byte stream (blocking sockets, tests, fuzzing).
// The header is checked as soon as its 6 bytes are in; the first error is
// sticky.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_payload = kDefaultMaxPayload) : max_payload_(max_payload) {}

  void set_max_payload(uint32_t max_payload) { max_payload_ = max_payload; }
  void feed(std::span<const uint8_t> bytes);

  // true: `out` holds the next message. false with !ec: more bytes needed.
  // false with ec: the stream is bad (detail() says why).
  bool next(Message& out, std::error_code& ec);
  // Call at end of stream: truncated_frame when a partial frame is buffered.
  std::error_code finish() const;

  // Payload bytes of the last message next() returned (handshake transcripts).
  std::span<const uint8_t> last_payload() const { return last_payload_; }
  const std::string& detail() const { return detail_; }
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  uint32_t max_payload_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;  // start of the next unread frame in buf_
  std::vector<uint8_t> last_payload_;
  std::error_code error_;
  std::string detail_;
};

}  // namespace baton::net
