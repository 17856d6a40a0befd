// deepseek4 on the CPU: tiny deepseek4 GGUFs written here (every layer kind:
// sliding-only, ratio 4 with the indexer, ratio 128; hash and top-k MoE),
// seeded random weights. Checks: pipeline stages equal the whole model (the
// boundary is the HC state), token-by-token decode equals batched and chunked
// prefill over a prompt that emits many compressed rows and exceeds the
// indexer's top-k, the plan lines equal the shape's formulas, the
// hyper-connection and routing math against direct computations, and
// quantized expert types (Q4_K, Q2_K, IQ2_XXS, mixed by layer) against the
// same values stored as F32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "engine/model/deepseek4_shape.h"
#include "engine/gguf/file.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/stage.h"
#include "kernels/quant.h"
#include "tests/test_util.h"

namespace baton {
namespace {

// Hidden 64, 4 heads of 32 (RoPE on the last 16), window 16, 6 experts (top
// 2, one shared), 2 hash layers, layers [sliding, sliding, 4, 128, 4].
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
  s.idx_n_head = 16;  // many heads: an all-zero (tied) indexer score is rare, as in the real model
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

std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int64_t vocab) {
  std::mt19937_64 rng(seed ^ 0x70c3);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return t;
}

StageConfig config(int64_t n_ctx, int64_t max_batch, int threads) {
  StageConfig c;
  c.n_ctx = n_ctx;
  c.max_batch = max_batch;
  c.n_threads = threads;
  c.all_logits = true;
  return c;
}

// Feeds tokens in chunks; returns every position's logits (or boundary rows).
std::vector<float> run_chunks(Stage& st, const std::vector<int32_t>& tokens, size_t chunk) {
  std::vector<float> out;
  for (size_t at = 0; at < tokens.size(); at += chunk) {
    const size_t n = std::min(chunk, tokens.size() - at);
    auto got = st.forward(0, std::span<const int32_t>(tokens.data() + at, n));
    out.insert(out.end(), got.begin(), got.end());
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0f, std::fabs(want[i]))) << what << " at " << i;
  }
}

class Deepseek4Engine : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::test_seed();
    path_ = dir_.file("ds4.gguf");
    write_model(path_, shape_, f32_types, seed_);
  }
  uint64_t seed_ = 0;
  test::TempDir dir_;
  std::string path_;
  Deepseek4Shape shape_ = small_shape();
};

// 280 tokens: 70 ratio-4 rows (the indexer keeps 8 of them), 2 ratio-128
// rows, and the 16-row window ring wraps many times.
constexpr size_t kPrompt = 280;
constexpr int64_t kCtx = 320;

TEST_F(Deepseek4Engine, DecodeEqualsPrefillAndChunks) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  GgufFile f = GgufFile::open(path_);
  const auto tokens = random_tokens(seed_, kPrompt, shape_.n_vocab);
  Stage whole(f, config(kCtx, 512, 2));
  auto span = whole.forward(0, tokens);
  const std::vector<float> want(span.begin(), span.end());
  ASSERT_EQ(want.size(), kPrompt * size_t(shape_.n_vocab));
  Stage decode(f, config(kCtx, 1, 1));
  expect_close(run_chunks(decode, tokens, 1), want, 1e-4f, "decode");
  Stage chunks(f, config(kCtx, 37, 3));
  expect_close(run_chunks(chunks, tokens, 37), want, 1e-4f, "chunks of 37");
  // reset() forgets the sequence: the same prompt gives the same logits.
  chunks.reset(0);
  expect_close(run_chunks(chunks, tokens, 37), want, 0.0f, "after reset");
}

TEST_F(Deepseek4Engine, PipelineStagesEqualWholeModel) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  GgufFile f = GgufFile::open(path_);
  const auto tokens = random_tokens(seed_, 150, shape_.n_vocab);
  Stage whole(f, config(kCtx, 64, 2));
  const auto want = run_chunks(whole, tokens, 64);
  StageConfig a = config(kCtx, 64, 2), b = config(kCtx, 64, 2);
  a.last_layer = 1;
  a.head = false;
  b.first_layer = 2;
  b.embedding = false;
  Stage first(f, a), second(f, b);
  EXPECT_EQ(first.boundary_width(), 4 * shape_.n_embd);
  std::vector<float> got;
  // Prefill in chunks, then decode steps, through both stages.
  for (size_t at = 0; at < tokens.size();) {
    const size_t n = at < 128 ? std::min<size_t>(64, 128 - at) : 1;
    auto act = first.forward(0, std::span<const int32_t>(tokens.data() + at, n));
    ASSERT_EQ(act.size(), n * size_t(first.boundary_width()));
    const std::vector<float> boundary(act.begin(), act.end());
    auto out = second.forward(0, boundary, int64_t(n));
    got.insert(got.end(), out.begin(), out.end());
    at += n;
  }
  expect_close(got, want, 1e-5f, "two stages");
}

TEST_F(Deepseek4Engine, HashLayerNeedsTokenIds) {
  GgufFile f = GgufFile::open(path_);
  StageConfig c = config(64, 8, 1);
  c.first_layer = 1;
  c.embedding = false;
  Stage st(f, c);
  std::vector<float> in(size_t(st.boundary_width()), 0.5f);
  try {
    st.forward(0, in, 1);
    FAIL() << "a hash layer ran without token ids";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hash layer"), std::string::npos) << e.what();
  }
}

TEST_F(Deepseek4Engine, PlanLinesEqualTheShapeFormulas) {
  GgufFile f = GgufFile::open(path_);
  for (auto [first, last] : {std::pair{0, 4}, {0, 1}, {2, 4}, {3, 3}}) {
    SCOPED_TRACE(std::to_string(first) + ".." + std::to_string(last));
    StageConfig c = config(kCtx, 32, 2);
    c.first_layer = first;
    c.last_layer = last;
    c.n_seq = 2;
    MemoryPlan plan = Stage::plan(f, c);
    uint64_t kv = 0;
    for (int l = first; l <= last; ++l) kv += shape_.kv_bytes(l, kCtx, Ds4KvStorage::F32);
    EXPECT_EQ(plan.bytes(PlanLine::KvCache), 2 * kv);
    WorkspaceShape ws;
    ws.max_batch = 32;
    ws.n_ctx = kCtx;
    ws.n_threads = 2;
    ws.head = true;
    ws.embedding = true;
    ws.max_logit_rows = 32;
    ws.layers = {first, last};
    EXPECT_EQ(plan.bytes(PlanLine::Workspace), shape_.workspace_bytes(ws, {first, last}));
  }
  // A sliding-only layer keeps just its window ring.
  auto arch = Arch::from_gguf(f);
  auto streams = arch->kv_layer_streams(0, kCtx);
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_EQ(streams[0].rows, shape_.sliding_window);
  EXPECT_EQ(arch->kv_layer_streams(2, kCtx).size(), 5u);  // window, rows, state, index rows, index state
  EXPECT_EQ(arch->kv_layer_streams(3, kCtx).size(), 3u);
}

// ------------------------------------------------------------ hand checks

TEST(Deepseek4Math, HyperConnectionWeightsAreDoublyStochastic) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int n = 4;
  std::vector<float> mix(size_t(n * (n + 2))), base(mix.size());
  for (auto& v : mix) v = 2 * uniform(rng);
  for (auto& v : base) v = uniform(rng);
  const float scale[3] = {0.7f, 1.3f, 2.0f};
  const std::vector<float> raw = mix;
  ds4_hc_weights(mix.data(), n, scale, base.data(), 20, 1e-6f);
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(mix[size_t(i)], 1.0 / (1.0 + std::exp(-(raw[size_t(i)] * 0.7 + base[size_t(i)]))) + 1e-6, 1e-6);
    EXPECT_NEAR(mix[size_t(n + i)], 2.0 / (1.0 + std::exp(-(raw[size_t(n + i)] * 1.3 + base[size_t(n + i)]))), 1e-6);
  }
  const float* comb = mix.data() + 2 * n;
  for (int i = 0; i < n; ++i) {
    double row = 0, col = 0;
    for (int j = 0; j < n; ++j) {
      row += comb[i * n + j];
      col += comb[j * n + i];
      EXPECT_GT(comb[i * n + j], 0.0f);
    }
    EXPECT_NEAR(row, 1.0, 1e-4) << "row " << i;
    EXPECT_NEAR(col, 1.0, 1e-5) << "column " << i;
  }
  // One iteration is the row softmax (+eps) then a single column normalisation.
  std::vector<float> one = raw;
  ds4_hc_weights(one.data(), n, scale, base.data(), 1, 0.0f);
  for (int k = 0; k < n; ++k) {
    double col = 0;
    std::vector<double> sm(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      double mx = -1e30, sum = 0;
      for (int c = 0; c < n; ++c) mx = std::max(mx, double(raw[size_t(2 * n + j * n + c)]) * 2.0 + base[size_t(2 * n + j * n + c)]);
      for (int c = 0; c < n; ++c) sum += std::exp(double(raw[size_t(2 * n + j * n + c)]) * 2.0 + base[size_t(2 * n + j * n + c)] - mx);
      sm[size_t(j)] = std::exp(double(raw[size_t(2 * n + j * n + k)]) * 2.0 + base[size_t(2 * n + j * n + k)] - mx) / sum;
      col += sm[size_t(j)];
    }
    for (int j = 0; j < n; ++j) EXPECT_NEAR(one[size_t(2 * n + j * n + k)], sm[size_t(j)] / col, 1e-6);
  }
}

TEST(Deepseek4Math, RoutingPicksTheExpectedExperts) {
  // Scores rise with the id; the bias lifts expert 0 over all of them.
  std::vector<float> logits = {0, 1, 2, 3, 4, 5};
  const std::vector<float> bias = {10, 0, 0, 0, 0, 0};
  int32_t ids[2];
  float w[2];
  std::vector<float> s = logits;
  ds4_route(s.data(), 6, bias.data(), nullptr, 2, true, 1.5f, ids, w);
  auto score = [](double x) { return std::sqrt(std::log1p(std::exp(x))); };
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 2), (std::vector<int32_t>{0, 5}));
  const double s0 = score(0), s5 = score(5);
  EXPECT_NEAR(w[0], 1.5 * s0 / (s0 + s5), 1e-6);  // unbiased scores weigh
  EXPECT_NEAR(w[1], 1.5 * s5 / (s0 + s5), 1e-6);
  // Without the bias: the two largest; unnormalised weights are the scores.
  s = logits;
  ds4_route(s.data(), 6, nullptr, nullptr, 2, false, 1.0f, ids, w);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 2), (std::vector<int32_t>{5, 4}));
  EXPECT_NEAR(w[0], score(5), 1e-6);
  // Hash routing takes the table's experts whatever the scores.
  const int32_t hash[2] = {2, 1};
  s = logits;
  ds4_route(s.data(), 6, bias.data(), hash, 2, true, 1.0f, ids, w);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 2), (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(w[0], score(2) / (score(2) + score(1)), 1e-6);
  // softplus is linear above 20, as torch has it.
  s = {30.0f, 0.0f};
  ds4_route(s.data(), 2, nullptr, nullptr, 1, false, 1.0f, ids, w);
  EXPECT_NEAR(w[0], std::sqrt(30.0), 1e-5);
}

TEST(Deepseek4Math, YarnFrequencies) {
  // Factor 1 is plain RoPE; YaRN keeps the fastest dims and divides the slowest by the factor.
  auto plain = ds4_rope_freqs(64, 160000, 1.0, 32, 1, 65536);
  auto yarn = ds4_rope_freqs(64, 160000, 16.0, 32, 1, 65536);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(plain[size_t(i)], std::pow(160000.0, -2.0 * i / 64), 1e-6 * plain[size_t(i)]);
  EXPECT_FLOAT_EQ(yarn[0], plain[0]);
  EXPECT_FLOAT_EQ(yarn[31], plain[31] / 16.0f);
  for (int i = 0; i < 32; ++i) EXPECT_LE(yarn[size_t(i)], plain[size_t(i)]);
}

// ------------------------------------------------------------ quantized experts

TEST(Deepseek4Quant, ExpertTypesMatchTheirF32Values) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Rows of 256 so every expert type fits its blocks; layer 2 and 4 Q4_K,
  // the others IQ2_XXS gate/up with Q2_K down (a mixed file).
  Deepseek4Shape s = small_shape();
  s.n_embd = 256;
  s.n_ff_exp = 256;
  s.q_lora_rank = 64;
  s.n_expert = 4;
  s.idx_n_head = 2;  // 10 tokens: the indexer never has to choose
  auto types = [](Ds4Role role, int layer) {
    switch (role) {
      case Ds4Role::ExpertGateUp: return layer % 2 == 0 && layer > 0 ? DType::Q4_K : DType::IQ2_XXS;
      case Ds4Role::ExpertDown: return layer % 2 == 0 && layer > 0 ? DType::Q4_K : DType::Q2_K;
      case Ds4Role::AttnProj: case Ds4Role::SharedExpert: case Ds4Role::Output: return DType::Q8_0;
      default: return f32_types(role, layer);
    }
  };
  test::TempDir dir;
  write_model(dir.file("q.gguf"), s, types, seed);
  write_model(dir.file("f.gguf"), s, types, seed, true);
  GgufFile q = GgufFile::open(dir.file("q.gguf")), f = GgufFile::open(dir.file("f.gguf"));
  EXPECT_EQ(q.find_tensor("blk.1.ffn_gate_exps.weight")->type, DType::IQ2_XXS);
  EXPECT_EQ(q.find_tensor("blk.1.ffn_down_exps.weight")->type, DType::Q2_K);
  EXPECT_EQ(q.find_tensor("blk.2.ffn_up_exps.weight")->type, DType::Q4_K);
  const auto tokens = random_tokens(seed, 10, s.n_vocab);
  Stage sq(q, config(64, 4, 2)), sf(f, config(64, 10, 1));
  const auto want = run_chunks(sf, tokens, 10);
  expect_close(run_chunks(sq, tokens, 4), want, 2e-3f, "quantized vs F32 twin");
}

}  // namespace
}  // namespace baton
