// libFuzzer target for the wire codec: arbitrary bytes through the stream
// frame decoder and straight into the payload decoder. Any outcome other than
// a message or an error code (an exception, a crash, a sanitizer report, a
// large allocation) is a bug, and so is a decoded message that does not
// re-encode to exactly the bytes it came from.
//
// Input: byte 0 picks the mode and the limits, the rest is data.
//   mode 0: a byte stream of frames, fed to FrameDecoder in pieces of
//           (byte0 >> 2) + 1 bytes, with the handshake or the default limit;
//   mode 1: byte 1 is a type code (0..16, so unknown types too), the rest a
//           payload for Codec::decode.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "net/codec.h"

using namespace baton::net;

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// A decoded message must re-encode to the same payload and decode back equal.
void check_canonical(const Message& m, std::span<const uint8_t> payload) {
  const std::vector<uint8_t> again = Codec::encode(m);
  require(again.size() == payload.size() + kFrameHeaderBytes);
  require(std::equal(payload.begin(), payload.end(), again.begin() + kFrameHeaderBytes));
  Message back;
  require(!Codec::decode(message_type(m), std::span(again).subspan(kFrameHeaderBytes), back));
  require(back == m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0] & 1;
  std::span<const uint8_t> rest(data + 1, size - 1);
  if (mode == 0) {
    FrameDecoder d((data[0] & 2) ? kHandshakeMaxPayload : kDefaultMaxPayload);
    const size_t piece = size_t(data[0] >> 2) + 1;
    Message m;
    std::error_code ec;
    while (!rest.empty() && !ec) {
      const size_t n = std::min(piece, rest.size());
      d.feed(rest.first(n));
      rest = rest.subspan(n);
      while (d.next(m, ec)) check_canonical(m, d.last_payload());
    }
    (void)d.finish();
  } else {
    if (rest.empty()) return 0;
    const MsgType type = MsgType(rest[0] % (kLastMsgType + 2));
    Message m;
    if (!Codec::decode(type, rest.subspan(1), m)) check_canonical(m, rest.subspan(1));
  }
  return 0;
}
