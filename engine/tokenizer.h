// Tokenizers read from GGUF metadata (`tokenizer.ggml.*`):
//   model "llama" -> SentencePiece-style (scores, byte fallback <0xXX>)
//   model "gpt2"  -> byte-level BPE (merges, pre-tokenizer chosen by
//                    `tokenizer.ggml.pre`, special tokens)
// Anything else is refused by name when the tokenizer is built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

class GgufFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Throws std::runtime_error naming the problem (unknown model, missing keys).
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

  // add_special: prepend BOS (and append EOS) when the vocabulary asks for it
  // (`tokenizer.ggml.add_bos_token`, default true for llama, false for gpt2).
  // parse_special: recognise control/special token texts inside `text`.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;

  // The bytes a token stands for (byte-fallback and byte-level tokens decoded;
  // control tokens give ""). Out-of-range ids give "".
  virtual std::string token_to_piece(int32_t id) const = 0;
  std::string decode(const std::vector<int32_t>& ids) const;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos() const = 0;  // -1 when absent
  virtual int32_t eos() const = 0;  // -1 when absent
  virtual bool is_eog(int32_t id) const = 0;  // end of generation (EOS, EOT...)
  virtual const std::string& token_text(int32_t id) const = 0;  // raw vocabulary entry
};

}  // namespace baton
