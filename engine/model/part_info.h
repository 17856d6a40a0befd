// The slice of a model that a split part holds, read from its `baton.split.*`
// keys. It lives in the engine because everything that loads a part (the
// commands, the cluster engine, the worker) needs it, while writing parts is
// gguf_split's business (gguf_split/split.h).
#pragma once

#include <cstdint>
#include <optional>

#include "engine/model/arch.h"  // LayerRange
#include "engine/gguf/file.h"

namespace baton {

// Keys written into every part.
namespace split_keys {
inline constexpr const char* kLayerFirst = "baton.split.layer_first";
inline constexpr const char* kLayerLast = "baton.split.layer_last";
inline constexpr const char* kHasEmbedding = "baton.split.has_embedding";
inline constexpr const char* kHasOutput = "baton.split.has_output";
inline constexpr const char* kCount = "baton.split.count";
inline constexpr const char* kIndex = "baton.split.index";
inline constexpr const char* kSourceHash = "baton.split.source_tensor_table_hash";
inline constexpr const char* kDataChecksum = "baton.split.data_checksum";
// u32 array: each tensor's index in the source table (merge restores the order).
inline constexpr const char* kSourceIndex = "baton.split.source_index";
}  // namespace split_keys

// Nullopt for a file that is not a part. Throws for a part whose keys are malformed.
struct PartInfo {
  int index = 0, count = 0;
  LayerRange range;
  bool has_embedding = false;
  bool has_output = false;
  uint64_t source_hash = 0;
};
std::optional<PartInfo> read_part_info(const GgufFile& f);

// The file name `baton split` gives part `index` (from 0) of `count` of a
// model named `stem`: "STEM-partI-of-N-layers-FIRST-LAST.gguf" (no ':' in
// file names). `baton plan` prints configs that name the parts the same way.
std::string split_part_file_name(const std::string& stem, int index, int count, LayerRange range);
// The stem a part's file name was made from: "ds4-q4" for
// "ds4-q4-part1-of-2-layers-0-21" and for its tensor-parallel rank files
// "ds4-q4-part1-of-2-layers-0-21.tp2-r0" or "ds4-q4.tp2-r0"; any other stem as it is.
std::string split_source_stem(const std::string& stem);

// A split key stored as u64 (hashes may not fit the signed view of as_int()).
// Throws when the key is missing or of another type.
uint64_t split_key_u64(const GgufFile& f, const char* key);

}  // namespace baton
