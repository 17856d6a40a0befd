#include "engine/model/part_info.h"

#include <stdexcept>
#include <string>
#include <string_view>

namespace baton {

uint64_t split_key_u64(const GgufFile& f, const char* key) {
  const GgufValue* v = f.find(key);
  if (!v) throw std::runtime_error(f.path() + ": missing key " + key + " (not a baton split part)");
  if (v->type != GgufType::UINT64) throw std::runtime_error(f.path() + ": key " + key + " is not a u64");
  return v->num.u;
}

std::string split_part_file_name(const std::string& stem, int index, int count, LayerRange range) {
  return stem + "-part" + std::to_string(index + 1) + "-of-" + std::to_string(count) + "-layers-" +
         std::to_string(range.first) + "-" + std::to_string(range.last) + ".gguf";
}

namespace {

// Reads `word` then one or more digits at `at`; false when they are not there.
bool take(std::string_view s, size_t& at, std::string_view word) {
  if (s.substr(at, word.size()) != word) return false;
  at += word.size();
  const size_t digits = at;
  while (at < s.size() && s[at] >= '0' && s[at] <= '9') ++at;
  return at > digits;
}

}  // namespace

std::string split_source_stem(const std::string& whole) {
  std::string stem = whole;
  // A tensor-parallel rank file's ".tpN-rR" comes last (engine/tp/slice.h).
  if (const size_t at = stem.rfind(".tp"); at != std::string::npos && at > 0) {
    size_t i = at;
    if (take(stem, i, ".tp") && take(stem, i, "-r") && i == stem.size()) stem.resize(at);
  }
  // "-partK-of-N-layers-A-B" at the end, after at least one character.
  for (size_t at = stem.rfind("-part"); at != std::string::npos && at > 0; at = stem.rfind("-part", at - 1)) {
    size_t i = at;
    if (take(stem, i, "-part") && take(stem, i, "-of-") && take(stem, i, "-layers-") && take(stem, i, "-") &&
        i == stem.size()) {
      return stem.substr(0, at);
    }
  }
  return stem;
}

std::optional<PartInfo> read_part_info(const GgufFile& f) {
  if (!f.has(split_keys::kSourceHash)) return std::nullopt;
  // Range-checked before narrowing: a u64 index of 2^32 must not read as 0.
  auto small_int = [&](const char* key) {
    const int64_t v = f.get_int(key);
    if (v < 0 || v > 1000000) throw std::runtime_error(f.path() + ": malformed baton.split keys (" + key + ")");
    return int(v);
  };
  PartInfo p;
  p.source_hash = split_key_u64(f, split_keys::kSourceHash);
  p.index = small_int(split_keys::kIndex);
  p.count = small_int(split_keys::kCount);
  p.range = LayerRange{small_int(split_keys::kLayerFirst), small_int(split_keys::kLayerLast)};
  p.has_embedding = f.get_bool(split_keys::kHasEmbedding, false);
  p.has_output = f.get_bool(split_keys::kHasOutput, false);
  if (p.count < 1 || p.index < 0 || p.index >= p.count || p.range.first < 0 || p.range.last < p.range.first) {
    throw std::runtime_error(f.path() + ": malformed baton.split keys");
  }
  return p;
}

}  // namespace baton
