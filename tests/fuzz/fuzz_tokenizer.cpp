// libFuzzer target for the tokenizers: arbitrary bytes encoded by real
// vocabularies (llama.cpp's vocab-only fixtures: SentencePiece and byte-level
// BPE with several pre-tokenizers), then decoded. Encoding never throws.
//
// Bugs, besides crashes and sanitizer reports: an id outside the vocabulary,
// and, for byte-level BPE vocabularies without special-token parsing, a valid
// UTF-8 text whose every byte has a token that does not decode back to
// itself.
//
// Input: byte 0 picks the vocabulary (bits 0-2) and the flags (bit 3
// add_special, bit 4 parse_special); the rest is the text.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"

using namespace baton;

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

struct Vocab {
  std::unique_ptr<Tokenizer> tok;
  bool byte_level = false;   // gpt2-style byte-level BPE
  bool has_byte[256] = {};   // the byte alone decodes back to itself
};
std::vector<Vocab> g_vocabs;

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = std::string(BATON_SHARED_DIR) + "/models/vocab/";
  for (const char* name : {"llama-spm", "phi-3", "gpt-2", "deepseek-coder", "falcon", "starcoder"}) {
    const GgufFile f = GgufFile::open(dir + "ggml-vocab-" + name + ".gguf");
    Vocab v;
    v.tok = Tokenizer::from_gguf(f);
    // Round trips hold only for text whose every byte has a token: falcon's
    // vocabulary lacks some control bytes (0x04...) and starcoder's some
    // lead bytes (0xF1...), which llama.cpp and Baton both drop.
    v.byte_level = f.get_str("tokenizer.ggml.model", "") == "gpt2";
    for (int b = 0; b < 256 && v.byte_level; ++b) {
      const std::string one(1, char(b));
      v.has_byte[b] = v.tok->decode(v.tok->encode(one, false, false)) == one;
    }
    g_vocabs.push_back(std::move(v));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Vocab& v = g_vocabs[(data[0] & 7) % g_vocabs.size()];
  const bool add_special = data[0] & 8, parse_special = data[0] & 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& tok = *v.tok;

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids) {
    require(id >= 0 && id < tok.n_vocab());
    (void)tok.token_to_piece(id);
  }
  const std::string back = tok.decode(ids);
  bool representable = v.byte_level;
  for (char c : text) representable = representable && v.has_byte[static_cast<unsigned char>(c)];
  if (representable && !add_special && !parse_special && valid_utf8(text)) require(back == text);
  return 0;
}
