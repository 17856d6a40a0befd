// A tiny synthetic llama model, built in: random weights (seeded, so the file
// is the same on every run) and a byte-level SentencePiece-style vocabulary of
// <unk>, <s>, </s>, the 256 byte tokens <0xXX>, single characters and a few
// merged pieces with scores. It lets `baton run` and the tests work with no
// model file at hand; its text is gibberish by design.
//
// Also the shape catalogue behind `baton synth`: random-weight models of real
// sizes (llama 1B/8B, DeepSeek V4 Flash) and tiny ones, written with bounded
// memory, for tests and benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/quant.h"

namespace baton {

struct SynthConfig {
  int n_layer = 2;
  int64_t n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;
  int64_t n_ff = 128;
  int64_t n_ctx = 512;
  DType weight_type = DType::F32;  // matrices; norms stay F32. Needs a quantizer.
  bool tied_output = false;        // no output.weight: the head reuses token_embd
  uint64_t seed = 0x5eed;
};

// Writes the model as GGUF v3 to path (throws on I/O failure or a config the
// dtype cannot hold, e.g. n_embd not a multiple of its block size).
void write_synthetic_model(const std::string& path, const SynthConfig& config = {});

// How tensor data is made.
//   Random: every tensor its own seeded random data, valid for its type
//           (finite scales, never all zeros).
//   Alias:  tensors of the same name pattern (layer number left out), type
//           and shape hold the same bytes: one random tile of about 1 MiB of
//           whole blocks per pattern, repeated. Generating it is free, so the
//           write runs at disk speed; the file still takes its full size,
//           because GGUF readers (ours included) refuse tensors whose data
//           overlap, so tensors cannot share one stored blob. The output
//           head is the exception, random as in Random: its rows are the
//           logits, and repeated rows would make every greedy pick a tie.
//   Sparse: the header only; the data section is a hole of the full size
//           (reads as zeros). For tools that never read tensor data.
enum class SynthData { Random, Alias, Sparse };
const char* synth_data_name(SynthData d);
std::optional<SynthData> synth_data_from_name(std::string_view name);

struct SynthShapeInfo {
  std::string name;          // e.g. "llama-8b"; "NAME-TYPE" also selects the type
  std::string arch;          // "llama" or "deepseek4"
  std::string default_type;  // type when none is named
  std::vector<std::string> types;
  std::string summary;
};
const std::vector<SynthShapeInfo>& synth_shapes();

struct SynthOptions {
  std::string arch;   // must match the shape's
  std::string shape;  // a name of synth_shapes(), optionally with a "-TYPE" suffix
  std::string type;   // "" for the suffix or the shape's default; must agree with a suffix
  uint64_t seed = 0x5eed;
  SynthData data = SynthData::Random;
  // deepseek4 only: add the DSpark drafter (engine/dspark/dspark_shape.h,
  // random weights of its real shapes) to the model file, or with draft_out
  // to a sidecar file of its own (general.architecture deepseek4-dspark).
  bool dspark = false;
  std::string draft_out;
  // 0: the shape's layers; else this many of them (1 to the shape's count),
  // each the shape's own: a shorter model for a card that cannot hold all.
  int layers = 0;
  // Called after each piece of tensor data is written (bytes done, total).
  std::function<void(uint64_t, uint64_t)> progress;
};

struct SynthResult {
  std::string shape;  // resolved, e.g. "deepseek4-flash" with type "q2"
  std::string type;
  uint64_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  int64_t n_vocab = 0;
  uint64_t draft_bytes = 0;  // tensor data of a drafter sidecar (SynthOptions::draft_out)
};

// Writes the model as GGUF v3 (through a temporary name beside path, renamed when complete).
// Throws std::invalid_argument for an unknown shape, type or arch mismatch.
// Memory stays bounded by a few MiB per thread whatever the model size.
SynthResult write_synth_model(const std::string& path, const SynthOptions& options);

// Writes a DSpark drafter sidecar of `shape` with random weights whose dtypes
// come from `types` by role. With `with_target_io` it also holds the target's
// token_embd.weight and output.weight (types.embedding, types.output) and
// the target's deepseek4.* keys: a self-contained file for the draft
// network's tests. Returns the tensor bytes.
struct DsparkShape;
struct Ds4Types;
uint64_t write_dspark_file(const std::string& path, const DsparkShape& shape, const Ds4Types& types, uint64_t seed,
                           bool with_target_io = false, SynthData data = SynthData::Random);

}  // namespace baton
