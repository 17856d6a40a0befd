// Writes the seed corpus for fuzz_split: real parts of a tiny two-layer model
// made by plan_split/write_split, and a llama.cpp-style shard set, joined the
// way fuzz_split reads its input. Usage: fuzz_split_corpus OUT_DIR (the
// committed corpus lives in tests/fuzz/corpus/split/).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/model/files.h"
#include "gguf_split/split.h"

using namespace baton;
namespace fs = std::filesystem;

namespace {

const std::string kSeparator = "\n--next-part--\n";

std::vector<uint8_t> bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + i * 37);
  return b;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void put(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary).write(s.data(), std::streamsize(s.size())); }

// A model with every tensor placement: embedding, two layers, head, shared.
void tiny_model(GgufWriter& w) {
  w.set("general.architecture", GgufValue::of_str("llama"));
  w.set("llama.block_count", GgufValue::of_u32(2));
  w.add_tensor("token_embd.weight", DType::F32, {4, 2}, bytes(32, 1));
  w.add_tensor("rope_freqs.weight", DType::F32, {2}, bytes(8, 2));
  w.add_tensor("blk.0.attn_q.weight", DType::Q8_0, {32, 1}, bytes(34, 3));
  w.add_tensor("blk.1.attn_q.weight", DType::F16, {4, 2}, bytes(16, 4));
  w.add_tensor("output.weight", DType::F32, {4, 2}, bytes(32, 5));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_split_corpus OUT_DIR\n");
    return 1;
  }
  const fs::path out = argv[1];
  const fs::path tmp = fs::temp_directory_path() / "baton-split-corpus";
  fs::create_directories(tmp);

  GgufWriter src;
  tiny_model(src);
  src.write((tmp / "tiny.gguf").string());
  const ModelFiles model = ModelFiles::open((tmp / "tiny.gguf").string());

  // Two parts: in order, alone, swapped, and with one repeated.
  SplitPlan plan = plan_split(model, parse_layer_ranges("0:0,1:1", 2), tmp.string(), "tiny");
  write_split(model, plan, nullptr);
  const std::string p1 = slurp(plan.parts[0].path), p2 = slurp(plan.parts[1].path);
  put(out / "two_parts", p1 + kSeparator + p2);
  put(out / "one_part", p1);
  put(out / "parts_swapped", p2 + kSeparator + p1);
  put(out / "part_repeated", p1 + kSeparator + p1 + kSeparator + p2);

  SplitPlan whole = plan_split(model, parse_layer_ranges("0:1", 2), tmp.string(), "whole");
  write_split(model, whole, nullptr);
  put(out / "single_part_set", slurp(whole.parts[0].path));

  // A llama.cpp shard set: metadata in the first shard, tensors spread.
  GgufWriter s1, s2;
  s1.set("general.architecture", GgufValue::of_str("llama"));
  s1.set("llama.block_count", GgufValue::of_u32(1));
  s1.set("split.no", GgufValue::of_u32(0));
  s1.set("split.count", GgufValue::of_u32(2));
  s1.set("split.tensors.count", GgufValue::of_i32(2));
  s1.add_tensor("token_embd.weight", DType::F32, {4, 1}, bytes(16, 6));
  s2.set("split.no", GgufValue::of_u32(1));
  s2.set("split.count", GgufValue::of_u32(2));
  s2.add_tensor("blk.0.ffn_up.weight", DType::F32, {2, 2}, bytes(16, 7));
  s1.write((tmp / "s1.gguf").string());
  s2.write((tmp / "s2.gguf").string());
  put(out / "shard_set", slurp(tmp / "s1.gguf") + kSeparator + slurp(tmp / "s2.gguf"));

  fs::remove_all(tmp);
  return 0;
}
