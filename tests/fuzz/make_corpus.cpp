// Writes the seed corpus for fuzz_gguf: a few tiny valid GGUF files made with
// the writer. Usage: fuzz_gguf_corpus OUT_DIR (the committed corpus lives in
// tests/fuzz/corpus/gguf/).
#include <cstdio>
#include <string>
#include <vector>

#include "engine/gguf/file.h"

using namespace baton;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_gguf_corpus OUT_DIR\n");
    return 1;
  }
  const std::string dir = argv[1];
  auto bytes = [](size_t n, uint8_t seed) {
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + i * 37);
    return b;
  };

  GgufWriter empty;
  empty.write(dir + "/empty.gguf");

  // Every metadata value type, a nested array and an empty one; no tensors.
  GgufWriter meta;
  meta.set("general.architecture", GgufValue::of_str("llama"));
  meta.set("u32", GgufValue::of_u32(7));
  meta.set("i32", GgufValue::of_i32(-7));
  meta.set("u64", GgufValue::of_u64(1ull << 40));
  meta.set("f32", GgufValue::of_f32(0.5f));
  meta.set("bool", GgufValue::of_bool(true));
  GgufValue small;
  small.type = GgufType::INT8;
  small.num.i = -3;
  meta.set("i8", small);
  GgufValue f64;
  f64.type = GgufType::FLOAT64;
  f64.num.f = 1e-300;
  meta.set("f64", f64);
  meta.set("tokens", GgufValue::of_array(GgufType::STRING, {GgufValue::of_str("<s>"), GgufValue::of_str("a")}));
  meta.set("nested", GgufValue::of_array(GgufType::ARRAY, {GgufValue::of_array(GgufType::UINT32, {GgufValue::of_u32(1)}),
                                                           GgufValue::of_array(GgufType::BOOL, {})}));
  meta.write(dir + "/metadata.gguf");

  // Two tensors of a plain and a block type at the default alignment.
  GgufWriter two;
  two.set("general.architecture", GgufValue::of_str("llama"));
  two.add_tensor("token_embd.weight", DType::F32, {4, 3}, bytes(48, 1));
  two.add_tensor("blk.0.attn_q.weight", DType::Q8_0, {32, 2}, bytes(68, 2));
  two.write(dir + "/tensors.gguf");

  // A custom alignment and a 4-d tensor.
  GgufWriter aligned;
  aligned.set("general.alignment", GgufValue::of_u32(16));
  aligned.add_tensor("a", DType::F16, {2, 1, 2, 2}, bytes(16, 3));
  aligned.add_tensor("b", DType::I32, {3}, bytes(12, 4));
  aligned.write(dir + "/aligned16.gguf");
  return 0;
}
