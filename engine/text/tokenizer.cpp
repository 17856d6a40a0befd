// Tokenizer factory (GGUF metadata -> TokenizerVocab -> implementation) and
// the vocabulary bookkeeping both implementations share.
#include "engine/text/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "engine/gguf/file.h"

namespace baton {

namespace {

// Texts llama.cpp treats as end-of-generation whatever their id keys say, so
// chat models stop at their turn markers.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
};

// A token id key: absent, or 0xFFFFFFFF as some converters write, means none.
int32_t read_id(const GgufFile& f, std::string_view key, int32_t def) {
  const GgufValue* v = f.find(key);
  if (!v) return def;
  const int64_t id = v->as_int();
  if (id < 0 || id == 0xFFFFFFFFll) return -1;
  if (id > INT32_MAX) throw std::runtime_error("tokenizer: " + std::string(key) + " = " + std::to_string(id) + " is out of range");
  return static_cast<int32_t>(id);
}

std::optional<bool> read_flag(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  return v->as_int() != 0;
}

}  // namespace

uint64_t text_hash(std::string_view s) {
  // Eight bytes at a time with a multiply-xorshift mix: tokens are short, and
  // the high and low halves both need to be well spread (probe start and tag).
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  if (i < s.size()) std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 32;
  return h;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  TokenizerVocab v;
  v.model = f.get_str("tokenizer.ggml.model");
  if (v.model != "llama" && v.model != "gpt2") {
    // Refuse before reading the (possibly large) arrays.
    return from_vocab(std::move(v));
  }
  v.pre = f.get_str("tokenizer.ggml.pre", "");

  const GgufValue& tokens = f.get_array("tokenizer.ggml.tokens");
  v.tokens.reserve(tokens.items.size());
  for (const GgufValue& t : tokens.items) v.tokens.push_back(t.as_str());

  if (const GgufValue* scores = f.find("tokenizer.ggml.scores")) {
    v.scores.reserve(scores->items.size());
    for (const GgufValue& s : scores->items) v.scores.push_back(static_cast<float>(s.as_float()));
  }
  if (const GgufValue* types = f.find("tokenizer.ggml.token_type")) {
    v.types.reserve(types->items.size());
    for (const GgufValue& t : types->items) {
      const int64_t x = t.as_int();
      v.types.push_back(x >= 0 && x <= 6 ? static_cast<TokenType>(x) : TokenType::Undefined);
    }
  }
  if (v.model == "gpt2") {
    const GgufValue& merges = f.get_array("tokenizer.ggml.merges");
    v.merges.reserve(merges.items.size());
    for (const GgufValue& m : merges.items) v.merges.push_back(m.as_str());
  }

  // llama.cpp's defaults for SentencePiece vocabularies without id keys.
  const bool spm = v.model == "llama";
  const auto n = static_cast<int32_t>(v.tokens.size());
  v.bos = read_id(f, "tokenizer.ggml.bos_token_id", spm && n > 1 ? 1 : -1);
  v.eos = read_id(f, "tokenizer.ggml.eos_token_id", spm && n > 2 ? 2 : -1);
  v.unk = read_id(f, "tokenizer.ggml.unknown_token_id", spm && n > 0 ? 0 : -1);
  v.eot = read_id(f, "tokenizer.ggml.eot_token_id", -1);
  v.eom = read_id(f, "tokenizer.ggml.eom_token_id", -1);
  v.add_bos = read_flag(f, "tokenizer.ggml.add_bos_token");
  v.add_eos = read_flag(f, "tokenizer.ggml.add_eos_token");
  v.add_space_prefix = read_flag(f, "tokenizer.ggml.add_space_prefix");
  return from_vocab(std::move(v));
}

std::unique_ptr<Tokenizer> Tokenizer::from_vocab(TokenizerVocab v) {
  if (v.model == "llama") return make_spm_tokenizer(std::move(v));
  if (v.model == "gpt2") return make_bpe_tokenizer(std::move(v));
  throw std::runtime_error("unsupported tokenizer model '" + v.model +
                           "' (tokenizer.ggml.model); supported: llama (SentencePiece), gpt2 (byte-level BPE)");
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id);
  return out;
}

VocabTokenizer::VocabTokenizer(TokenizerVocab v) : v_(std::move(v)) {
  const size_t n = v_.tokens.size();
  if (n == 0) throw std::runtime_error("tokenizer: the vocabulary (tokenizer.ggml.tokens) is empty");
  if (n > size_t(INT32_MAX)) throw std::runtime_error("tokenizer: vocabulary too large");
  if (!v_.scores.empty() && v_.scores.size() != n) {
    throw std::runtime_error("tokenizer: " + std::to_string(v_.scores.size()) + " scores for " + std::to_string(n) +
                             " tokens (tokenizer.ggml.scores)");
  }
  if (v_.types.empty()) v_.types.assign(n, TokenType::Normal);
  if (v_.types.size() != n) {
    throw std::runtime_error("tokenizer: " + std::to_string(v_.types.size()) + " token types for " +
                             std::to_string(n) + " tokens (tokenizer.ggml.token_type)");
  }
  const std::pair<const char*, int32_t> ids[] = {
      {"bos", v_.bos}, {"eos", v_.eos}, {"unknown", v_.unk}, {"eot", v_.eot}, {"eom", v_.eom}};
  for (const auto& [name, id] : ids) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      throw std::runtime_error(std::string("tokenizer: ") + name + " token id " + std::to_string(id) +
                               " is outside the vocabulary of " + std::to_string(n));
    }
  }

  // A duplicated text maps to its last id, as in llama.cpp.
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  slots_.assign(cap, 0);
  slot_mask_ = cap - 1;
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v_.tokens[i];
    if (t.empty()) continue;
    const uint64_t h = text_hash(t);
    for (uint64_t k = h & slot_mask_;; k = (k + 1) & slot_mask_) {
      const uint64_t s = slots_[k];
      if (s == 0 || ((s >> 32) == (h >> 32) && v_.tokens[(s & 0xFFFFFFFFu) - 1] == t)) {
        slots_[k] = (h & 0xFFFFFFFF00000000ull) | (i + 1);
        break;
      }
    }
  }

  for (int32_t id : {v_.eos, v_.eot, v_.eom}) {
    if (id >= 0) eog_.push_back(id);
  }
  for (std::string_view text : kEogTexts) {
    const int32_t id = find(text);
    if (id < 0) continue;
    eog_.push_back(id);
    // An end marker typed as plain text would be tokenized from user input
    // and printed; llama.cpp retypes it as control, and so do we.
    v_.types[id] = TokenType::Control;
  }
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

  for (size_t i = 0; i < n; ++i) {
    const TokenType t = v_.types[i];
    if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) && !v_.tokens[i].empty()) {
      specials_.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int32_t a, int32_t b) { return v_.tokens[a].size() > v_.tokens[b].size(); });
}

bool VocabTokenizer::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

const std::string& VocabTokenizer::token_text(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= n_vocab()) return kEmpty;
  return v_.tokens[id];
}

TokenType VocabTokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return TokenType::Undefined;
  return v_.types[id];
}

std::string VocabTokenizer::special_piece(int32_t id) const {
  if (token_type(id) == TokenType::UserDefined) return v_.tokens[id];
  return {};
}

int32_t VocabTokenizer::find(std::string_view text) const {
  const uint64_t h = text_hash(text);
  for (uint64_t k = h & slot_mask_;; k = (k + 1) & slot_mask_) {
    const uint64_t s = slots_[k];
    if (s == 0) return -1;
    if ((s >> 32) == (h >> 32)) {
      const size_t id = (s & 0xFFFFFFFFu) - 1;
      if (v_.tokens[id] == text) return static_cast<int32_t>(id);
    }
  }
}

std::vector<VocabTokenizer::Fragment> VocabTokenizer::split_special(std::string_view text,
                                                                    bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({text, -1});
  std::vector<Fragment> next;
  for (int32_t id : specials_) {
    const TokenType t = v_.types[id];
    if (!parse_special && t != TokenType::UserDefined) continue;
    const std::string& st = v_.tokens[id];
    bool found = false;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0 || f.text.size() < st.size()) {
        next.push_back(f);
        continue;
      }
      size_t pos = 0;
      for (size_t m; (m = f.text.find(st, pos)) != std::string_view::npos; pos = m + st.size()) {
        if (m > pos) next.push_back({f.text.substr(pos, m - pos), -1});
        next.push_back({f.text.substr(m, st.size()), id});
        found = true;
      }
      if (pos < f.text.size()) next.push_back({f.text.substr(pos), -1});
    }
    if (found) frags.swap(next);
  }
  return frags;
}

}  // namespace baton
