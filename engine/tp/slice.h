// Tensor-parallel slicing: how one tensor of a llama-family or deepseek4
// model is cut for N ranks. A rank's file is itself a smaller model of the
// same architecture (fewer heads or output groups, a narrower FFN or narrower
// experts, a slice of the vocabulary), so the unchanged forward runs on it;
// the engine sums the ranks' attention-output and FFN-down (MoE) products
// (all-reduce) and gathers the vocabulary-sliced logits.
//
// Deciding the cut needs only the metadata, the tensor's name, shape and dtype:
// the writer (gguf_split/split_tp.cpp) streams the bytes, and merge runs the
// cuts backwards from the `baton.tp.*` keys written beside them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/gguf/file.h"

namespace baton {

// Keys written into every rank file (besides `baton.split.*`, which every
// rank file also carries: its stage, the source tensor-table hash, the
// source index of each tensor and the data checksum).
namespace tp_keys {
inline constexpr const char* kPrefix = "baton.tp.";
inline constexpr const char* kRank = "baton.tp.rank";              // u32, from 0
inline constexpr const char* kSize = "baton.tp.size";              // u32, N
inline constexpr const char* kVocabBegin = "baton.tp.vocab_begin";  // u32: first vocabulary row of this rank's head
inline constexpr const char* kVocabCount = "baton.tp.vocab_count";  // u32: rows of this rank's head
// u8 array, one TpCut per tensor in the rank file's table order.
inline constexpr const char* kCuts = "baton.tp.cuts";
// String array: keys the rank file has and the source had not (merge drops them):
// attention.key_length / value_length, vocab_size.
inline constexpr const char* kAddedKeys = "baton.tp.added_keys";
// `baton.tp.source.KEY` holds the source's value of each key the rank file
// changed (merge puts it back in KEY's place).
inline constexpr const char* kSourcePrefix = "baton.tp.source.";
}  // namespace tp_keys

// The most ranks a rank file may claim: a file's keys are input from anyone,
// and a group's gathered logits take (V + N) floats a row.
inline constexpr int64_t kMaxTpRanks = 4096;

enum class TpCut : uint8_t {
  Replicated = 0,        // the whole tensor on every rank
  Rows = 1,              // a range of the outermost dimension (ne[1]; ne[0] of a 1-D bias)
  Columns = 2,           // a range of ne[0] in every row, on quantization block boundaries
  HeadFromEmbedding = 3,  // output.weight cut from token_embd rows (tied head); not in the source
  ExpertRows = 4          // a range of ne[1] in each of the ne[2] matrices (stacked experts' gate/up)
};
const char* tp_cut_name(TpCut c);

// What the slicing reads from the metadata. deepseek4: n_ff is the width of
// one routed expert (expert_feed_forward_length), n_head_kv is 1 (the one
// latent KV row, kept whole), o_groups the grouped output's groups.
struct TpDims {
  std::string arch;
  int n_head = 0, n_head_kv = 0;
  int head_dim_k = 0, head_dim_v = 0;
  int64_t n_embd = 0, n_ff = 0, n_vocab = 0;
  int o_groups = 0;             // deepseek4
  int64_t o_lora_rank = 0;      // deepseek4
  int64_t n_ff_shared = 0;      // deepseek4: the shared experts' width (n_ff x shared count)
  bool deepseek4() const { return arch == "deepseek4"; }
};
// Throws std::runtime_error for an architecture without tensor-parallel
// files or missing keys.
TpDims read_tp_dims(const GgufFile& meta);

// Rank r's vocabulary rows: [r*ceil(V/N), ...) clipped to V (the last slice may be shorter).
std::pair<int64_t, int64_t> tp_vocab_range(int64_t n_vocab, int n, int rank);

// One tensor of one rank: the cut, the range along the cut dimension
// [begin, begin+count), the rank's shape, and its byte size.
struct TpSlice {
  std::string name;
  TpCut cut = TpCut::Replicated;
  DType type = DType::F32;
  uint32_t n_dims = 1;
  int64_t ne[4] = {1, 1, 1, 1};
  int64_t begin = 0, count = 0;
  uint64_t nbytes = 0;
};

// The cut of `t` for rank `rank` of `n`. Throws std::runtime_error naming the
// tensor, its shape, dtype and N for a cut that cannot be made (N does not
// divide the heads or the FFN width, a column cut off a block boundary) or a
// tensor whose cut is unknown.
TpSlice tp_slice_tensor(const TpDims& d, const GgufTensorInfo& t, int n, int rank);
// The rank's output.weight of a tied head: token_embd's rows of its vocabulary slice.
TpSlice tp_tied_head_slice(const TpDims& d, const GgufTensorInfo& token_embd, int n, int rank);

// Checks every tensor of the model for every rank (the refusals above) before
// anything is written; also refuses N < 2 and N that does not divide n_head_kv or n_ff
// (deepseek4: the output groups and the expert width).
void tp_check_model(const TpDims& d, const std::vector<GgufTensorInfo>& tensors, int n);

// The rank file's metadata changes: (key, new value) for the keys it sets,
// in source order for keys the source has, then the added ones.
struct TpKeyChange {
  std::string key;
  GgufValue value;
  bool added = false;  // the source has no such key
};
std::vector<TpKeyChange> tp_key_changes(const GgufFile& meta, const TpDims& d, int n);

// The file name of rank `rank` of `n` for a file stem ("m" -> "m.tp2-r0.gguf").
std::string tp_rank_file_name(const std::string& stem, int n, int rank);

}  // namespace baton
