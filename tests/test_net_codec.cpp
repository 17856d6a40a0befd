// Framing and serialization: every message round-trips, re-encoding is
// byte-identical, and hostile bytes (oversized lengths, huge element counts,
// truncation, unknown types, bad bools, bad enums) become error codes without
// large allocations.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "net/codec.h"
#include "net/protocol.h"
#include "tests/test_util.h"

// Records the largest single allocation while tracking is on, so that tests
// can assert that hostile lengths were refused before anything was sized.
namespace {
std::atomic<bool> g_track{false};
std::atomic<size_t> g_largest{0};
}  // namespace

// GCC pairs the inlined free() with the new-expressions of callers and warns
// of a mismatch that is not one: these two functions are the matching pair.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(size_t n) {
  if (g_track.load(std::memory_order_relaxed)) {
    size_t cur = g_largest.load(std::memory_order_relaxed);
    while (n > cur && !g_largest.compare_exchange_weak(cur, n)) {
    }
  }
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace baton::net {
namespace {

struct AllocTracker {
  AllocTracker() {
    g_largest = 0;
    g_track = true;
  }
  ~AllocTracker() { g_track = false; }
  size_t largest() const { return g_largest.load(); }
};

// Seeded generator of valid messages of every type.
struct Gen {
  explicit Gen(uint64_t seed) : rng(seed) {}
  std::mt19937_64 rng;

  uint64_t u64() { return rng(); }
  uint32_t u32() { return uint32_t(rng()); }
  uint32_t below(uint32_t n) { return uint32_t(rng() % n); }
  int32_t i32() { return int32_t(uint32_t(rng())); }
  bool flag() { return rng() & 1; }
  float real(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
  std::string text(size_t max) {
    std::string s(below(uint32_t(max) + 1), '\0');
    for (char& c : s) c = char(rng());  // any byte: strings are bytes on the wire
    return s;
  }
  Nonce nonce() {
    Nonce n;
    for (uint8_t& b : n) b = uint8_t(rng());
    return n;
  }
  SamplingParams sampling() {
    SamplingParams s;
    s.temperature = real(0, 2);
    s.top_k = i32();
    s.top_p = real(0, 1);
    s.min_p = real(0, 1);
    s.seed = u64();
    s.want_logprobs = flag();
    s.top_logprobs = below(kMaxTopLogprobs + 1);
    for (uint32_t i = below(3); i > 0; --i) s.logit_bias.push_back({int32_t(below(1 << 20)), real(-100, 100)});
    for (uint32_t i = below(3); i > 0; --i) s.allowed.push_back(u64());
    s.repeat_penalty = real(0.5, 2);
    s.repeat_last_n = int32_t(below(kMaxRepeatLastN + 1));
    s.presence_penalty = real(-2, 2);
    s.frequency_penalty = real(-2, 2);
    s.min_tokens = int32_t(below(1000));
    for (uint32_t i = below(4); i > 0; --i) s.prompt_tail.push_back(int32_t(below(1 << 20)));
    for (uint32_t i = below(3); i > 0; --i) s.end_tokens.push_back(int32_t(below(1 << 20)));
    return s;
  }

  Message make(MsgType t) {
    switch (t) {
      case MsgType::hello: {
        Hello h;
        h.protocol_version = u32();
        h.role = Role(1 + below(3));
        h.node_name = text(40);
        h.caps.backend = Backend(1 + below(2));
        h.caps.device_name = text(40);
        h.caps.memory_total = u64();
        h.caps.memory_free = u64();
        h.caps.unified_memory = flag();
        h.caps.bandwidth_gbps = real(0, 5000);
        h.caps.nccl = flag();
        h.caps.n_threads = u32();
        h.caps.nccl_version = u32();
        h.caps.device_uuid = text(40);
        h.caps.pci_bus_id = text(12);
        h.caps.host_id = text(50);
        h.caps.nccl_net = flag();
        h.model.tensor_table_hash = u64();
        for (uint32_t i = below(5); i > 0; --i) {
          ModelPart p;
          p.tensor_table_hash = u64();
          p.layer_first = int32_t(below(100));
          p.layer_last = p.layer_first + int32_t(below(100));
          p.has_embedding = flag();
          p.has_output = flag();
          p.tp_size = 1 + below(8);
          p.tp_rank = below(p.tp_size);
          h.model.parts.push_back(p);
        }
        h.listen_address = text(30);
        h.nonce = nonce();
        h.mesh_address = text(30);
        return h;
      }
      case MsgType::challenge:
        return Challenge{u32(), Role(1 + below(3)), text(40), nonce()};
      case MsgType::auth_response:
        return AuthResponse{nonce()};
      case MsgType::auth_ok:
        return AuthOk{nonce()};
      case MsgType::assign: {
        Assign a;
        a.n_stages = 1 + below(16);
        a.stage_index = below(a.n_stages);
        a.layer_first = int32_t(below(60));
        a.layer_last = a.layer_first + int32_t(below(60));
        a.has_embedding = flag();
        a.has_output = flag();
        a.n_ctx = u32();
        a.micro_batch = u32();
        a.prefill_chunk = u32();
        a.n_seq = 1 + below(64);
        a.next_peer = text(30);
        a.model_path = text(80);
        a.model_hash = u64();
        a.next_link = LinkKind(1 + below(2));
        if (flag()) {
          a.tp_size = 2 + below(7);
          a.tp_rank = below(a.tp_size);
          for (uint32_t r = 0; r < a.tp_size; ++r) {
            a.tp_mesh.push_back(text(30));
            a.tp_peers.push_back(text(30));
          }
        }
        return a;
      }
      case MsgType::ready:
        return Ready{u64(), u64(), u64(), double(real(0, 100)), u32()};
      case MsgType::load_progress: {
        LoadProgress p;
        p.bytes_total = u64();
        p.bytes_done = p.bytes_total ? u64() % p.bytes_total : 0;
        return p;
      }
      case MsgType::forward: {
        Forward f;
        f.request_id = u64();
        for (uint32_t i = 1 + below(4); i > 0; --i) {
          SeqChunk c;
          c.seq = u32();
          c.start_pos = below(1 << 20);
          c.n_tokens = 1 + below(8);
          c.sample = flag();
          c.sampling = sampling();
          c.begins = flag();  // v5
          f.chunks.push_back(c);
        }
        const uint32_t form = below(3);
        if (form == 0) {
          for (uint64_t i = 0; i < f.total_tokens(); ++i) f.tokens.push_back(i32());
        } else if (form == 1) {
          f.row_width = 1 + below(8192);
          f.rows_on_link = true;
        } else {
          f.row_width = 1 + below(16);
          std::vector<float> rows(f.total_tokens() * f.row_width);
          for (float& x : rows) x = real(-4, 4);
          f.activations.resize(rows.size() * 4);
          std::memcpy(f.activations.data(), rows.data(), f.activations.size());
        }
        return f;
      }
      case MsgType::result: {
        Result r;
        r.request_id = u64();
        r.seq = u32();
        const uint32_t n = 1 + below(4);
        for (uint32_t i = 0; i < n; ++i) r.tokens.push_back(i32());
        if (flag()) {
          for (uint32_t i = 0; i < n; ++i) r.logprobs.push_back(real(-30, 0));
        }
        if (flag()) {
          r.top.resize(n);
          for (auto& list : r.top) {
            for (uint32_t k = below(4); k > 0; --k) list.push_back({i32(), real(-30, 0)});
          }
        }
        return r;
      }
      case MsgType::cancel:
        return Cancel{u32()};
      case MsgType::free_seq:
        return FreeSeq{u32()};
      case MsgType::heartbeat:
        return Heartbeat{u64(), u64()};
      case MsgType::heartbeat_echo:
        return HeartbeatEcho{u64(), u64()};
      case MsgType::error:
        return Error{u32(), u64(), text(100)};
      case MsgType::shutdown:
        return Shutdown{text(100)};
      case MsgType::route:
        return Route{text(40), LinkKind(1 + below(2))};
      case MsgType::link_setup: {
        LinkSetup s;
        if (flag()) {
          s.kind = LinkKind::nccl;
          for (size_t i = 0; i < kNcclIdBytes; ++i) s.nccl_id.push_back(uint8_t(u32()));
          s.max_floats = 1 + u64() % (uint64_t(1) << 24);
        }
        return s;
      }
      case MsgType::link_ack:
        return LinkAck{LinkKind(1 + below(2)), text(100)};
      case MsgType::link_status:
        return LinkStatus{text(30), LinkKind(1 + below(2)), text(100), below(2) == 1};
    }
    ADD_FAILURE() << "no generator for type " << int(t);
    return Cancel{};
  }
};

std::vector<uint8_t> payload_of(const std::vector<uint8_t>& frame) {
  return {frame.begin() + kFrameHeaderBytes, frame.end()};
}

std::error_code decode_payload(MsgType t, const std::vector<uint8_t>& payload, Message* out = nullptr) {
  Message m;
  std::string detail;
  std::error_code ec = Codec::decode(t, payload, m, &detail);
  if (out) *out = std::move(m);
  return ec;
}

void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.at(at + i) = uint8_t(v >> (8 * i));
}

TEST(NetCodec, EveryMessageTypeRoundTripsAndReencodesIdentically) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Gen g(seed);
  for (uint16_t t = kFirstMsgType; t <= kLastMsgType; ++t) {
    SCOPED_TRACE(std::string(msg_type_name(MsgType(t))));
    for (int rep = 0; rep < 40; ++rep) {
      const Message m = g.make(MsgType(t));
      ASSERT_EQ(message_type(m), MsgType(t));
      const std::vector<uint8_t> frame = Codec::encode(m);
      FrameHeader h;
      ASSERT_FALSE(Codec::parse_header(std::span(frame).first(kFrameHeaderBytes), kDefaultMaxPayload, h));
      EXPECT_EQ(h.type, MsgType(t));
      ASSERT_EQ(h.length, frame.size() - kFrameHeaderBytes);
      Message back;
      std::string detail;
      ASSERT_FALSE(Codec::decode(h.type, std::span(frame).subspan(kFrameHeaderBytes), back, &detail)) << detail;
      EXPECT_TRUE(back == m);
      EXPECT_EQ(Codec::encode(back), frame);
    }
  }
}

TEST(NetCodec, FrameLayoutIsLittleEndianLengthTypePayload) {
  const std::vector<uint8_t> f = Codec::encode(Cancel{0x01020304});
  // length 5 = endianness marker + u32; type 10 (CANCEL); marker 1; seq LE.
  const std::vector<uint8_t> want = {5, 0, 0, 0, 10, 0, 1, 4, 3, 2, 1};
  EXPECT_EQ(f, want);
  EXPECT_EQ(msg_type_name(MsgType::cancel), "CANCEL");
  EXPECT_EQ(msg_type_name(MsgType(99)), "UNKNOWN");
}

TEST(NetCodec, OversizedLengthIsRejectedFromTheHeaderAlone) {
  AllocTracker track;
  for (uint32_t len : {kHandshakeMaxPayload + 1, 0x7fffffffu, 0xffffffffu}) {
    FrameDecoder d(kHandshakeMaxPayload);
    const uint8_t header[6] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24), 1, 0};
    d.feed(header);
    Message m;
    std::error_code ec;
    EXPECT_FALSE(d.next(m, ec));
    EXPECT_EQ(ec, Errc::frame_too_large) << len;
    EXPECT_NE(d.detail().find("exceeds the limit"), std::string::npos);
    // The error is sticky: more bytes do not revive the stream.
    d.feed(header);
    EXPECT_FALSE(d.next(m, ec));
    EXPECT_EQ(ec, Errc::frame_too_large);
  }
  EXPECT_LT(track.largest(), size_t(1) << 16) << "an oversized length caused an allocation";

  // Exactly at the limit is a frame still being received, not an error.
  FrameDecoder d(kHandshakeMaxPayload);
  const uint32_t len = kHandshakeMaxPayload;
  const uint8_t header[6] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24), 1, 0};
  d.feed(header);
  Message m;
  std::error_code ec;
  EXPECT_FALSE(d.next(m, ec));
  EXPECT_FALSE(ec);
}

TEST(NetCodec, AllocationTrackerSeesRealBuffers) {
  // Control for the "no large allocation" checks: a genuine 1 MiB payload is seen.
  Forward f;
  f.chunks.push_back(SeqChunk{0, 0, 1, false, {}});
  f.row_width = 1 << 18;
  f.activations.assign(size_t(1) << 20, 0x5a);
  const std::vector<uint8_t> p = payload_of(Codec::encode(f));
  AllocTracker track;
  Message m;
  ASSERT_FALSE(Codec::decode(MsgType::forward, p, m));
  EXPECT_GE(track.largest(), size_t(1) << 20);
}

TEST(NetCodec, UnknownMessageTypesAreRejected) {
  for (uint16_t t : {uint16_t(0), uint16_t(kLastMsgType + 1), uint16_t(0xffff)}) {
    const uint8_t header[6] = {2, 0, 0, 0, uint8_t(t), uint8_t(t >> 8)};
    FrameHeader h;
    EXPECT_EQ(Codec::parse_header(header, kDefaultMaxPayload, h), Errc::unknown_message_type) << t;
    EXPECT_EQ(decode_payload(MsgType(t), {1, 0}), Errc::unknown_message_type);
  }
}

TEST(NetCodec, EveryTruncationOfEveryPayloadFails) {
  const uint64_t seed = test::test_seed() + 1;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Gen g(seed);
  for (uint16_t t = kFirstMsgType; t <= kLastMsgType; ++t) {
    const std::vector<uint8_t> payload = payload_of(Codec::encode(g.make(MsgType(t))));
    for (size_t cut = 0; cut < payload.size(); ++cut) {
      const std::vector<uint8_t> part(payload.begin(), payload.begin() + std::ptrdiff_t(cut));
      const std::error_code ec = decode_payload(MsgType(t), part);
      EXPECT_EQ(ec, Errc::malformed_payload) << msg_type_name(MsgType(t)) << " cut at " << cut;
    }
  }
}

TEST(NetCodec, TrailingBytesAreRejected) {
  std::vector<uint8_t> p = payload_of(Codec::encode(FreeSeq{7}));
  p.push_back(0);
  EXPECT_EQ(decode_payload(MsgType::free_seq, p), Errc::trailing_bytes);
}

TEST(NetCodec, HugeElementCountsFailBeforeAnyAllocation) {
  // HELLO: marker, version, role, then node_name's u64 length.
  std::vector<uint8_t> hello = payload_of(Codec::encode(Hello{}));
  // FORWARD: marker, request_id, then the chunk count.
  Forward f;
  f.chunks.push_back(SeqChunk{1, 0, 1, false, {}});
  f.tokens = {5};
  std::vector<uint8_t> fwd = payload_of(Codec::encode(f));
  AllocTracker track;
  for (uint64_t n : {uint64_t(1) << 62, uint64_t(1) << 40, uint64_t(1) << 20, uint64_t(~0ull)}) {
    std::vector<uint8_t> h = hello;
    put_u64(h, 6, n);
    EXPECT_EQ(decode_payload(MsgType::hello, h), Errc::malformed_payload) << n;
    std::vector<uint8_t> w = fwd;
    put_u64(w, 9, n);
    EXPECT_EQ(decode_payload(MsgType::forward, w), Errc::malformed_payload) << n;
  }
  EXPECT_LT(track.largest(), size_t(1) << 16) << "a claimed count was allocated before it was checked";
}

// v7: a tensor-parallel ASSIGN names every rank's mesh and listen address,
// and a rank below the group's size; anything else is refused at decode.
TEST(NetCodec, TensorParallelAssignMustNameEveryRank) {
  std::string why;
  Assign a;
  a.tp_size = 2;
  a.tp_rank = 1;
  a.tp_mesh = {"127.0.0.1:1", "127.0.0.1:2"};
  a.tp_peers = {"127.0.0.1:3", "127.0.0.1:4"};
  EXPECT_FALSE(decode_payload(MsgType::assign, payload_of(Codec::encode(a))));
  Assign b = a;
  b.tp_mesh.pop_back();
  EXPECT_EQ(Codec::validate(b, &why), Errc::invalid_field);
  b = a;
  b.tp_rank = 2;
  EXPECT_EQ(Codec::validate(b, &why), Errc::invalid_field);
  b = a;
  b.tp_size = 1;  // a group of one names nobody
  b.tp_rank = 0;
  EXPECT_EQ(Codec::validate(b, &why), Errc::invalid_field);
  b = a;
  b.tp_size = kMaxGroupRanks + 1;
  EXPECT_EQ(Codec::validate(b, &why), Errc::invalid_field);
  Hello h;
  h.model.parts.push_back(ModelPart{});
  h.model.parts[0].tp_size = 2;
  h.model.parts[0].tp_rank = 2;
  EXPECT_EQ(Codec::validate(h, &why), Errc::invalid_field);
  EXPECT_NE(why.find("tp_rank"), std::string::npos) << why;
}

TEST(NetCodec, NonCanonicalValuesAreRejected) {
  Assign a;
  a.layer_last = 3;
  const std::vector<uint8_t> good = payload_of(Codec::encode(a));
  ASSERT_FALSE(decode_payload(MsgType::assign, good));

  std::vector<uint8_t> p = good;
  p[17] = 2;  // has_embedding: a bool byte must be 0 or 1
  EXPECT_EQ(decode_payload(MsgType::assign, p), Errc::malformed_payload);

  p = good;
  p[0] = 0;  // cereal's big-endian marker: the protocol is little-endian only
  EXPECT_EQ(decode_payload(MsgType::assign, p), Errc::malformed_payload);
  EXPECT_EQ(decode_payload(MsgType::assign, {}), Errc::malformed_payload);

  p = good;
  p[13] = 0xff;  // layer_last = -...: an inverted range decodes but is invalid
  p[14] = p[15] = p[16] = 0xff;
  EXPECT_EQ(decode_payload(MsgType::assign, p), Errc::invalid_field);

  std::vector<uint8_t> h = payload_of(Codec::encode(Hello{}));
  h[5] = 9;  // role
  EXPECT_EQ(decode_payload(MsgType::hello, h), Errc::invalid_field);
}

TEST(NetCodec, InconsistentForwardIsRefusedOnBothSides) {
  Forward f;
  f.chunks.push_back(SeqChunk{1, 0, 3, false, {}});
  f.tokens = {1, 2, 3};
  const std::vector<uint8_t> good = payload_of(Codec::encode(f));

  f.tokens.pop_back();  // 2 ids for 3 tokens
  EXPECT_THROW(Codec::encode(f), std::invalid_argument);
  std::string why;
  EXPECT_EQ(Codec::validate(f, &why), Errc::invalid_field);
  EXPECT_NE(why.find("2 token ids for 3 tokens"), std::string::npos) << why;

  // Same mismatch arriving from a peer: n_tokens patched from 3 to 4.
  std::vector<uint8_t> p = good;
  // marker(1) request_id(8) count(8) seq(4) start_pos(4) -> n_tokens at 25
  ASSERT_EQ(p[25], 3);
  p[25] = 4;
  EXPECT_EQ(decode_payload(MsgType::forward, p), Errc::invalid_field);

  Forward act;
  act.chunks.push_back(SeqChunk{1, 0, 2, false, {}});
  act.row_width = 4;
  act.activations.resize(2 * 4 * 4 - 1);
  EXPECT_EQ(Codec::validate(act), Errc::invalid_field);
  act.activations.resize(2 * 4 * 4);
  EXPECT_FALSE(Codec::validate(act));
  act.tokens = {1, 2};
  EXPECT_EQ(Codec::validate(act), Errc::invalid_field);  // both kinds of input

  SamplingParams nan_temp;
  nan_temp.temperature = std::numeric_limits<float>::quiet_NaN();
  Forward s;
  s.chunks.push_back(SeqChunk{1, 0, 1, true, nan_temp});
  s.tokens = {1};
  EXPECT_EQ(Codec::validate(s), Errc::invalid_field);

  SamplingParams huge_mask;
  huge_mask.allowed.resize(kMaxAllowedWords + 1);
  Forward m;
  m.chunks.push_back(SeqChunk{1, 0, 1, true, huge_mask});
  m.tokens = {1};
  EXPECT_EQ(Codec::validate(m), Errc::invalid_field);
  m.chunks[0].sampling.allowed.resize(kMaxAllowedWords);
  EXPECT_FALSE(Codec::validate(m));

  // v7: the penalties are finite, the repetition penalty positive, the lists bounded.
  auto refused = [](auto change) {
    SamplingParams p;
    change(p);
    Forward f;
    f.chunks.push_back(SeqChunk{1, 0, 1, true, p});
    f.tokens = {1};
    return Codec::validate(f) == Errc::invalid_field;
  };
  EXPECT_TRUE(refused([](SamplingParams& p) { p.repeat_penalty = 0; }));
  EXPECT_TRUE(refused([](SamplingParams& p) { p.presence_penalty = std::numeric_limits<float>::infinity(); }));
  EXPECT_TRUE(refused([](SamplingParams& p) { p.frequency_penalty = std::numeric_limits<float>::quiet_NaN(); }));
  EXPECT_TRUE(refused([](SamplingParams& p) { p.repeat_last_n = -1; }));
  EXPECT_TRUE(refused([](SamplingParams& p) { p.min_tokens = -1; }));
  EXPECT_TRUE(refused([](SamplingParams& p) { p.prompt_tail.resize(kMaxRepeatLastN + 1); }));
  EXPECT_TRUE(refused([](SamplingParams& p) { p.end_tokens.resize(kMaxEndTokens + 1); }));
  EXPECT_FALSE(refused([](SamplingParams& p) {
    p.repeat_penalty = 1.3f;
    p.prompt_tail.resize(kMaxRepeatLastN);
    p.end_tokens.resize(kMaxEndTokens);
  }));
}

TEST(NetCodec, LargeActivationPayloadRoundTripsThroughTheStreamDecoder) {
  const uint64_t seed = test::test_seed() + 2;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Forward f;
  f.request_id = rng();
  f.chunks.push_back(SeqChunk{3, 100, 512, true, {}});
  f.row_width = 4096;  // 512 x 4096 x 4 bytes = 8 MiB
  std::vector<float> rows(512 * 4096);
  std::normal_distribution<float> nd;
  for (float& x : rows) x = nd(rng);
  f.activations.resize(rows.size() * 4);
  std::memcpy(f.activations.data(), rows.data(), f.activations.size());

  const std::vector<uint8_t> frame = Codec::encode(f);
  FrameDecoder d;
  Message out;
  std::error_code ec;
  size_t at = 0;
  bool got = false;
  while (at < frame.size()) {
    const size_t n = std::min<size_t>(frame.size() - at, 1 + rng() % (1 << 20));
    d.feed(std::span(frame).subspan(at, n));
    at += n;
    got = d.next(out, ec);
    ASSERT_FALSE(ec) << d.detail();
    if (got) break;
  }
  ASSERT_TRUE(got);
  EXPECT_EQ(at, frame.size());
  const Forward& back = std::get<Forward>(out);
  ASSERT_EQ(back.activations.size(), size_t(8) << 20);
  std::vector<float> back_rows(rows.size());
  std::memcpy(back_rows.data(), back.activations.data(), back.activations.size());
  EXPECT_EQ(back_rows, rows);
  EXPECT_TRUE(back == f);
  EXPECT_FALSE(d.finish());
}

TEST(NetCodec, StreamOfFramesInRandomPiecesAndATruncatedTail) {
  const uint64_t seed = test::test_seed() + 3;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Gen g(seed);
  std::vector<Message> sent;
  std::vector<uint8_t> stream;
  for (int i = 0; i < 200; ++i) {
    sent.push_back(g.make(MsgType(kFirstMsgType + g.below(kLastMsgType))));
    const std::vector<uint8_t> f = Codec::encode(sent.back());
    stream.insert(stream.end(), f.begin(), f.end());
  }
  const std::vector<uint8_t> tail = Codec::encode(g.make(MsgType::forward));
  stream.insert(stream.end(), tail.begin(), tail.end() - 3);

  FrameDecoder d;
  std::vector<Message> got;
  size_t at = 0;
  while (at < stream.size()) {
    const size_t n = std::min<size_t>(stream.size() - at, 1 + g.below(97));
    d.feed(std::span(stream).subspan(at, n));
    at += n;
    Message m;
    std::error_code ec;
    while (d.next(m, ec)) got.push_back(std::move(m));
    ASSERT_FALSE(ec) << d.detail();
  }
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_TRUE(got[i] == sent[i]) << i;
  EXPECT_EQ(d.finish(), Errc::truncated_frame);
}

TEST(NetCodec, RandomPayloadsDecodeToErrorsOrValidMessages) {
  const uint64_t seed = test::test_seed() + 4;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Gen g(seed);
  AllocTracker track;
  int valid = 0;
  for (int i = 0; i < 20000; ++i) {
    const MsgType t = MsgType(kFirstMsgType + g.below(kLastMsgType));
    std::vector<uint8_t> p(g.below(300));
    for (uint8_t& b : p) b = uint8_t(g.rng());
    if (!p.empty() && g.flag()) p[0] = 1;
    Message m;
    if (!Codec::decode(t, p, m)) {
      ++valid;
      EXPECT_EQ(payload_of(Codec::encode(m)), p);  // what decodes re-encodes identically
    }
  }
  EXPECT_LT(track.largest(), size_t(1) << 16);
  RecordProperty("valid", valid);
}

TEST(NetCodec, RegistrationCarriesWhatTheLinkChoiceNeeds) {
  // v3: the NCCL capability fields of HELLO survive the codec exactly.
  Hello h;
  h.node_name = "gpu-node-1";
  h.caps.backend = Backend::cuda;
  h.caps.nccl = true;
  h.caps.nccl_version = 22809;
  h.caps.device_uuid = "GPU-3f2a9c10-aaaa-bbbb-cccc-0123456789ab";
  h.caps.pci_bus_id = "0000:1b:00.0";
  h.caps.host_id = "node-a/6c1e6a2d-0000-4000-8000-000000000001";
  h.caps.nccl_net = true;
  h.listen_address = "10.0.0.2:7001";
  Message back;
  ASSERT_FALSE(decode_payload(MsgType::hello, payload_of(Codec::encode(h)), &back));
  const Hello& got = std::get<Hello>(back);
  EXPECT_EQ(got.caps, h.caps);
  EXPECT_EQ(got, h);
}

TEST(NetCodec, LinkNegotiationMessagesAreValidated) {
  std::string why;
  LinkSetup s;
  s.kind = LinkKind::nccl;
  s.nccl_id.assign(kNcclIdBytes - 1, 7);
  s.max_floats = 4096;
  EXPECT_EQ(Codec::validate(s, &why), Errc::invalid_field);
  EXPECT_NE(why.find("128-byte"), std::string::npos) << why;
  s.nccl_id.push_back(7);
  EXPECT_FALSE(Codec::validate(s, &why)) << why;
  s.max_floats = 0;
  EXPECT_EQ(Codec::validate(s, &why), Errc::invalid_field);
  LinkSetup tcp_with_id;
  tcp_with_id.nccl_id.assign(kNcclIdBytes, 1);
  EXPECT_EQ(Codec::validate(tcp_with_id, &why), Errc::invalid_field);
  EXPECT_FALSE(Codec::validate(LinkSetup{}, &why)) << why;

  // A link kind that no version defines: the last byte of ASSIGN and of ROUTE.
  // (v7 put tp_rank, tp_size and two empty lists, 24 bytes, after ASSIGN's.)
  std::vector<uint8_t> a = payload_of(Codec::encode(Assign{}));
  uint8_t& link = a[a.size() - 25];
  ASSERT_EQ(link, uint8_t(LinkKind::tcp));
  link = 3;
  EXPECT_EQ(decode_payload(MsgType::assign, a), Errc::invalid_field);
  std::vector<uint8_t> r = payload_of(Codec::encode(Route{"h:1", LinkKind::nccl}));
  ASSERT_EQ(r.back(), uint8_t(LinkKind::nccl));
  r.back() = 0;
  EXPECT_EQ(decode_payload(MsgType::route, r), Errc::invalid_field);

  // Rows on the NCCL link: the frame carries neither tokens nor rows.
  Forward f;
  f.chunks.push_back(SeqChunk{0, 0, 2, false, {}});
  f.row_width = 16;
  f.rows_on_link = true;
  EXPECT_FALSE(Codec::validate(f, &why)) << why;
  f.activations.assign(2 * 16 * 4, 0);
  EXPECT_EQ(Codec::validate(f, &why), Errc::invalid_field);
  f.activations.clear();
  f.row_width = 0;
  EXPECT_EQ(Codec::validate(f, &why), Errc::invalid_field);
}

}  // namespace
}  // namespace baton::net
