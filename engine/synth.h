// A tiny synthetic llama model, built in: random weights (seeded, so the file
// is the same on every run) and a byte-level SentencePiece-style vocabulary of
// <unk>, <s>, </s>, the 256 byte tokens <0xXX>, single characters and a few
// merged pieces with scores. It lets `baton run` and the tests work with no
// model file at hand; its text is gibberish by design.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace baton
