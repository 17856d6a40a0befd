// Tokenizers read from GGUF metadata (`tokenizer.ggml.*`):
//   model "llama" -> SentencePiece-style (scores, byte fallback <0xXX>)
//   model "gpt2"  -> byte-level BPE (merges, pre-tokenizer chosen by
//                    `tokenizer.ggml.pre`, special tokens)
// Anything else is refused by name when the tokenizer is built.
// Behaviour follows llama.cpp's tokenizer (see docs/TOKENIZERS.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

class GgufFile;

// `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,      // BOS, EOS, chat markers: matched in text only with parse_special
  UserDefined = 4,  // added tokens: always matched in text before merging
  Unused = 5,
  Byte = 6,         // SentencePiece byte fallback "<0xXX>"
};

// What a tokenizer is built from: the `tokenizer.ggml.*` metadata, as plain
// data. from_gguf fills it; tests and tools may fill it directly.
struct TokenizerVocab {
  std::string model;                // "llama" or "gpt2"
  std::string pre;                  // tokenizer.ggml.pre; empty means "default"
  std::vector<std::string> tokens;  // id -> text
  std::vector<float> scores;        // id -> score (SPM merge priority); empty: all 0
  std::vector<TokenType> types;     // id -> type; empty: all Normal
  std::vector<std::string> merges;  // BPE "left right"; the index is the rank
  int32_t bos = -1, eos = -1, unk = -1, eot = -1, eom = -1;  // -1: absent
  // Absent: the model's default (llama: BOS yes, space prefix yes; gpt2: no,
  // except llama3-style pre-tokenizers which add BOS; EOS never).
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Throws std::runtime_error naming the problem (unknown model, missing keys).
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);
  // Same, from metadata already read (throws std::runtime_error).
  static std::unique_ptr<Tokenizer> from_vocab(TokenizerVocab v);

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

// The part the SentencePiece and BPE tokenizers share: the vocabulary, its
// text index, special-token splitting and the end-of-generation set.
class VocabTokenizer : public Tokenizer {
 public:
  VocabTokenizer(const VocabTokenizer&) = delete;
  VocabTokenizer& operator=(const VocabTokenizer&) = delete;

  int32_t n_vocab() const override { return static_cast<int32_t>(v_.tokens.size()); }
  int32_t bos() const override { return v_.bos; }
  int32_t eos() const override { return v_.eos; }
  bool is_eog(int32_t id) const override;
  const std::string& token_text(int32_t id) const override;

  TokenType token_type(int32_t id) const;  // Undefined when out of range
  int32_t find(std::string_view text) const;  // exact vocabulary entry, -1 when absent
  const TokenizerVocab& vocab() const { return v_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }

 protected:
  // Validates sizes and ids (throws std::runtime_error) and builds the index.
  explicit VocabTokenizer(TokenizerVocab v);

  // A piece of the input: plain text (token < 0) or one special token.
  struct Fragment {
    std::string_view text;
    int32_t token = -1;
  };
  // Finds special-token texts in `text`, longest first: user-defined tokens
  // always, control and unknown ones only with parse_special.
  std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;

  // encode's frame, the same for every tokenizer: BOS, the special tokens
  // split_special finds, EOS. encode_text(text, after_special, out) appends
  // the tokens of one plain fragment; after_special is true at the start of
  // the text and right after a special token.
  template <class EncodeText>
  std::vector<int32_t> encode_fragments(std::string_view text, bool add_special, bool parse_special,
                                        EncodeText&& encode_text) const {
    std::vector<int32_t> out;
    if (add_special && add_bos_ && bos() >= 0) out.push_back(bos());
    bool after_special = true;
    for (const Fragment& f : split_special(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      encode_text(f.text, after_special, out);
      after_special = false;
    }
    if (add_special && add_eos_ && eos() >= 0) out.push_back(eos());
    return out;
  }

  // token_to_piece for the types every tokenizer shows alike: a user-defined
  // token as written; control, unknown and unused ones as nothing.
  std::string special_piece(int32_t id) const;

  TokenizerVocab v_;  // types always has one entry per token
  bool add_bos_ = false;
  bool add_eos_ = false;

 private:
  // Open-addressing text index: slot = (hash high 32 bits << 32) | (id + 1),
  // 0 when empty; the text itself is compared in v_.tokens. Flat so that
  // building 129k entries and looking up pieces stay cache friendly.
  std::vector<uint64_t> slots_;
  uint64_t slot_mask_ = 0;
  std::vector<int32_t> specials_;  // control, user-defined and unknown ids, longest text first
  std::vector<int32_t> eog_;       // sorted
};

// The merge loop of both tokenizers over one word's symbols (a linked list in
// a vector: prev/next indices, size 0 once merged away): take the best queued
// pair, drop it when a side was merged away or stale(pair, left, right) says
// it changed since it was queued, join the right symbol into the left
// (join(pair, left) updates what else a symbol keeps), then queue the joined
// symbol with each neighbour through try_pair(left, right).
template <class Symbol, class Queue, class Stale, class Join, class TryPair>
void merge_symbols(std::vector<Symbol>& syms, Queue& queue, Stale&& stale, Join&& join, TryPair&& try_pair) {
  while (!queue.empty()) {
    const auto p = queue.top();
    queue.pop();
    Symbol& l = syms[p.left];
    Symbol& r = syms[p.right];
    if (l.size == 0 || r.size == 0 || stale(p, l, r)) continue;
    l.size += r.size;
    join(p, l);
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = p.left;
    try_pair(l.prev, p.left);
    try_pair(p.left, l.next);
  }
}

// Hash of a byte string for the tokenizers' flat tables.
uint64_t text_hash(std::string_view s);

// The two implementations (from_vocab picks by v.model).
std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerVocab v);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerVocab v);

}  // namespace baton
