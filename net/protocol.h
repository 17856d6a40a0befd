// The messages of Baton's wire protocol (docs/PROTOCOL.md is the reference).
// Every message is a plain struct whose serialize() is its wire layout, field
// by field, in a cereal PortableBinary archive (little-endian). The structs
// use fixed-width types only so that the layout does not depend on the
// platform. Validation of field values (enum ranges, sizes that must agree)
// lives in net/codec.cpp; a decoded message has passed it.
//
// This header includes no cereal or Asio: serialize() is a template that only
// net/codec.cpp instantiates.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace baton::net {

// Bumped on any change of a message's layout or meaning. Peers must speak the
// same version (checked in the handshake, before anything else is trusted).
inline constexpr uint32_t kProtocolVersion = 7;

// Frame type codes. APPEND-ONLY: never renumber, never reuse a retired value;
// a new message takes the next number (and bumps kProtocolVersion).
enum class MsgType : uint16_t {
  // 0 is never sent: a zeroed header is a bug, not a message.
  hello = 1,
  challenge = 2,
  auth_response = 3,
  auth_ok = 4,
  assign = 5,
  ready = 6,
  load_progress = 7,
  forward = 8,
  result = 9,
  cancel = 10,
  free_seq = 11,
  heartbeat = 12,
  heartbeat_echo = 13,
  error = 14,
  shutdown = 15,
  route = 16,  // v2
  link_setup = 17,   // v3
  link_ack = 18,     // v3
  link_status = 19,  // v3
};
inline constexpr uint16_t kFirstMsgType = 1;
inline constexpr uint16_t kLastMsgType = 19;  // keep equal to the last enumerator

std::string_view msg_type_name(MsgType t);  // "HELLO", ...; "UNKNOWN" otherwise

// Append-only like MsgType.
enum class Role : uint8_t { coordinator = 1, worker = 2, peer = 3 };
enum class Backend : uint8_t { cpu = 1, cuda = 2 };
// How a stage's boundary activations reach the next stage (v3): inside the
// FORWARD frame on the TCP peer link, or device to device over NCCL with the
// FORWARD frame still on TCP (it says which sequence and step the rows are).
enum class LinkKind : uint8_t { tcp = 1, nccl = 2 };

inline constexpr size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

using Nonce = std::array<uint8_t, 32>;  // random, one per side per handshake
using Mac = std::array<uint8_t, 32>;    // HMAC-SHA256

// Error codes carried by ERROR. Append-only; a receiver treats a code it does
// not know as `internal`.
enum class WireError : uint32_t {
  internal = 1,
  version_mismatch = 2,
  auth_failed = 3,
  bad_frame = 4,           // malformed, oversized, unknown type, invalid field
  unexpected_message = 5,  // valid message at the wrong time
  model_mismatch = 6,      // model identity differs from what was assigned
  out_of_memory = 7,       // the plan does not fit
  load_failed = 8,
  bad_request = 9,  // FORWARD that the stage cannot run (position, seq, size)
  cancelled = 10,
  shutting_down = 11,
  // v6: a FORWARD could not be passed on because the link to the next stage
  // is down; the next stage (or the way to it) is at fault, not the sender.
  next_link_closed = 12,
};

// What a worker brings. Sizes in bytes; 0 means "not known".
struct Capabilities {
  Backend backend = Backend::cpu;
  std::string device_name;    // "NVIDIA GB10", "cpu: AMD EPYC ..."
  uint64_t memory_total = 0;  // bytes usable for the plan on this device
  uint64_t memory_free = 0;
  bool unified_memory = false;  // host and device share one pool (GB10)
  double bandwidth_gbps = 0;    // measured memory bandwidth, 0: not measured
  bool nccl = false;            // can open an NCCL link: built with NCCL, CUDA backend, device present
  uint32_t n_threads = 0;       // CPU threads offered
  // v3: what the coordinator needs to choose each stage link (net/link_choice.h).
  uint32_t nccl_version = 0;    // NCCL_VERSION_CODE of the library (0: none); peers must match
  std::string device_uuid;      // "GPU-xxxxxxxx-..." of the stage's device; "" none
  std::string pci_bus_id;       // "0000:1b:00.0"; "" none
  std::string host_id;          // hostname/boot id: equal on two workers of one host
  bool nccl_net = false;        // NCCL reaches other hosts over RDMA (InfiniBand / RoCE)

  template <class Ar>
  void serialize(Ar& ar) {
    ar(backend, device_name, memory_total, memory_free, unified_memory, bandwidth_gbps, nccl, n_threads, nccl_version,
       device_uuid, pci_bus_id, host_id, nccl_net);
  }
  bool operator==(const Capabilities&) const = default;
};

// One split part a worker holds (a per-node GGUF from gguf_split).
struct ModelPart {
  uint64_t tensor_table_hash = 0;  // of the part file itself
  int32_t layer_first = 0;         // inclusive
  int32_t layer_last = 0;          // inclusive
  bool has_embedding = false;
  bool has_output = false;
  // v7: a tensor-parallel rank file (`baton split --tp`): rank tp_rank of
  // tp_size ranks of this layer range; tp_size 1: not a rank file.
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(tensor_table_hash, layer_first, layer_last, has_embedding, has_output, tp_rank, tp_size);
  }
  bool operator==(const ModelPart&) const = default;
};

// Which model a worker has: the tensor-table hash of the full model (for a
// split part: baton.split.source_tensor_table_hash) and, when it holds split
// parts rather than the full file, which ones. 0 and no parts: no model yet.
struct ModelIdentity {
  uint64_t tensor_table_hash = 0;
  std::vector<ModelPart> parts;  // empty: the full GGUF

  template <class Ar>
  void serialize(Ar& ar) {
    ar(tensor_table_hash, parts);
  }
  bool operator==(const ModelIdentity&) const = default;
};

// Client -> server, first frame of every connection.
struct Hello {
  uint32_t protocol_version = kProtocolVersion;
  Role role = Role::worker;
  std::string node_name;
  Capabilities caps;
  ModelIdentity model;
  std::string listen_address;  // "host:port" for peer links; empty: none
  Nonce nonce{};               // client nonce (filled by the handshake)
  // v7: "host:port" where this worker listens for the all-reduce mesh of a
  // tensor-parallel group (net/allreduce.h); empty: none.
  std::string mesh_address;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(protocol_version, role, node_name, caps, model, listen_address, nonce, mesh_address);
  }
  bool operator==(const Hello&) const = default;
};

// Server -> client, answer to HELLO.
struct Challenge {
  uint32_t protocol_version = kProtocolVersion;
  Role role = Role::coordinator;
  std::string node_name;
  Nonce nonce{};  // server nonce

  template <class Ar>
  void serialize(Ar& ar) {
    ar(protocol_version, role, node_name, nonce);
  }
  bool operator==(const Challenge&) const = default;
};

// Client -> server: HMAC over the transcript with the client label.
struct AuthResponse {
  Mac mac{};
  template <class Ar>
  void serialize(Ar& ar) {
    ar(mac);
  }
  bool operator==(const AuthResponse&) const = default;
};

// Server -> client: HMAC over the transcript with the server label (the
// server proves the secret too, only after the client has).
struct AuthOk {
  Mac mac{};
  template <class Ar>
  void serialize(Ar& ar) {
    ar(mac);
  }
  bool operator==(const AuthOk&) const = default;
};

// Coordinator -> worker: the stage this worker runs.
struct Assign {
  uint32_t stage_index = 0;  // 0-based position in the pipeline
  uint32_t n_stages = 1;
  int32_t layer_first = 0;  // inclusive
  int32_t layer_last = 0;   // inclusive
  bool has_embedding = false;
  bool has_output = false;
  uint32_t n_ctx = 0;          // context per sequence
  uint32_t micro_batch = 0;    // most tokens in one FORWARD
  uint32_t prefill_chunk = 0;  // prompt tokens per prefill step
  uint32_t n_seq = 1;          // KV sequence slots
  std::string next_peer;       // "host:port" of the next stage; empty: results go to the coordinator
  std::string model_path;      // file on the worker: full GGUF or this stage's split part
  uint64_t model_hash = 0;     // expected tensor-table hash of model_path (0: do not check)
  LinkKind next_link = LinkKind::tcp;  // v3: the coordinator's choice for the link to next_peer
  // v7: the stage is a tensor-parallel group of tp_size ranks and this
  // worker is rank tp_rank. tp_mesh[r] is rank r's HELLO mesh_address (the
  // all-reduce), tp_peers[r] its listen_address: rank 0 passes every FORWARD
  // and FREE_SEQ it receives to ranks 1.. over links to those addresses, and
  // only rank 0 sends onward (next_peer) or samples. Both empty with
  // tp_size 1. An ASSIGN of the same stage and rank to a worker that has it
  // loaded re-forms the group (a rank was replaced): new mesh, empty KV.
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  std::vector<std::string> tp_mesh;
  std::vector<std::string> tp_peers;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(stage_index, n_stages, layer_first, layer_last, has_embedding, has_output, n_ctx, micro_batch, prefill_chunk,
       n_seq, next_peer, model_path, model_hash, next_link, tp_rank, tp_size, tp_mesh, tp_peers);
  }
  bool operator==(const Assign&) const = default;
};

// Worker -> coordinator: loaded and measured.
struct Ready {
  uint64_t weights_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t workspace_bytes = 0;
  double load_seconds = 0;
  uint32_t boundary_width = 0;  // floats per token this stage emits (0: logits/last stage)

  template <class Ar>
  void serialize(Ar& ar) {
    ar(weights_bytes, kv_bytes, workspace_bytes, load_seconds, boundary_width);
  }
  bool operator==(const Ready&) const = default;
};

struct LoadProgress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(bytes_done, bytes_total);
  }
  bool operator==(const LoadProgress&) const = default;
};

// Added to one token's logit before sampling (OpenAI's logit_bias).
struct LogitBias {
  int32_t token = 0;
  float bias = 0;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(token, bias);
  }
  bool operator==(const LogitBias&) const = default;
};
inline constexpr size_t kMaxLogitBias = 1024;
inline constexpr size_t kMaxAllowedWords = size_t(1) << 16;  // vocabularies up to 4M tokens

// Sampling for one sequence; used by the last stage only, carried from the
// first stage onwards so the coordinator talks to one stage. The last stage
// makes the sequence's sampler from the chunk that starts it (`begins`).
struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int32_t top_k = 40;        // <= 0: all
  float top_p = 0.95f;       // >= 1: all
  float min_p = 0.05f;       // <= 0: none
  uint64_t seed = 0;
  bool want_logprobs = false;
  uint32_t top_logprobs = 0;  // alternatives per sampled token (<= kMaxTopLogprobs)
  std::vector<LogitBias> logit_bias;  // v2; logprobs are of the biased distribution
  // v5: structured output. Empty, or one bit per vocabulary token (64 per
  // word, token t in bit t % 64 of word t / 64): only tokens whose bit is
  // set may be sampled (the coordinator follows the request's grammar).
  std::vector<uint64_t> allowed;
  // v7: penalties (engine/sampling/sampler.h's SamplerParams). The last
  // stage's sampler keeps the output it drew; the coordinator sends what it
  // cannot know on the chunk that makes the sampler (the prompt's last):
  // the prompt's last repeat_last_n tokens and, with min_tokens, the tokens
  // that end the output. Empty on every other chunk.
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  int32_t min_tokens = 0;
  std::vector<int32_t> prompt_tail;  // <= kMaxRepeatLastN ids
  std::vector<int32_t> end_tokens;   // <= kMaxEndTokens ids

  template <class Ar>
  void serialize(Ar& ar) {
    ar(temperature, top_k, top_p, min_p, seed, want_logprobs, top_logprobs, logit_bias, allowed, repeat_penalty,
       repeat_last_n, presence_penalty, frequency_penalty, min_tokens, prompt_tail, end_tokens);
  }
  bool operator==(const SamplingParams&) const = default;
};
inline constexpr uint32_t kMaxTopLogprobs = 64;
inline constexpr size_t kMaxRepeatLastN = 65536;
inline constexpr size_t kMaxEndTokens = 4096;

// The tokens of one sequence inside a FORWARD micro-batch.
//
// v5 (prefix cache): a slot keeps its KV when its sequence ends (no
// FREE_SEQ). The first chunk of a new sequence has `begins` set: every stage
// keeps the slot's first start_pos positions (the prefix the coordinator
// found in the slot's kept tokens), forgets the rest and starts a new
// sampler; start_pos 0 is a fresh sequence. A chunk at start_pos 0 begins a
// sequence whether or not the flag is set.
struct SeqChunk {
  uint32_t seq = 0;        // sequence (KV slot) id
  uint32_t start_pos = 0;  // position of the chunk's first token
  uint32_t n_tokens = 0;   // > 0
  bool sample = false;     // last stage: sample after this chunk's last token
  SamplingParams sampling;
  bool begins = false;     // v5: the first chunk of a new sequence in this slot

  template <class Ar>
  void serialize(Ar& ar) {
    ar(seq, start_pos, n_tokens, sample, sampling, begins);
  }
  bool operator==(const SeqChunk&) const = default;
};

// One micro-batch through one stage. Rows follow `chunks` in order. The first
// stage takes token ids; the others take boundary activations as raw
// little-endian f32 bytes (one memcpy each way, not element by element):
// total_tokens * row_width * 4 bytes. Exactly one of tokens/activations is
// non-empty, unless rows_on_link (v3): then both are empty and the
// total_tokens * row_width floats travel on the connection's NCCL link, in
// frame order.
struct Forward {
  uint64_t request_id = 0;
  std::vector<SeqChunk> chunks;
  std::vector<int32_t> tokens;       // total_tokens ids (first stage)
  uint32_t row_width = 0;            // floats per token row (activations only)
  std::vector<uint8_t> activations;  // f32 LE, row-major
  bool rows_on_link = false;         // v3: the rows follow on the NCCL link

  template <class Ar>
  void serialize(Ar& ar) {
    ar(request_id, chunks, tokens, row_width, activations, rows_on_link);
  }
  bool operator==(const Forward&) const = default;

  uint64_t total_tokens() const {
    uint64_t n = 0;
    for (const SeqChunk& c : chunks) n += c.n_tokens;
    return n;
  }
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(token, logprob);
  }
  bool operator==(const TokenLogprob&) const = default;
};

// Last stage -> coordinator: what was sampled for one sequence of a FORWARD,
// one RESULT per chunk with `sample` set, in chunk order. v4: a FORWARD
// without such a chunk is answered by one RESULT with no tokens (seq: its
// first chunk's), so that every micro-batch is seen to leave the pipeline.
struct Result {
  uint64_t request_id = 0;
  uint32_t seq = 0;
  std::vector<int32_t> tokens;                 // sampled ids, in order; empty: the acknowledgement
  std::vector<float> logprobs;                 // empty, or one per token
  std::vector<std::vector<TokenLogprob>> top;  // empty, or one list per token, most likely first

  template <class Ar>
  void serialize(Ar& ar) {
    ar(request_id, seq, tokens, logprobs, top);
  }
  bool operator==(const Result&) const = default;
};

// Stop work on a sequence and drop what is in flight for it.
struct Cancel {
  uint32_t seq = 0;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(seq);
  }
  bool operator==(const Cancel&) const = default;
};

// Forget a sequence's KV (the slot may be reused). v5: sent when the slot's
// KV is not worth keeping (a cancelled or failed sequence, or the prefix
// cache off), not at every end.
struct FreeSeq {
  uint32_t seq = 0;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(seq);
  }
  bool operator==(const FreeSeq&) const = default;
};

// Liveness, handled inside Connection: each side sends HEARTBEAT every
// interval and answers each with a HEARTBEAT_ECHO of the same fields.
struct Heartbeat {
  uint64_t counter = 0;
  uint64_t sent_us = 0;  // sender's steady clock, only meaningful to the sender

  template <class Ar>
  void serialize(Ar& ar) {
    ar(counter, sent_us);
  }
  bool operator==(const Heartbeat&) const = default;
};

struct HeartbeatEcho {
  uint64_t counter = 0;
  uint64_t sent_us = 0;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(counter, sent_us);
  }
  bool operator==(const HeartbeatEcho&) const = default;
};

struct Error {
  uint32_t code = uint32_t(WireError::internal);  // a WireError
  uint64_t request_id = 0;                        // 0: about the connection
  std::string text;

  template <class Ar>
  void serialize(Ar& ar) {
    ar(code, request_id, text);
  }
  bool operator==(const Error&) const = default;
};

struct Shutdown {
  std::string reason;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(reason);
  }
  bool operator==(const Shutdown&) const = default;
};

// Coordinator -> worker (v2): send this stage's output to another next stage
// from now on (the route healed with a new worker there). Forwards already
// sent on the old link are lost with it; the coordinator has failed them.
struct Route {
  std::string next_peer;  // "host:port"; empty: results go to the coordinator
  LinkKind link = LinkKind::tcp;  // v3: the coordinator's choice for the new link

  template <class Ar>
  void serialize(Ar& ar) {
    ar(next_peer, link);
  }
  bool operator==(const Route&) const = default;
};

// Stage -> next stage, on the peer link (v3), right after the handshake and
// again whenever the sending side changes its mind: nccl with the unique id
// the sender created (the receiver joins as rank 1), or tcp (drop any NCCL
// link of this connection; rows come inside FORWARD).
struct LinkSetup {
  LinkKind kind = LinkKind::tcp;
  std::vector<uint8_t> nccl_id;  // kNcclIdBytes with nccl, else empty
  uint64_t max_floats = 0;       // nccl: floats per NCCL transfer; larger FORWARDs are split into pieces of this

  template <class Ar>
  void serialize(Ar& ar) {
    ar(kind, nccl_id, max_floats);
  }
  bool operator==(const LinkSetup&) const = default;
};

// Next stage -> stage (v3): the outcome of the receiver's side of LINK_SETUP.
struct LinkAck {
  LinkKind kind = LinkKind::tcp;  // nccl: the receiver's communicator is up
  std::string reason;             // why not, with tcp

  template <class Ar>
  void serialize(Ar& ar) {
    ar(kind, reason);
  }
  bool operator==(const LinkAck&) const = default;
};

// Worker -> coordinator (v3): what the link to the next stage really is now
// (after setup, a fallback, or a route change); the coordinator shows it in
// /health. v6: `connected` false says the link is down (it closed while both
// workers may be up) and the worker is dialling next_peer again; the route
// is broken until the same worker reports it connected.
struct LinkStatus {
  std::string next_peer;
  LinkKind kind = LinkKind::tcp;
  std::string reason;  // why tcp (or a note for nccl); with !connected, why the link is down
  bool connected = true;  // v6

  template <class Ar>
  void serialize(Ar& ar) {
    ar(next_peer, kind, reason, connected);
  }
  bool operator==(const LinkStatus&) const = default;
};

// Alternatives in MsgType order: index + 1 is the type code (checked in
// net/codec.cpp).
using Message = std::variant<Hello, Challenge, AuthResponse, AuthOk, Assign, Ready, LoadProgress, Forward, Result,
                             Cancel, FreeSeq, Heartbeat, HeartbeatEcho, Error, Shutdown, Route, LinkSetup, LinkAck,
                             LinkStatus>;

inline MsgType message_type(const Message& m) { return MsgType(uint16_t(m.index() + 1)); }

// Limits every decoder enforces (beyond the frame size).
inline constexpr size_t kMaxNameBytes = 4096;   // names, addresses, paths
inline constexpr size_t kMaxTextBytes = 16384;  // ERROR text, SHUTDOWN reason
inline constexpr size_t kMaxModelParts = 1024;  // HELLO must fit the 64 KiB handshake limit
inline constexpr size_t kMaxChunksPerForward = 65536;
inline constexpr uint32_t kMaxGroupRanks = 64;  // ranks of a tensor-parallel group (the mesh's limit)

}  // namespace baton::net
