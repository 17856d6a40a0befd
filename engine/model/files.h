// A model as stored on disk: one GGUF file, or a llama.cpp shard set
// (NAME-00001-of-0000N.gguf ... NAME-0000N-of-0000N.gguf) whose first shard
// holds the metadata and whose tensors are spread over all shards.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/gguf/file.h"

namespace baton {

struct TensorRef {
  const GgufFile* file;        // the file holding the bytes
  const GgufTensorInfo* info;  // its entry in that file's table
};

class ModelFiles {
 public:
  // `path` is a single GGUF or any shard of a set (all shards are opened and
  // checked: split.no, split.count, split.tensors.count, no duplicate names).
  // Throws GgufError / std::runtime_error naming the file and the problem.
  static ModelFiles open(const std::string& path);

  const GgufFile& meta() const { return files_.front(); }  // metadata source
  const std::vector<GgufFile>& files() const { return files_; }
  const std::vector<TensorRef>& tensors() const { return tensors_; }  // shard order
  const TensorRef* find(std::string_view name) const;

  // Identity of the model: the tensor-table hash over all tensors in order.
  // For a single file this equals GgufFile::tensor_table_hash().
  uint64_t tensor_table_hash() const { return hash_; }
  uint64_t tensor_bytes() const;  // sum of tensor data bytes

 private:
  std::vector<GgufFile> files_;
  std::vector<TensorRef> tensors_;
  std::unordered_map<std::string_view, size_t> index_;  // name -> tensors_ slot
  uint64_t hash_ = 0;
};

// Where a tensor belongs by the GGUF naming convention: one layer ("blk.N."),
// the embedding ("token_embd."), the output head ("output*": output,
// output_norm, output_hc_*; and a DSpark drafter's "mtp.*", which drafts
// through the head), or shared by every stage (anything else, e.g. rope
// frequency tables).
struct TensorPlace {
  enum Kind { kLayer, kEmbedding, kOutput, kShared } kind;
  int layer = -1;
};
TensorPlace tensor_place(std::string_view name);

// If `path` names a shard ("...-00002-of-00005.gguf"), the path of shard
// `index` (1-based) of the same set; otherwise "".
std::string shard_path(const std::string& path, int index, int* count = nullptr);

}  // namespace baton
