// Byte-level BPE tokenizer (`tokenizer.ggml.model` = "gpt2"): text is split
// into words by the pre-tokenizer, each word's bytes are written in GPT-2's
// byte-to-unicode alphabet (so every byte is a printable character and token
// texts are valid UTF-8), and adjacent symbols merge by rank, lowest first.
#include <array>
#include <queue>
#include <stdexcept>

#include "engine/text/pretokenize.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"

namespace baton {

namespace {

// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the 68
// others (controls, space, DEL, NBSP, soft hyphen...) take U+0100.. in order.
struct ByteAlphabet {
  static constexpr int kMaxCp = 256 + 68;
  std::array<std::string, 256> encode;  // byte -> UTF-8 of its character
  std::array<int16_t, kMaxCp> decode;   // character -> byte, -1 if none

  ByteAlphabet() {
    decode.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? char32_t(b) : char32_t(256 + extra++);
      utf8_append(encode[b], cp);
      decode[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

class BpeTokenizer final : public VocabTokenizer {
 public:
  explicit BpeTokenizer(TokenizerVocab v)
      : VocabTokenizer(std::move(v)), pre_(v_.pre.empty() ? "default" : v_.pre) {
    add_bos_ = v_.add_bos.value_or(pre_.default_add_bos());
    add_eos_ = v_.add_eos.value_or(false);
    if (v_.merges.empty()) throw std::runtime_error("tokenizer: gpt2 vocabulary without merges (tokenizer.ggml.merges)");
    size_t cap = 16;
    while (cap < 2 * v_.merges.size()) cap *= 2;
    merges_.assign(cap, Merge{});
    merge_mask_ = cap - 1;
    std::string joined;
    for (size_t rank = 0; rank < v_.merges.size(); ++rank) {
      const std::string& m = v_.merges[rank];
      // Split at the first space after the first character: a merge side
      // never contains a space in the byte alphabet.
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;
      const int32_t left = find(std::string_view(m).substr(0, sp));
      const int32_t right = find(std::string_view(m).substr(sp + 1));
      joined.assign(m, 0, sp);
      joined.append(m, sp + 1);
      const int32_t result = find(joined);
      // A merge whose parts or result are not tokens cannot produce a token.
      if (left < 0 || right < 0 || result < 0) continue;
      add_merge(left, right, static_cast<int32_t>(rank), result);
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    return encode_fragments(text, add_special, parse_special,
                            [&](std::string_view plain, bool /*after_special*/, std::vector<int32_t>& out) {
                              for (std::string_view word : pre_.split(plain)) encode_word(word, out);
                            });
  }

  std::string token_to_piece(int32_t id) const override {
    if (token_type(id) != TokenType::Normal) return special_piece(id);
    const std::string& t = v_.tokens[id];
    const ByteAlphabet& a = byte_alphabet();
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      char32_t cp = 0;
      const size_t n = utf8_decode(t, i, cp);
      if (cp < ByteAlphabet::kMaxCp && a.decode[cp] >= 0) {
        out.push_back(static_cast<char>(a.decode[cp]));
      } else {
        out.append(t, i, n);  // not a byte-level character: keep it as written
      }
      i += n;
    }
    return out;
  }

 private:
  struct Merge {  // one slot of the flat merge table; left < 0 when empty
    int32_t left = -1, right = -1;
    int32_t rank = 0, result = 0;
  };
  struct Symbol {
    int prev, next;
    uint32_t offset, size;  // bytes of the encoded word; size 0 once merged away
    int32_t id;             // token of the symbol's text, -1 if none
  };
  struct Pair {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id;  // stale if either side changed since queued
    int32_t result;
  };
  struct Lower {  // priority: lowest rank first, then the leftmost pair
    bool operator()(const Pair& a, const Pair& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  static uint64_t pair_hash(int32_t left, int32_t right) {
    uint64_t h = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    return h;
  }

  // The first (lowest-rank) merge of a pair wins, as in llama.cpp.
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t result) {
    for (uint64_t k = pair_hash(left, right) & merge_mask_;; k = (k + 1) & merge_mask_) {
      Merge& m = merges_[k];
      if (m.left < 0) {
        m = Merge{left, right, rank, result};
        return;
      }
      if (m.left == left && m.right == right) return;
    }
  }

  const Merge* find_merge(int32_t left, int32_t right) const {
    for (uint64_t k = pair_hash(left, right) & merge_mask_;; k = (k + 1) & merge_mask_) {
      const Merge& m = merges_[k];
      if (m.left < 0) return nullptr;
      if (m.left == left && m.right == right) return &m;
    }
  }

  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    const ByteAlphabet& a = byte_alphabet();
    std::string enc;
    enc.reserve(word.size() * 2);
    for (char c : word) enc += a.encode[static_cast<uint8_t>(c)];
    if (pre_.ignore_merges()) {
      const int32_t id = find(enc);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }

    std::vector<Symbol> syms;
    for (size_t off = 0; off < enc.size();) {
      const size_t len = std::min(utf8_sequence_length(static_cast<uint8_t>(enc[off])), enc.size() - off);
      const int idx = static_cast<int>(syms.size());
      syms.push_back({idx - 1, off + len == enc.size() ? -1 : idx + 1, uint32_t(off), uint32_t(len),
                      find(std::string_view(enc).substr(off, len))});
      off += len;
    }
    std::priority_queue<Pair, std::vector<Pair>, Lower> queue;
    const auto try_pair = [&](int left, int right) {
      if (left < 0 || right < 0 || syms[left].id < 0 || syms[right].id < 0) return;
      const Merge* m = find_merge(syms[left].id, syms[right].id);
      if (m) queue.push({m->rank, left, right, syms[left].id, syms[right].id, m->result});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_pair(i - 1, i);

    merge_symbols(
        syms, queue,
        [](const Pair& p, const Symbol& l, const Symbol& r) {
          return l.next != p.right || l.id != p.left_id || r.id != p.right_id;
        },
        [](const Pair& p, Symbol& l) { l.id = p.result; }, try_pair);

    for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
      if (syms[i].id >= 0) {
        out.push_back(syms[i].id);
        continue;
      }
      // No token for this character: emit whatever single bytes of it the
      // vocabulary has (llama.cpp's fallback; a complete byte-level vocabulary
      // never gets here).
      const std::string_view piece = std::string_view(enc).substr(syms[i].offset, syms[i].size);
      for (size_t k = 0; k < piece.size(); ++k) {
        const int32_t id = find(piece.substr(k, 1));
        if (id >= 0) out.push_back(id);
      }
    }
  }

  PreTokenizer pre_;
  std::vector<Merge> merges_;  // open addressing, capacity a power of two
  uint64_t merge_mask_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerVocab v) {
  return std::make_unique<BpeTokenizer>(std::move(v));
}

}  // namespace baton
