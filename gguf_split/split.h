// Per-node GGUF split: plan which tensors each stage file holds, then copy them
// with bounded memory. A part is an ordinary GGUF v3 with all source metadata
// plus `baton.split.*` keys saying which slice it is.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/arch.h"  // LayerRange
#include "engine/model_files.h"

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
}  // namespace split_keys


// Parses "0:21,22:output" (a range's end may be "output", meaning the last
// layer). The ranges must cover 0..n_layer-1 contiguously, in order.
std::vector<LayerRange> parse_layer_ranges(const std::string& spec, int n_layer);

struct SplitPart {
  int index = 0;
  LayerRange range;
  bool has_embedding = false;
  bool has_output = false;
  std::vector<const TensorRef*> tensors;  // in source order
  uint64_t tensor_bytes = 0;
  std::string path;
};

struct SplitPlan {
  int n_layer = 0;
  uint64_t source_hash = 0;
  std::vector<SplitPart> parts;
};

// Block count of the model's architecture (`<arch>.block_count`).
int model_layer_count(const GgufFile& meta);

SplitPlan plan_split(const ModelFiles& model, const std::vector<LayerRange>& ranges,
                     const std::string& out_dir, const std::string& stem);

// Progress: bytes copied so far, total bytes.
using Progress = std::function<void(uint64_t done, uint64_t total)>;

// Writes every part (each through a temporary name, renamed when complete).
// Memory: one copy chunk plus metadata, whatever the model size.
void write_split(const ModelFiles& model, const SplitPlan& plan, const Progress& progress);

// The slice a split part holds, from its baton.split.* keys; nullopt for a
// file that is not a part. Throws for a part whose keys are malformed.
struct PartInfo {
  int index = 0, count = 0;
  LayerRange range;
  bool has_embedding = false;
  bool has_output = false;
  uint64_t source_hash = 0;
};
std::optional<PartInfo> read_part_info(const GgufFile& f);

// Checks a part's data checksum against its tensor bytes (reads the whole part).
// Returns "" when it matches, else the reason.
std::string verify_part(const GgufFile& part);

// Rebuilds the source from its parts: all metadata except baton.split.* keys, in
// source order, and every tensor once, in the source's tensor order... as far as
// the parts preserve it (parts keep source order within each part; the merge
// orders parts by index). Throws when parts are missing, duplicated or come
// from different sources.
void merge_parts(const std::vector<std::string>& part_paths, const std::string& out_path,
                 const Progress& progress);

}  // namespace baton
