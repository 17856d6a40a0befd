// Hostile GGUF images for the reader's tests (in-process and through the CLI):
// each is a valid file with one field broken, with the text the error must
// contain. Most are patches of the stories260K fixture, a real v3 file, so the
// broken field sits among realistic metadata and tensor infos.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tests/test_util.h"

namespace baton::test {

struct HostileGguf {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string expect;  // substring of the error message
};

template <class T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  if (at + sizeof v > b.size()) throw std::runtime_error("poke past the end of the image");
  std::memcpy(b.data() + at, &v, sizeof v);
}
inline void poke_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) { poke(b, at, v); }
inline void poke_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) { poke(b, at, v); }

// Offset just past the length-prefixed string `s` (a key or tensor name) in
// the header: the start of the field that follows it.
inline size_t after_string(const std::vector<uint8_t>& b, std::string_view s) {
  std::string_view all(reinterpret_cast<const char*>(b.data()), b.size());
  for (size_t at = all.find(s); at != std::string_view::npos; at = all.find(s, at + 1)) {
    uint64_t len = 0;
    if (at >= 8) std::memcpy(&len, b.data() + at - 8, 8);
    if (len == s.size()) return at + s.size();
  }
  throw std::runtime_error("string not found in GGUF header: " + std::string(s));
}

inline void rename_string(std::vector<uint8_t>& b, std::string_view from, std::string_view to) {
  if (from.size() != to.size()) throw std::runtime_error("rename_string needs equal lengths");
  size_t at = after_string(b, from) - from.size();
  std::memcpy(b.data() + at, to.data(), to.size());
}

// Minimal little-endian image builder for files the writer refuses to make.
struct RawGguf {
  std::vector<uint8_t> b;
  RawGguf(uint64_t n_tensors, uint64_t n_kv) {
    bytes("GGUF", 4);
    u32(3);
    u64(n_tensors);
    u64(n_kv);
  }
  void bytes(const void* p, size_t n) {
    auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
  void u8(uint8_t v) { bytes(&v, 1); }
  void u32(uint32_t v) { bytes(&v, 4); }
  void u64(uint64_t v) { bytes(&v, 8); }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
};

// The hostile images; stories260K.gguf must be present.
inline std::vector<HostileGguf> hostile_ggufs() {
  const std::vector<uint8_t> good = read_file(model_path("stories260K.gguf"));
  std::vector<HostileGguf> out;
  auto patched = [&](std::string name, std::string expect, auto&& patch) {
    std::vector<uint8_t> b = good;
    patch(b);
    out.push_back({std::move(name), std::move(b), std::move(expect)});
  };
  constexpr uint64_t k2p63 = uint64_t(1) << 63;

  patched("bad_magic", "not a GGUF file", [](auto& b) { b[0] = 'X'; });
  patched("version_1", "GGUF version 1 is not supported (need 2 or 3)", [](auto& b) { poke_u32(b, 4, 1); });
  patched("version_4", "GGUF version 4 is not supported (need 2 or 3)", [](auto& b) { poke_u32(b, 4, 4); });
  patched("big_endian_version", "big-endian", [](auto& b) { poke_u32(b, 4, 0x03000000u); });
  patched("tensor_count_too_big", "tensor count 1099511627776 cannot fit",
          [](auto& b) { poke_u64(b, 8, uint64_t(1) << 40); });
  patched("kv_count_too_big", "metadata key count 1099511627776 cannot fit",
          [](auto& b) { poke_u64(b, 16, uint64_t(1) << 40); });
  patched("key_length_2p63", "key length 9223372036854775808 exceeds",
          [&](auto& b) { poke_u64(b, 24, k2p63); });
  // general.architecture: u32 type, then the string value's u64 length.
  patched("string_length_2p63", "string length 9223372036854775808 exceeds",
          [&](auto& b) { poke_u64(b, after_string(b, "general.architecture") + 4, k2p63); });
  // tokenizer.ggml.tokens: u32 type, u32 element type, u64 count.
  patched("array_length_2p63", "array length 9223372036854775808 of str cannot fit",
          [&](auto& b) { poke_u64(b, after_string(b, "tokenizer.ggml.tokens") + 8, k2p63); });
  patched("unknown_value_type", "unknown metadata value type 13",
          [](auto& b) { poke_u32(b, after_string(b, "general.name"), 13); });
  patched("duplicate_key", "'tokenizer.ggml.bos_token_id': duplicate metadata key",
          [](auto& b) { rename_string(b, "tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id"); });
  // Tensor info: u32 n_dims, n_dims x i64, u32 type, u64 offset.
  patched("unknown_tensor_type", "tensor 'token_embd.weight': unknown tensor type id 99",
          [](auto& b) { poke_u32(b, after_string(b, "token_embd.weight") + 4 + 16, 99); });
  patched("n_dims_0", "dimension count 0 is outside 1..4",
          [](auto& b) { poke_u32(b, after_string(b, "token_embd.weight"), 0); });
  patched("n_dims_5", "dimension count 5 is outside 1..4",
          [](auto& b) { poke_u32(b, after_string(b, "token_embd.weight"), 5); });
  patched("dims_overflow", "element count overflows", [](auto& b) {
    size_t at = after_string(b, "token_embd.weight") + 4;
    poke_u64(b, at, uint64_t(1) << 32);
    poke_u64(b, at + 8, uint64_t(1) << 32);
  });
  patched("negative_dim", "dimension 1 is -5 (must be at least 1)",
          [](auto& b) { poke_u64(b, after_string(b, "token_embd.weight") + 4 + 8, uint64_t(-5)); });
  patched("zero_dim", "dimension 0 is 0 (must be at least 1)",
          [](auto& b) { poke_u64(b, after_string(b, "token_embd.weight") + 4, 0); });
  patched("row_length", "tensor 'blk.0.ffn_down.weight': row length 172 is not a multiple of the Q8_0 block size 32",
          [](auto& b) { poke_u32(b, after_string(b, "blk.0.ffn_down.weight") + 4 + 16, 8); });
  patched("misaligned_offset", "data offset 131076 is not a multiple of the alignment 32",
          [](auto& b) { poke_u64(b, after_string(b, "output_norm.weight") + 4 + 8 + 4, 131072 + 4); });
  patched("offset_past_end", "extends past the end of the file",
          [](auto& b) { poke_u64(b, after_string(b, "output_norm.weight") + 4 + 8 + 4, uint64_t(1) << 40); });
  patched("overlapping_tensors", "overlaps tensor",
          [](auto& b) { poke_u64(b, after_string(b, "output_norm.weight") + 4 + 8 + 4, 0); });
  patched("duplicate_tensor_name", "tensor 'blk.0.attn_q.weight': duplicate tensor name",
          [](auto& b) { rename_string(b, "blk.0.attn_k.weight", "blk.0.attn_q.weight"); });
  patched("truncated_data", "extends past the end of the file", [](auto& b) { b.pop_back(); });

  auto raw_kv = [&](std::string name, std::string expect, auto&& value) {
    RawGguf g(0, 1);
    value(g);
    out.push_back({std::move(name), std::move(g.b), std::move(expect)});
  };
  raw_kv("alignment_48", "general.alignment 48 is not a nonzero power of two", [](RawGguf& g) {
    g.str("general.alignment");
    g.u32(4);
    g.u32(48);
  });
  raw_kv("alignment_0", "general.alignment 0 is not a nonzero power of two", [](RawGguf& g) {
    g.str("general.alignment");
    g.u32(4);
    g.u32(0);
  });
  raw_kv("alignment_i32", "general.alignment has type i32, expected u32", [](RawGguf& g) {
    g.str("general.alignment");
    g.u32(5);
    g.u32(32);
  });
  raw_kv("bool_2", "bool value 2 is neither 0 nor 1", [](RawGguf& g) {
    g.str("flag");
    g.u32(7);
    g.u8(2);
  });
  raw_kv("nested_too_deep", "arrays nested deeper than 8 levels", [](RawGguf& g) {
    g.str("deep");
    g.u32(9);
    for (int level = 0; level < 9; ++level) {
      g.u32(9);  // element type: array
      g.u64(1);
    }
    g.u32(0);
  });
  raw_kv("empty_key", "empty key", [](RawGguf& g) {
    g.str("");
    g.u32(4);
    g.u32(1);
  });
  out.push_back({"empty_file", {}, "file ends inside the magic"});
  out.push_back({"legacy_v2_q8_0", read_file(model_path("tinyllamas-stories-260k-q8_0.gguf")),
                 "tensor 'blk.0.ffn_down.weight': row length 172 is not a multiple of the Q8_0 block size 32"});
  return out;
}

// The classes of the reader's refusals, each named by a phrase of its message. The first match
// names a message, so the more specific phrase of two that can both occur comes first ("data
// offset ... is not a multiple of the alignment" before a row length's "is not a multiple of").
// A refusal that matches none is a new kind of error that the tests must learn about.
inline std::string gguf_error_class(std::string_view msg) {
  static constexpr std::pair<std::string_view, std::string_view> kClasses[] = {
      {"magic", "not a GGUF file"},
      {"version", "is not supported (need 2 or 3)"},
      {"truncated", "file ends inside the "},
      {"length exceeds the file", " exceeds the "},
      {"count cannot fit", " cannot fit in the "},
      {"too many values", "metadata holds more than "},
      {"value type", "unknown metadata value type "},
      {"bool", "is neither 0 nor 1"},
      {"nesting", "arrays nested deeper than "},
      {"empty key", "empty key"},
      {"duplicate key", "duplicate metadata key"},
      {"alignment", "general.alignment "},
      {"empty tensor name", "empty tensor name"},
      {"duplicate tensor name", "duplicate tensor name"},
      {"dimension count", "dimension count "},
      {"dimension value", "(must be at least 1)"},
      {"size overflow", " overflows"},
      {"tensor type", "unknown tensor type id "},
      {"offset alignment", "is not a multiple of the alignment"},
      {"row length", "row length "},
      {"data past the end", "extends past the end of the file"},
      {"overlap", " overlaps tensor "},
  };
  for (const auto& [name, phrase] : kClasses) {
    if (msg.find(phrase) != std::string_view::npos) return std::string(name);
  }
  return {};
}

// A copy of `file` with 1-4 random bytes of its header (the first `header` bytes) rewritten.
// Half the writes go to the first 64 bytes, where the counts, the first keys and the small fields
// are; the rest anywhere in the header, which ends with the tensor infos.
inline std::vector<uint8_t> corrupt_header(const std::vector<uint8_t>& file, uint64_t header,
                                           std::mt19937_64& rng) {
  std::vector<uint8_t> b = file;
  const int writes = 1 + int(rng() % 4);
  for (int k = 0; k < writes; ++k) {
    const size_t at = rng() % 2 ? rng() % 64 : rng() % header;
    b[at] = uint8_t(rng());
  }
  return b;
}

}  // namespace baton::test
