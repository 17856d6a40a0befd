// SentencePiece-style tokenizer (`tokenizer.ggml.model` = "llama"), as
// llama.cpp implements it: spaces become U+2581 "▁", a "▁" is prefixed to
// text at the start and after each special token, adjacent symbols merge
// while the merged text is a vocabulary entry, highest score first, and
// characters left without a token fall back to <0xXX> byte tokens.
#include <array>
#include <cstdio>
#include <queue>

#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"

namespace baton {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(TokenizerVocab v) : VocabTokenizer(std::move(v)) {
    add_bos_ = v_.add_bos.value_or(true);
    add_eos_ = v_.add_eos.value_or(false);
    add_space_prefix_ = v_.add_space_prefix.value_or(true);
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      int32_t id = find(hex);
      if (id < 0) id = find(std::string(1, static_cast<char>(b)));
      byte_tokens_[b] = id >= 0 ? id : v_.unk;
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    std::string escaped;
    return encode_fragments(text, add_special, parse_special,
                            [&](std::string_view plain, bool after_special, std::vector<int32_t>& out) {
                              escaped.clear();
                              if (add_space_prefix_ && after_special) escaped += kSpace;
                              for (char c : plain) {
                                if (c == ' ') {
                                  escaped += kSpace;
                                } else {
                                  escaped.push_back(c);
                                }
                              }
                              encode_escaped(escaped, out);
                            });
  }

  std::string token_to_piece(int32_t id) const override {
    switch (token_type(id)) {
      case TokenType::Normal: {
        const std::string& t = v_.tokens[id];
        std::string out;
        out.reserve(t.size());
        for (size_t i = 0; i < t.size();) {
          if (t.compare(i, kSpace.size(), kSpace) == 0) {
            out.push_back(' ');
            i += kSpace.size();
          } else {
            out.push_back(t[i++]);
          }
        }
        return out;
      }
      case TokenType::Byte: {
        const std::string& t = v_.tokens[id];
        unsigned value = 0;
        char tail = 0;
        if (t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X%c", &value, &tail) == 2 && tail == '>') {
          return std::string(1, static_cast<char>(value));
        }
        return t;
      }
      default:
        return special_piece(id);
    }
  }

 private:
  struct Symbol {
    int prev, next;
    uint32_t offset, size;  // bytes of the escaped text; size 0 once merged away
  };
  struct Bigram {
    float score;
    int left, right;
    uint32_t size;  // bytes the pair covered when queued; stale if it changed
  };
  struct Lower {  // priority: higher score first, then the leftmost pair
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  float score(int32_t id) const { return v_.scores.empty() ? 0.0f : v_.scores[id]; }

  void encode_escaped(const std::string& text, std::vector<int32_t>& out) const {
    std::vector<Symbol> syms;
    for (size_t off = 0; off < text.size();) {
      // One symbol per well-formed character; a malformed byte stands alone
      // (so it cannot swallow the "▁" after it) and falls back to its byte.
      char32_t cp = 0;
      const size_t len = utf8_decode(text, off, cp);
      const int idx = static_cast<int>(syms.size());
      syms.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, uint32_t(off), uint32_t(len)});
      off += len;
    }
    std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue;
    const auto try_pair = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const uint32_t size = syms[left].size + syms[right].size;
      const int32_t id = find(std::string_view(text).substr(syms[left].offset, size));
      if (id >= 0) queue.push({score(id), left, right, size});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_pair(i - 1, i);

    merge_symbols(
        syms, queue, [](const Bigram& b, const Symbol& l, const Symbol& r) { return l.size + r.size != b.size; },
        [](const Bigram&, Symbol&) {}, try_pair);

    for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
      const std::string_view piece = std::string_view(text).substr(syms[i].offset, syms[i].size);
      const int32_t id = find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (char c : piece) {
        const int32_t b = byte_tokens_[static_cast<uint8_t>(c)];
        if (b >= 0) out.push_back(b);
      }
    }
  }

  bool add_space_prefix_ = true;
  std::array<int32_t, 256> byte_tokens_{};
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerVocab v) {
  return std::make_unique<SpmTokenizer>(std::move(v));
}

}  // namespace baton
