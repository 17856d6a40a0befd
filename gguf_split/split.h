// Per-node GGUF split: plan which tensors each stage file holds, then copy them
// with bounded memory. A part is an ordinary GGUF v3 with all source metadata
// plus `baton.split.*` keys saying which slice it is (engine/model/part_info.h reads them).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/base/temp_file.h"
#include "engine/gguf/file.h"
#include "engine/model/arch.h"  // LayerRange
#include "engine/model/files.h"
#include "engine/model/part_info.h"  // split_keys, read_part_info
#include "engine/tp/slice.h"

namespace baton {

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
// Prints "VERB X of Y (Z GB/s, ETA s)" on stderr at most twice a second
// (a line that rewrites itself on a terminal), and the last report.
Progress progress_printer(const char* verb);
std::string human_bytes(uint64_t b);  // "1.50 GiB", "12.00 MiB"

// Throws when the parts' folder has less free space than they need (a sparse
// source counts what it occupies), with both figures in the message.
void check_free_space(const ModelFiles& model, const SplitPlan& plan);

// Writes every part, or none: each goes to a temporary name and all are
// renamed once every one is complete (checks the free space first).
// Memory: one copy chunk plus metadata, whatever the model size.
void write_split(const ModelFiles& model, const SplitPlan& plan, const Progress& progress);

// What writing layer parts and rank files share (split.cpp, split_tp.cpp):
// the baton.split.* keys of part p among `count` parts of a source;
void set_part_keys(GgufWriter& w, const SplitPart& p, size_t count, uint64_t source_hash);
// w written under a temporary name beside `path`, its data checksum (what
// `digest` gives once every tensor byte has streamed through) patched in
// before the file is closed;
TempFile write_checksummed(GgufWriter& w, const std::string& path, const std::function<uint64_t()>& digest);
// and every file renamed into place, or none left behind: a rename that
// fails removes those already made.
void commit_all(std::vector<TempFile>& written);

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

// Tensor-parallel rank files (`baton split --tp N`, docs/SPLIT.md): every
// stage of `ranges` cut into N ranks by engine/tp/slice.h. Each rank file
// is a layer part (baton.split.* keys, checksum) and a smaller model of the
// same architecture (baton.tp.* keys, divided head and FFN counts).
struct TpRankFile {
  int part = 0, rank = 0;
  std::string path;
  std::vector<TpSlice> slices;            // in the file's tensor order
  std::vector<const TensorRef*> sources;  // the source tensor each slice is cut from
  std::vector<uint32_t> source_index;     // its index in the source table
  uint64_t bytes = 0;
};
struct TpSplitPlan {
  int n = 0;
  TpDims dims;
  SplitPlan stages;
  std::vector<TpRankFile> files;  // stage by stage, rank by rank
};
// Throws (naming the tensor, its shape, dtype and N) before anything is
// written when a cut cannot be made, or for an architecture without
// tensor-parallel files. File names: "STEM.tpN-rR.gguf" for one stage,
// "STEM-partI-of-K-layers-A-B.tpN-rR.gguf" for several.
TpSplitPlan plan_tp_split(const ModelFiles& model, const std::vector<LayerRange>& ranges, int n,
                          const std::string& out_dir, const std::string& stem);
// All files or none, like write_split; memory is one copy piece plus metadata.
void write_tp_split(const ModelFiles& model, const TpSplitPlan& plan, const Progress& progress);
// The rank files' headers only, each tensor's data a sparse hole (no data
// is read): what `baton plan --tp` plans each rank from, the very keys and
// tensor table the rank files get.
void write_tp_rank_headers(const ModelFiles& model, const TpSplitPlan& plan);
// Makes the rank files of `source_path` in out_dir (created if missing) and
// returns their paths, stage by stage, rank by rank. `layers` as for
// parse_layer_ranges; empty: one stage of the whole model.
std::vector<std::string> write_tp_ranks(const std::string& source_path, int n, const std::string& out_dir,
                                        const std::string& layers = "", const Progress& progress = nullptr);
bool is_tp_rank_file(const GgufFile& f);
// Rebuilds the source byte for byte from all rank files of all stages
// (merge_parts calls it when it is given rank files). Refuses a missing or
// repeated rank or part, files of another source, and damaged files.
void merge_tp_ranks(const std::vector<GgufFile>& files, const std::string& out_path, const Progress& progress);

}  // namespace baton
