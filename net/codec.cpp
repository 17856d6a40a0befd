// Serialization of the protocol messages with cereal's PortableBinary archives.
//
// cereal's own std::vector / std::string loaders resize to whatever count the
// bytes claim, which lets a 10-byte frame ask for exabytes. This file does
// not include cereal/types/vector.hpp or string.hpp; it defines the loaders
// for these two archive types itself, with the same wire format (u64 count,
// then the elements) and a check of the count against the bytes left in the
// payload before the container is sized. bool is read as a byte and refused
// unless 0 or 1 (any other value in a bool object is undefined behaviour).
#include "net/codec.h"

#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/array.hpp>
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <streambuf>
#include <type_traits>
#include <utility>

namespace baton::net {
namespace {

// Read-only stream buffer over a payload; knows how many bytes are left.
class SpanBuf : public std::streambuf {
 public:
  explicit SpanBuf(std::span<const uint8_t> s) {
    // The get area is never written through (no putback into it).
    char* p = const_cast<char*>(reinterpret_cast<const char*>(s.data()));
    setg(p, p, p + s.size());
  }
  size_t remaining() const { return size_t(egptr() - gptr()); }
};

// Stream buffer appending to a byte vector (one insert per cereal write).
class VecBuf : public std::streambuf {
 public:
  explicit VecBuf(std::vector<uint8_t>& v) : v_(v) {}

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    v_.insert(v_.end(), reinterpret_cast<const uint8_t*>(s), reinterpret_cast<const uint8_t*>(s) + n);
    return n;
  }
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof())) v_.push_back(uint8_t(traits_type::to_char_type(c)));
    return traits_type::not_eof(c);
  }

 private:
  std::vector<uint8_t>& v_;
};

struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using OutArchive = cereal::PortableBinaryOutputArchive;
using InArchive = cereal::PortableBinaryInputArchive;

// The input archive plus the payload it reads, so that a loader can ask how
// many bytes are left (cereal hands serialize functions the base archive).
class BoundedInArchive : public InArchive {
 public:
  BoundedInArchive(std::istream& is, const SpanBuf& in) : InArchive(is, Options::LittleEndian()), in_(in) {}
  size_t remaining() const { return in_.remaining(); }

 private:
  const SpanBuf& in_;
};

// Bytes the smallest encoding of T takes: T{} has every container empty,
// and containers are the only variable-size fields.
template <class T>
size_t min_wire_bytes() {
  if constexpr (std::is_arithmetic_v<T>) {
    return sizeof(T);
  } else {
    static const size_t n = [] {
      std::vector<uint8_t> bytes;
      VecBuf buf(bytes);
      std::ostream os(&buf);
      {
        OutArchive ar(os, OutArchive::Options::LittleEndian());
        ar(T{});
      }
      return bytes.size() - 1;  // minus the archive's endianness marker
    }();
    return n == 0 ? 1 : n;
  }
}

void check_count(InArchive& ar, uint64_t count, size_t min_bytes_each) {
  const auto* bounded = dynamic_cast<const BoundedInArchive*>(&ar);
  if (!bounded) throw DecodeError("internal: payload read without a bounded archive");
  if (count > bounded->remaining() / min_bytes_each) {
    throw DecodeError("a count of " + std::to_string(count) + " elements exceeds the " +
                      std::to_string(bounded->remaining()) + " bytes left in the payload");
  }
}

}  // namespace
}  // namespace baton::net

// Found by argument-dependent lookup (the archives live in namespace cereal).
namespace cereal {

inline void CEREAL_SAVE_FUNCTION_NAME(PortableBinaryOutputArchive& ar, const std::string& s) {
  ar(make_size_tag(static_cast<size_type>(s.size())));
  ar(binary_data(s.data(), s.size()));
}

inline void CEREAL_LOAD_FUNCTION_NAME(PortableBinaryInputArchive& ar, std::string& s) {
  size_type n = 0;
  ar(make_size_tag(n));
  baton::net::check_count(ar, n, 1);
  s.resize(size_t(n));
  ar(binary_data(s.data(), size_t(n)));
}

template <class T, class A>
void CEREAL_SAVE_FUNCTION_NAME(PortableBinaryOutputArchive& ar, const std::vector<T, A>& v) {
  static_assert(!std::is_same_v<T, bool>, "std::vector<bool> is not a wire type");
  ar(make_size_tag(static_cast<size_type>(v.size())));
  if constexpr (std::is_arithmetic_v<T>) {
    ar(binary_data(v.data(), v.size() * sizeof(T)));  // one copy; swapped per element on big-endian hosts
  } else {
    for (const T& x : v) ar(x);
  }
}

template <class T, class A>
void CEREAL_LOAD_FUNCTION_NAME(PortableBinaryInputArchive& ar, std::vector<T, A>& v) {
  static_assert(!std::is_same_v<T, bool>, "std::vector<bool> is not a wire type");
  size_type n = 0;
  ar(make_size_tag(n));
  baton::net::check_count(ar, n, baton::net::min_wire_bytes<T>());
  v.resize(size_t(n));
  if constexpr (std::is_arithmetic_v<T>) {
    ar(binary_data(v.data(), size_t(n) * sizeof(T)));
  } else {
    for (T& x : v) ar(x);
  }
}

// Preferred over cereal's arithmetic template (a non-template exact match).
inline void CEREAL_LOAD_FUNCTION_NAME(PortableBinaryInputArchive& ar, bool& b) {
  uint8_t v = 0;
  ar(v);
  if (v > 1) throw baton::net::DecodeError("bool byte " + std::to_string(v) + " is neither 0 nor 1");
  b = v != 0;
}

}  // namespace cereal

namespace baton::net {
namespace {

template <class T, size_t I = 0>
constexpr size_t index_in_message() {
  if constexpr (std::is_same_v<T, std::variant_alternative_t<I, Message>>) {
    return I;
  } else {
    return index_in_message<T, I + 1>();
  }
}
template <class T>
constexpr MsgType type_of() {
  return MsgType(uint16_t(index_in_message<T>() + 1));
}

static_assert(std::variant_size_v<Message> == kLastMsgType);
static_assert(type_of<Hello>() == MsgType::hello);
static_assert(type_of<Challenge>() == MsgType::challenge);
static_assert(type_of<AuthResponse>() == MsgType::auth_response);
static_assert(type_of<AuthOk>() == MsgType::auth_ok);
static_assert(type_of<Assign>() == MsgType::assign);
static_assert(type_of<Ready>() == MsgType::ready);
static_assert(type_of<LoadProgress>() == MsgType::load_progress);
static_assert(type_of<Forward>() == MsgType::forward);
static_assert(type_of<Result>() == MsgType::result);
static_assert(type_of<Cancel>() == MsgType::cancel);
static_assert(type_of<FreeSeq>() == MsgType::free_seq);
static_assert(type_of<Heartbeat>() == MsgType::heartbeat);
static_assert(type_of<HeartbeatEcho>() == MsgType::heartbeat_echo);
static_assert(type_of<Error>() == MsgType::error);
static_assert(type_of<Shutdown>() == MsgType::shutdown);
static_assert(type_of<Route>() == MsgType::route);
static_assert(type_of<LinkSetup>() == MsgType::link_setup);
static_assert(type_of<LinkAck>() == MsgType::link_ack);
static_assert(type_of<LinkStatus>() == MsgType::link_status);

// ---- validation -------------------------------------------------------------

// Collects the first problem found.
struct Check {
  std::string why;
  bool ok() const { return why.empty(); }
  void fail(std::string w) {
    if (why.empty()) why = std::move(w);
  }
  void expect(bool cond, const char* w) {
    if (!cond) fail(w);
  }
  void text(const std::string& s, size_t max, const char* field) {
    if (s.size() > max)
      fail(std::string(field) + " is " + std::to_string(s.size()) + " bytes, over the limit of " + std::to_string(max));
  }
};

bool valid_role(Role r) { return r == Role::coordinator || r == Role::worker || r == Role::peer; }
bool valid_backend(Backend b) { return b == Backend::cpu || b == Backend::cuda; }
bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0; }
bool valid_link(LinkKind k) { return k == LinkKind::tcp || k == LinkKind::nccl; }

void check(const Hello& m, Check& c) {
  c.expect(valid_role(m.role), "HELLO role is not a known Role");
  c.expect(valid_backend(m.caps.backend), "HELLO backend is not a known Backend");
  c.text(m.node_name, kMaxNameBytes, "HELLO node_name");
  c.text(m.caps.device_name, kMaxNameBytes, "HELLO device_name");
  c.text(m.listen_address, kMaxNameBytes, "HELLO listen_address");
  c.text(m.caps.device_uuid, kMaxNameBytes, "HELLO device_uuid");
  c.text(m.caps.pci_bus_id, kMaxNameBytes, "HELLO pci_bus_id");
  c.text(m.caps.host_id, kMaxNameBytes, "HELLO host_id");
  c.expect(finite_nonneg(m.caps.bandwidth_gbps), "HELLO bandwidth_gbps must be finite and >= 0");
  c.expect(m.model.parts.size() <= kMaxModelParts, "HELLO has too many model parts");
  for (const ModelPart& p : m.model.parts) {
    c.expect(p.layer_first >= 0 && p.layer_first <= p.layer_last, "HELLO model part has an empty layer range");
    c.expect(p.tp_size >= 1 && p.tp_size <= kMaxGroupRanks && p.tp_rank < p.tp_size,
             "HELLO model part's tp_rank must be below tp_size (1..kMaxGroupRanks)");
  }
  c.text(m.mesh_address, kMaxNameBytes, "HELLO mesh_address");
}

void check(const Challenge& m, Check& c) {
  c.expect(valid_role(m.role), "CHALLENGE role is not a known Role");
  c.text(m.node_name, kMaxNameBytes, "CHALLENGE node_name");
}

void check(const AuthResponse&, Check&) {}
void check(const AuthOk&, Check&) {}

void check(const Assign& m, Check& c) {
  c.expect(m.n_stages >= 1 && m.stage_index < m.n_stages, "ASSIGN stage_index must be below n_stages");
  c.expect(m.layer_first >= 0 && m.layer_first <= m.layer_last, "ASSIGN layer range is empty or negative");
  c.expect(m.n_seq >= 1, "ASSIGN n_seq must be >= 1");
  c.text(m.next_peer, kMaxNameBytes, "ASSIGN next_peer");
  c.text(m.model_path, kMaxNameBytes, "ASSIGN model_path");
  c.expect(valid_link(m.next_link), "ASSIGN next_link is not a known LinkKind");
  c.expect(m.tp_size >= 1 && m.tp_size <= kMaxGroupRanks && m.tp_rank < m.tp_size,
           "ASSIGN tp_rank must be below tp_size (1..kMaxGroupRanks)");
  c.expect(m.tp_size == 1 ? m.tp_mesh.empty() && m.tp_peers.empty()
                          : m.tp_mesh.size() == m.tp_size && m.tp_peers.size() == m.tp_size,
           "ASSIGN tp_mesh and tp_peers must name every rank (none with tp_size 1)");
  for (const std::string& a : m.tp_mesh) c.text(a, kMaxNameBytes, "ASSIGN tp_mesh");
  for (const std::string& a : m.tp_peers) c.text(a, kMaxNameBytes, "ASSIGN tp_peers");
}

void check(const Ready& m, Check& c) {
  c.expect(finite_nonneg(m.load_seconds), "READY load_seconds must be finite and >= 0");
}

void check(const LoadProgress& m, Check& c) {
  c.expect(m.bytes_done <= m.bytes_total, "LOAD_PROGRESS bytes_done exceeds bytes_total");
}

void check(const Forward& m, Check& c) {
  c.expect(!m.chunks.empty(), "FORWARD has no chunks");
  c.expect(m.chunks.size() <= kMaxChunksPerForward, "FORWARD has too many chunks");
  for (const SeqChunk& k : m.chunks) {
    c.expect(k.n_tokens > 0, "FORWARD chunk has n_tokens 0");
    c.expect(uint64_t(k.start_pos) + k.n_tokens <= UINT32_MAX, "FORWARD chunk runs past position 2^32");
    const SamplingParams& s = k.sampling;
    c.expect(std::isfinite(s.temperature) && std::isfinite(s.top_p) && std::isfinite(s.min_p),
             "FORWARD sampling parameters must be finite");
    c.expect(s.top_logprobs <= kMaxTopLogprobs, "FORWARD top_logprobs over the limit");
    c.expect(s.logit_bias.size() <= kMaxLogitBias, "FORWARD has too many logit biases");
    c.expect(s.allowed.size() <= kMaxAllowedWords, "FORWARD allowed-token mask over the limit");
    for (const LogitBias& b : s.logit_bias) {
      c.expect(b.token >= 0 && std::isfinite(b.bias), "FORWARD logit bias needs a token id >= 0 and a finite bias");
    }
    c.expect(std::isfinite(s.repeat_penalty) && s.repeat_penalty > 0 && std::isfinite(s.presence_penalty) &&
                 std::isfinite(s.frequency_penalty),
             "FORWARD penalties must be finite, the repetition penalty positive");
    c.expect(s.repeat_last_n >= 0 && size_t(s.repeat_last_n) <= kMaxRepeatLastN && s.min_tokens >= 0,
             "FORWARD repeat_last_n or min_tokens out of range");
    c.expect(s.prompt_tail.size() <= kMaxRepeatLastN && s.end_tokens.size() <= kMaxEndTokens,
             "FORWARD penalty token lists over the limit");
  }
  if (!c.ok()) return;
  const uint64_t total = m.total_tokens();  // <= 65536 * 2^32: no overflow
  if (m.rows_on_link) {
    c.expect(m.tokens.empty() && m.activations.empty(), "FORWARD with rows_on_link carries no tokens or activations");
    c.expect(m.row_width > 0, "FORWARD with rows_on_link needs row_width > 0");
  } else if (!m.tokens.empty()) {
    c.expect(m.activations.empty(), "FORWARD carries both tokens and activations");
    c.expect(m.row_width == 0, "FORWARD with tokens must have row_width 0");
    if (m.tokens.size() != total) {
      c.fail("FORWARD has " + std::to_string(m.tokens.size()) + " token ids for " + std::to_string(total) +
             " tokens in its chunks");
    }
  } else {
    c.expect(!m.activations.empty(), "FORWARD carries neither tokens nor activations");
    c.expect(m.row_width > 0, "FORWARD with activations needs row_width > 0");
    // total < 2^48 and row_width * 4 < 2^34: the product needs a wider check.
    const unsigned __int128 want = (unsigned __int128)total * m.row_width * 4;
    if (c.ok() && want != m.activations.size()) {
      c.fail("FORWARD activations hold " + std::to_string(m.activations.size()) + " bytes, expected " +
             std::to_string(total) + " tokens x " + std::to_string(m.row_width) + " floats x 4");
    }
  }
}

void check(const Result& m, Check& c) {
  // v4: no tokens is the acknowledgement of a FORWARD that sampled nothing.
  c.expect(m.logprobs.empty() || m.logprobs.size() == m.tokens.size(),
           "RESULT logprobs must be empty or one per token");
  c.expect(m.top.empty() || m.top.size() == m.tokens.size(), "RESULT top must be empty or one list per token");
  for (float lp : m.logprobs) c.expect(!std::isnan(lp), "RESULT logprob is NaN");
  for (const auto& list : m.top) {
    c.expect(list.size() <= kMaxTopLogprobs, "RESULT top list over the limit");
    for (const TokenLogprob& t : list) c.expect(!std::isnan(t.logprob), "RESULT top logprob is NaN");
  }
}

void check(const Cancel&, Check&) {}
void check(const FreeSeq&, Check&) {}
void check(const Heartbeat&, Check&) {}
void check(const HeartbeatEcho&, Check&) {}

void check(const Error& m, Check& c) { c.text(m.text, kMaxTextBytes, "ERROR text"); }
void check(const Shutdown& m, Check& c) { c.text(m.reason, kMaxTextBytes, "SHUTDOWN reason"); }
void check(const Route& m, Check& c) {
  c.text(m.next_peer, kMaxNameBytes, "ROUTE next_peer");
  c.expect(valid_link(m.link), "ROUTE link is not a known LinkKind");
}
void check(const LinkSetup& m, Check& c) {
  c.expect(valid_link(m.kind), "LINK_SETUP kind is not a known LinkKind");
  if (m.kind == LinkKind::nccl) {
    c.expect(m.nccl_id.size() == kNcclIdBytes, "LINK_SETUP nccl needs a 128-byte unique id");
    c.expect(m.max_floats > 0, "LINK_SETUP nccl needs max_floats > 0");
  } else {
    c.expect(m.nccl_id.empty() && m.max_floats == 0, "LINK_SETUP tcp carries no NCCL id or size");
  }
}
void check(const LinkAck& m, Check& c) {
  c.expect(valid_link(m.kind), "LINK_ACK kind is not a known LinkKind");
  c.text(m.reason, kMaxTextBytes, "LINK_ACK reason");
}
void check(const LinkStatus& m, Check& c) {
  c.expect(valid_link(m.kind), "LINK_STATUS kind is not a known LinkKind");
  c.text(m.next_peer, kMaxNameBytes, "LINK_STATUS next_peer");
  c.text(m.reason, kMaxTextBytes, "LINK_STATUS reason");
}

// ---- decoding ---------------------------------------------------------------

template <class T>
void read_as(InArchive& ar, Message& out) {
  T msg;
  ar(msg);
  out = std::move(msg);
}

using ReadFn = void (*)(InArchive&, Message&);

template <size_t... I>
constexpr std::array<ReadFn, sizeof...(I)> make_readers(std::index_sequence<I...>) {
  return {&read_as<std::variant_alternative_t<I, Message>>...};
}
constexpr auto kReaders = make_readers(std::make_index_sequence<std::variant_size_v<Message>>{});

void set(std::string* detail, std::string s) {
  if (detail) *detail = std::move(s);
}

}  // namespace

std::string_view msg_type_name(MsgType t) {
  static constexpr std::string_view names[] = {"HELLO",    "CHALLENGE",     "AUTH_RESPONSE",  "AUTH_OK", "ASSIGN",
                                               "READY",    "LOAD_PROGRESS", "FORWARD",        "RESULT",  "CANCEL",
                                               "FREE_SEQ", "HEARTBEAT",     "HEARTBEAT_ECHO", "ERROR",   "SHUTDOWN", "ROUTE",
                                               "LINK_SETUP", "LINK_ACK", "LINK_STATUS"};
  static_assert(std::size(names) == kLastMsgType);
  const uint16_t v = uint16_t(t);
  if (v < kFirstMsgType || v > kLastMsgType) return "UNKNOWN";
  return names[v - 1];
}

std::error_code Codec::validate(const Message& m, std::string* detail) noexcept {
  try {
    Check c;
    std::visit([&](const auto& x) { check(x, c); }, m);
    if (c.ok()) return {};
    set(detail, std::move(c.why));
  } catch (...) {  // std::string allocation only
    set(detail, "validation failed");
  }
  return Errc::invalid_field;
}

std::vector<uint8_t> Codec::encode(const Message& m) {
  std::string why;
  if (validate(m, &why))
    throw std::invalid_argument("refusing to send an invalid " + std::string(msg_type_name(message_type(m))) + ": " +
                                why);
  std::vector<uint8_t> frame(kFrameHeaderBytes, 0);
  {
    VecBuf buf(frame);
    std::ostream os(&buf);
    OutArchive ar(os, OutArchive::Options::LittleEndian());
    std::visit([&](const auto& x) { ar(x); }, m);
  }
  const size_t payload = frame.size() - kFrameHeaderBytes;
  if (payload > UINT32_MAX)
    throw std::length_error("message payload of " + std::to_string(payload) + " bytes exceeds 4 GiB");
  const uint32_t len = uint32_t(payload);
  const uint16_t type = uint16_t(message_type(m));
  frame[0] = uint8_t(len);
  frame[1] = uint8_t(len >> 8);
  frame[2] = uint8_t(len >> 16);
  frame[3] = uint8_t(len >> 24);
  frame[4] = uint8_t(type);
  frame[5] = uint8_t(type >> 8);
  return frame;
}

std::error_code Codec::parse_header(std::span<const uint8_t> h, uint32_t max_payload, FrameHeader& out,
                                    std::string* detail) noexcept {
  if (h.size() != kFrameHeaderBytes) {
    set(detail, "frame header must be 6 bytes");
    return Errc::truncated_frame;
  }
  const uint32_t len = uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 | uint32_t(h[3]) << 24;
  const uint16_t type = uint16_t(h[4] | h[5] << 8);
  if (len > max_payload) {
    set(detail, "frame length " + std::to_string(len) + " exceeds the limit of " + std::to_string(max_payload));
    return Errc::frame_too_large;
  }
  if (type < kFirstMsgType || type > kLastMsgType) {
    set(detail, "unknown message type " + std::to_string(type));
    return Errc::unknown_message_type;
  }
  out.length = len;
  out.type = MsgType(type);
  return {};
}

std::error_code Codec::decode(MsgType type, std::span<const uint8_t> payload, Message& out,
                              std::string* detail) noexcept {
  const uint16_t t = uint16_t(type);
  if (t < kFirstMsgType || t > kLastMsgType) {
    set(detail, "unknown message type " + std::to_string(t));
    return Errc::unknown_message_type;
  }
  const std::string_view name = msg_type_name(type);
  // cereal reads the marker and would byte-swap a big-endian payload; the
  // protocol fixes little-endian, so anything else is malformed.
  if (payload.empty() || payload[0] != 1) {
    set(detail, std::string(name) + ": payload must start with the little-endian marker 1");
    return Errc::malformed_payload;
  }
  SpanBuf buf(payload);
  try {
    std::istream is(&buf);
    BoundedInArchive ar(is, buf);
    Message msg;
    kReaders[t - 1](ar, msg);
    if (buf.remaining() != 0) {
      set(detail, std::string(name) + ": " + std::to_string(buf.remaining()) + " bytes left after the message");
      return Errc::trailing_bytes;
    }
    std::string why;
    if (std::error_code ec = validate(msg, &why)) {
      set(detail, std::move(why));
      return ec;
    }
    out = std::move(msg);
    return {};
  } catch (const std::exception& e) {
    try {
      set(detail, std::string(name) + ": " + e.what());
    } catch (...) {
    }
  } catch (...) {
    set(detail, std::string(name) + ": undecodable payload");
  }
  return Errc::malformed_payload;
}

// ---- FrameDecoder -----------------------------------------------------------

void FrameDecoder::feed(std::span<const uint8_t> bytes) {
  if (error_) return;
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {  // compact: keep the buffer about one frame long
    buf_.erase(buf_.begin(), buf_.begin() + std::ptrdiff_t(pos_));
    pos_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

bool FrameDecoder::next(Message& out, std::error_code& ec) {
  ec = error_;
  if (error_) return false;
  const size_t avail = buf_.size() - pos_;
  if (avail < kFrameHeaderBytes) return false;
  FrameHeader h;
  const std::span<const uint8_t> head(buf_.data() + pos_, kFrameHeaderBytes);
  if ((error_ = Codec::parse_header(head, max_payload_, h, &detail_))) {
    ec = error_;
    return false;
  }
  if (avail - kFrameHeaderBytes < h.length) return false;
  const std::span<const uint8_t> payload(buf_.data() + pos_ + kFrameHeaderBytes, h.length);
  if ((error_ = Codec::decode(h.type, payload, out, &detail_))) {
    ec = error_;
    return false;
  }
  last_payload_.assign(payload.begin(), payload.end());
  pos_ += kFrameHeaderBytes + h.length;
  return true;
}

std::error_code FrameDecoder::finish() const {
  if (error_) return error_;
  return buf_.size() == pos_ ? std::error_code{} : make_error_code(Errc::truncated_frame);
}

}  // namespace baton::net
