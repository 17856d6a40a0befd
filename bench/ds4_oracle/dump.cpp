#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>
#include "engine/deepseek4_shape.h"
#include "engine/gguf.h"
#include "engine/stage.h"
#include "kernels/quant.h"
namespace baton {
Deepseek4Shape small_shape() {
  Deepseek4Shape s = Deepseek4Shape::tiny();
  s.n_embd = 64;
  s.n_vocab = 50;
  s.n_ctx_train = 1024;
  s.n_head = 4;
  s.head_dim = 32;
  s.rope_dim = 16;
  s.q_lora_rank = 32;
  s.o_lora_rank = 16;
  s.o_groups = 2;
  s.n_expert = 6;
  s.n_expert_used = 2;
  s.n_expert_shared = 1;
  s.n_ff_exp = 32;
  s.n_hash_layers = 2;
  s.sliding_window = 16;
  s.idx_n_head = 2;
  s.idx_head_dim = 32;
  s.idx_top_k = 8;
  s.compress_ratios = {0, 0, 4, 128, 4};
  // Low clamps on two layers so that the clamp really cuts.
  s.swiglu_clamp = {10.0f, 0.05f, 10.0f, 0.1f, 10.0f};
  s.yarn_factor = 4;
  s.yarn_orig_ctx = 256;
  return s;
}

// dtype of a tensor by role and layer (-1: not a layer tensor).
using TypeFn = std::function<DType(Ds4Role role, int layer)>;

DType f32_types(Ds4Role role, int) {
  switch (role) {
    case Ds4Role::Embedding: case Ds4Role::HcFn: case Ds4Role::Compressor: case Ds4Role::Indexer: return DType::F16;
    case Ds4Role::HashTable: return DType::I32;
    default: return DType::F32;
  }
}

float uniform(std::mt19937_64& rng) { return float(double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }

// Writes the model; with `as_f32`, every quantized matrix is stored as the
// F32 values its blocks decode to (a twin with the same numbers).
void write_model(const std::string& path, const Deepseek4Shape& s, const TypeFn& type_of, uint64_t seed,
                 bool as_f32 = false) {
  std::mt19937_64 rng(seed);
  GgufWriter w;
  s.write_keys(w);
  auto add = [&](const Ds4TensorSpec& spec, int layer) {
    const DType t = type_of(spec.role, layer);
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const int64_t cols = spec.shape[0], rows = n / cols;
    if (t == DType::I32) {  // tid2eid: distinct experts per token
      std::vector<uint8_t> bytes(size_t(n) * 4);
      std::vector<int32_t> ids(size_t(s.n_expert));
      for (int64_t r = 0; r < rows; ++r) {
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        std::memcpy(bytes.data() + r * cols * 4, ids.data(), size_t(cols) * 4);
      }
      w.add_tensor(spec.name, t, spec.shape, std::move(bytes));
      return;
    }
    double scale = 1.0 / std::sqrt(double(cols)), offset = 0;
    if (spec.role == Ds4Role::Norm) scale = 0.3, offset = 1.0;
    if (spec.role == Ds4Role::HcParam || spec.role == Ds4Role::Sinks || spec.role == Ds4Role::RouterBias) scale = 0.5;
    if (spec.name.find("_ape.") != std::string::npos) scale = 0.5;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = float(offset + scale * uniform(rng));
    const uint64_t row_bytes = *dtype_bytes(t, uint64_t(cols));
    std::vector<uint8_t> bytes(size_t(row_bytes * uint64_t(rows)));
    if (dtype_info(t).quantize) {
      for (int64_t r = 0; r < rows; ++r) quantize_row(t, v.data() + r * cols, bytes.data() + r * row_bytes, cols);
    } else {
      random_blocks(t, bytes.data(), int64_t(bytes.size() / dtype_info(t).block_bytes), rng());
    }
    if (as_f32 && t != DType::F32) {
      std::vector<uint8_t> f(size_t(n) * 4);
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(t, bytes.data() + r * row_bytes, reinterpret_cast<float*>(f.data()) + r * cols, cols);
      }
      w.add_tensor(spec.name, DType::F32, spec.shape, std::move(f));
      return;
    }
    w.add_tensor(spec.name, t, spec.shape, std::move(bytes));
  };
  for (const auto& t : s.embedding_tensors()) add(t, -1);
  for (int l = 0; l < s.n_layer; ++l) {
    for (const auto& t : s.layer_tensors(l)) add(t, l);
  }
  for (const auto& t : s.head_tensors()) add(t, -1);
  w.write(path);
}


}
using namespace baton;
int main(int argc, char** argv) {
  std::string dir = argv[1];
  int n_tok = atoi(argv[2]);
  Deepseek4Shape s = small_shape();
  s.swiglu_clamp.assign(5, 0.1f);
  if (argc > 3) s.idx_top_k = atoi(argv[3]);
  if (argc > 4) s.idx_n_head = atoi(argv[4]);
  write_model(dir + "/model.gguf", s, f32_types, 12345);
  std::mt19937_64 rng(99);
  std::vector<int32_t> tokens(n_tok);
  for (auto& t : tokens) t = int32_t(rng() % 50);
  GgufFile f = GgufFile::open(dir + "/model.gguf");
  StageConfig c; c.n_ctx = 320; c.max_batch = 320; c.n_threads = 2; c.all_logits = true;
  Stage st(f, c);
  auto out = st.forward(0, tokens);
  FILE* fp = fopen((dir + "/tokens.bin").c_str(), "wb"); fwrite(tokens.data(), 4, tokens.size(), fp); fclose(fp);
  fp = fopen((dir + "/logits.bin").c_str(), "wb"); fwrite(out.data(), 4, out.size(), fp); fclose(fp);
  printf("ok %zu logits\n", out.size());
}
