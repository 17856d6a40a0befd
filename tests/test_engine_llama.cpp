// The llama-family engine: a plain float64 forward written here (straight
// loops, weights decoded from the file's bytes by this test) against the
// engine on small synthetic llama / qwen2 / qwen3 GGUFs; pipeline stages
// against the whole model; chunked prefill against token-by-token decode; the
// loader's refusals.
//
// The file is long because the reference forward it checks against is written out here, loop by
// loop, and every llama-family variant and stage layout is compared with that one reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "engine/gguf/file.h"
#include "engine/model/model.h"
#include "engine/runtime/stage.h"
#include "gguf_split/synth.h"
#include "kernels/quant.h"
#include "tests/test_util.h"

namespace baton {
namespace {

// ------------------------------------------------------------ test models

struct TinyCfg {
  std::string arch = "llama";
  int n_layer = 2;
  int64_t E = 32;   // n_embd
  int H = 4;        // query heads
  int Hkv = 2;      // kv heads
  int dk = 8;       // head size (written as key_length when key_length is set)
  int64_t F = 48;   // n_ff
  int64_t V = 40;   // vocabulary
  DType wtype = DType::F32;
  bool bias = false;     // attn_{q,k,v}.bias
  bool qk_norm = false;  // attn_{q,k}_norm.weight
  bool key_length = false;
  bool tied = false;     // no output.weight
  int rope_dim = 0;      // 0: dk
  double rope_base = 10000.0;
  uint64_t seed = 1;
  // Lets a test break the file: rename/retype/reshape a tensor, or return false to leave it out.
  std::function<bool(std::string& name, DType& type, std::vector<int64_t>& ne)> mutate;
};

std::vector<float> rand_floats(std::mt19937_64& rng, size_t n, double scale, double offset = 0) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(offset + (double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale);
  return v;
}

void write_tiny(const std::string& path, const TinyCfg& c) {
  std::mt19937_64 rng(c.seed);
  GgufWriter w;
  const std::string a = c.arch;
  w.set("general.architecture", GgufValue::of_str(a));
  w.set(a + ".context_length", GgufValue::of_u32(256));
  w.set(a + ".embedding_length", GgufValue::of_u32(uint32_t(c.E)));
  w.set(a + ".block_count", GgufValue::of_u32(uint32_t(c.n_layer)));
  w.set(a + ".feed_forward_length", GgufValue::of_u32(uint32_t(c.F)));
  w.set(a + ".attention.head_count", GgufValue::of_u32(uint32_t(c.H)));
  w.set(a + ".attention.head_count_kv", GgufValue::of_u32(uint32_t(c.Hkv)));
  w.set(a + ".rope.freq_base", GgufValue::of_f32(float(c.rope_base)));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::of_f32(1e-6f));
  if (c.key_length) {
    w.set(a + ".attention.key_length", GgufValue::of_u32(uint32_t(c.dk)));
    w.set(a + ".attention.value_length", GgufValue::of_u32(uint32_t(c.dk)));
  }
  if (c.rope_dim) w.set(a + ".rope.dimension_count", GgufValue::of_u32(uint32_t(c.rope_dim)));

  auto add = [&](std::string name, DType type, std::vector<int64_t> ne, double scale, double offset) {
    if (c.mutate && !c.mutate(name, type, ne)) return;
    int64_t n = 1;
    for (auto d : ne) n *= d;
    auto values = rand_floats(rng, size_t(n), scale, offset);
    auto row_bytes = dtype_bytes(type, uint64_t(ne[0]));
    ASSERT_TRUE(row_bytes) << name;
    std::vector<uint8_t> bytes(*row_bytes * uint64_t(n / ne[0]));
    if (dtype_info(type).quantize) {
      for (int64_t r = 0; r < n / ne[0]; ++r) quantize_row(type, values.data() + r * ne[0], bytes.data() + r * *row_bytes, ne[0]);
    } else {
      for (auto& b : bytes) b = uint8_t(rng());  // a type we cannot make: any bytes do for a refusal test
    }
    w.add_tensor(name, type, ne, std::move(bytes));
  };
  auto mat = [&](std::string name, int64_t cols, int64_t rows) {
    add(std::move(name), c.wtype, {cols, rows}, 1.0 / std::sqrt(double(cols)), 0);
  };
  auto vec = [&](std::string name, int64_t n, double scale, double offset) { add(std::move(name), DType::F32, {n}, scale, offset); };
  const int64_t qw = int64_t(c.H) * c.dk, kw = int64_t(c.Hkv) * c.dk;
  mat("token_embd.weight", c.E, c.V);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", c.E, 0.3, 1.0);
    mat(p + "attn_q.weight", c.E, qw);
    mat(p + "attn_k.weight", c.E, kw);
    mat(p + "attn_v.weight", c.E, kw);
    mat(p + "attn_output.weight", qw, c.E);
    if (c.bias) {
      vec(p + "attn_q.bias", qw, 0.5, 0);
      vec(p + "attn_k.bias", kw, 0.5, 0);
      vec(p + "attn_v.bias", kw, 0.5, 0);
    }
    if (c.qk_norm) {
      vec(p + "attn_q_norm.weight", c.dk, 0.3, 1.0);
      vec(p + "attn_k_norm.weight", c.dk, 0.3, 1.0);
    }
    vec(p + "ffn_norm.weight", c.E, 0.3, 1.0);
    mat(p + "ffn_gate.weight", c.E, c.F);
    mat(p + "ffn_up.weight", c.E, c.F);
    mat(p + "ffn_down.weight", c.F, c.E);
  }
  vec("output_norm.weight", c.E, 0.3, 1.0);
  if (!c.tied) mat("output.weight", c.E, c.V);
  w.write(path);
}

// ------------------------------------------------------------ reference forward
// Everything below decodes and computes on its own, in double precision.

double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

std::vector<double> read_f64(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) return {};
  std::vector<uint8_t> bytes(t->nbytes);
  f.read_tensor(*t, bytes.data());
  const uint64_t n = t->n_elements();
  std::vector<double> out(n);
  if (t->type == DType::F32) {
    for (uint64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      out[i] = v;
    }
  } else if (t->type == DType::F16) {
    for (uint64_t i = 0; i < n; ++i) out[i] = half_to_double(uint16_t(bytes[2 * i] | bytes[2 * i + 1] << 8));
  } else if (t->type == DType::Q8_0) {
    // Blocks of 32: an f16 scale, then 32 int8 quants.
    for (uint64_t b = 0; b < n / 32; ++b) {
      const uint8_t* blk = bytes.data() + 34 * b;
      double d = half_to_double(uint16_t(blk[0] | blk[1] << 8));
      for (int i = 0; i < 32; ++i) out[32 * b + uint64_t(i)] = d * double(int8_t(blk[2 + i]));
    }
  } else {
    ADD_FAILURE() << "reference cannot decode " << dtype_name(t->type);
  }
  return out;
}

// y[r] = sum_c W[r][c] x[c] for a GGUF matrix of `cols`-long rows.
std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x) {
  const size_t cols = x.size(), rows = w.size() / cols;
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  }
  return y;
}

std::vector<double> rmsnorm64(const double* x, size_t n, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  double s = 1.0 / std::sqrt(ss / double(n) + eps);
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * s * w[i];
  return y;
}

void rope64(double* head, int dk, int rot, int pos, double base, bool neox) {
  for (int i = 0; i < rot / 2; ++i) {
    double theta = pos * std::pow(base, -2.0 * i / rot);
    int a = neox ? i : 2 * i, b = neox ? i + rot / 2 : 2 * i + 1;
    double x0 = head[a], x1 = head[b];
    head[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
    head[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
  }
  (void)dk;
}

// Logits for every position of `tokens`, recomputing everything causally.
std::vector<std::vector<double>> reference_logits(const std::string& path, const TinyCfg& c,
                                                  const std::vector<int32_t>& tokens) {
  GgufFile f = GgufFile::open(path);
  const double eps = 1e-6;
  const bool neox = c.arch != "llama";
  const int rot = c.rope_dim ? c.rope_dim : c.dk;
  const size_t T = tokens.size(), E = size_t(c.E);
  auto emb = read_f64(f, "token_embd.weight");
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t) x[t].assign(emb.begin() + long(tokens[t] * E), emb.begin() + long((tokens[t] + 1) * E));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto wq = read_f64(f, p + "attn_q.weight"), wk = read_f64(f, p + "attn_k.weight"),
         wv = read_f64(f, p + "attn_v.weight"), wo = read_f64(f, p + "attn_output.weight");
    auto bq = read_f64(f, p + "attn_q.bias"), bk = read_f64(f, p + "attn_k.bias"), bv = read_f64(f, p + "attn_v.bias");
    auto qn = read_f64(f, p + "attn_q_norm.weight"), kn = read_f64(f, p + "attn_k_norm.weight");
    auto an = read_f64(f, p + "attn_norm.weight"), fn = read_f64(f, p + "ffn_norm.weight");
    auto wg = read_f64(f, p + "ffn_gate.weight"), wu = read_f64(f, p + "ffn_up.weight"),
         wd = read_f64(f, p + "ffn_down.weight");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      auto h = rmsnorm64(x[t].data(), E, an, eps);
      q[t] = matvec(wq, h);
      k[t] = matvec(wk, h);
      v[t] = matvec(wv, h);
      for (size_t i = 0; i < bq.size(); ++i) q[t][i] += bq[i];
      for (size_t i = 0; i < bk.size(); ++i) k[t][i] += bk[i];
      for (size_t i = 0; i < bv.size(); ++i) v[t][i] += bv[i];
      for (int hh = 0; hh < c.H; ++hh) {
        double* qh = q[t].data() + hh * c.dk;
        if (!qn.empty()) {
          auto y = rmsnorm64(qh, size_t(c.dk), qn, eps);
          std::copy(y.begin(), y.end(), qh);
        }
        rope64(qh, c.dk, rot, int(t), c.rope_base, neox);
      }
      for (int hh = 0; hh < c.Hkv; ++hh) {
        double* kh = k[t].data() + hh * c.dk;
        if (!kn.empty()) {
          auto y = rmsnorm64(kh, size_t(c.dk), kn, eps);
          std::copy(y.begin(), y.end(), kh);
        }
        rope64(kh, c.dk, rot, int(t), c.rope_base, neox);
      }
    }
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(size_t(c.H * c.dk), 0.0);
      for (int hh = 0; hh < c.H; ++hh) {
        int g = hh / (c.H / c.Hkv);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < c.dk; ++i) d += q[t][size_t(hh * c.dk + i)] * k[u][size_t(g * c.dk + i)];
          s[u] = d / std::sqrt(double(c.dk));
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (size_t u = 0; u <= t; ++u) {
          for (int i = 0; i < c.dk; ++i) att[size_t(hh * c.dk + i)] += s[u] / sum * v[u][size_t(g * c.dk + i)];
        }
      }
      auto o = matvec(wo, att);
      for (size_t i = 0; i < E; ++i) x[t][i] += o[i];
      auto h = rmsnorm64(x[t].data(), E, fn, eps);
      auto gate = matvec(wg, h), up = matvec(wu, h);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      auto d = matvec(wd, gate);
      for (size_t i = 0; i < E; ++i) x[t][i] += d[i];
    }
  }
  auto on = read_f64(f, "output_norm.weight");
  auto out = read_f64(f, "output.weight");
  if (out.empty()) out = emb;
  std::vector<std::vector<double>> logits(T);
  for (size_t t = 0; t < T; ++t) logits[t] = matvec(out, rmsnorm64(x[t].data(), E, on, eps));
  return logits;
}

std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int64_t V) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& id : t) id = int32_t(rng() % uint64_t(V));
  return t;
}

// Engine logits for every position, prefilled in one batch.
std::vector<float> engine_logits(const std::string& path, const std::vector<int32_t>& tokens, int threads = 2) {
  GgufFile f = GgufFile::open(path);
  StageConfig sc;
  sc.all_logits = true;
  sc.max_batch = int64_t(tokens.size());
  sc.n_threads = threads;
  Stage stage(f, sc);
  auto out = stage.forward(0, tokens);
  return std::vector<float>(out.begin(), out.end());
}

void expect_matches_reference(const TinyCfg& c, double tol) {
  SCOPED_TRACE("arch " + c.arch + " dtype " + dtype_name(c.wtype) + " seed " + std::to_string(c.seed));
  test::TempDir dir;
  const std::string path = dir.file("tiny.gguf");
  write_tiny(path, c);
  auto tokens = random_tokens(c.seed * 7 + 3, 9, c.V);
  auto want = reference_logits(path, c, tokens);
  auto got = engine_logits(path, tokens);
  ASSERT_EQ(got.size(), tokens.size() * size_t(c.V));
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t i = 0; i < c.V; ++i) {
      double w = want[t][size_t(i)], g = got[t * size_t(c.V) + size_t(i)];
      worst = std::max(worst, std::abs(g - w) / (1 + std::abs(w)));
      ASSERT_NEAR(g, w, tol * (1 + std::abs(w))) << "position " << t << " token " << i;
    }
  }
  std::printf("  %s %s: worst relative logit error %.2e\n", c.arch.c_str(), dtype_name(c.wtype), worst);
}

// ------------------------------------------------------------ against the reference

TEST(LlamaEngine, LlamaF32GqaMatchesReference) {
  TinyCfg c;
  c.seed = test::test_seed();
  expect_matches_reference(c, 1e-4);
}

TEST(LlamaEngine, LlamaPartialRopeAndBiasesMatchReference) {
  TinyCfg c;
  c.seed = test::test_seed() + 1;
  c.rope_dim = 4;  // rotate half of each head
  c.bias = true;   // optional for llama: used when present
  c.rope_base = 500000.0;
  expect_matches_reference(c, 1e-4);
}

TEST(LlamaEngine, LlamaF16MatchesReference) {
  TinyCfg c;
  c.seed = test::test_seed() + 2;
  c.wtype = DType::F16;
  expect_matches_reference(c, 1e-4);
}

TEST(LlamaEngine, LlamaQ8_0MatchesReference) {
  TinyCfg c;
  c.seed = test::test_seed() + 3;
  c.wtype = DType::Q8_0;
  c.E = 64;  // rows must be whole 32-element blocks
  c.dk = 16;
  c.F = 96;
  expect_matches_reference(c, 1e-4);
}

TEST(LlamaEngine, LlamaTiedOutputMatchesReference) {
  TinyCfg c;
  c.seed = test::test_seed() + 4;
  c.tied = true;
  expect_matches_reference(c, 1e-4);
}

TEST(LlamaEngine, Qwen2BiasNeoxMatchesReference) {
  TinyCfg c;
  c.arch = "qwen2";
  c.seed = test::test_seed() + 5;
  c.bias = true;
  c.rope_base = 1000000.0;
  expect_matches_reference(c, 1e-4);
}

TEST(LlamaEngine, Qwen3QkNormExplicitHeadSizeMatchesReference) {
  TinyCfg c;
  c.arch = "qwen3";
  c.seed = test::test_seed() + 6;
  c.qk_norm = true;
  c.key_length = true;
  c.E = 40;  // H * dk = 48 != E: the head size must come from key_length
  c.H = 6;
  c.Hkv = 2;
  c.dk = 8;
  expect_matches_reference(c, 1e-4);
}

// ------------------------------------------------------------ stages and batching

std::vector<int32_t> stories_prompt() { return {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298}; }

TEST(LlamaEngine, PipelineStagesEqualWholeModel) {
  const std::string path = test::model_path("stories260K.gguf");
  GgufFile f = GgufFile::open(path);
  auto tokens = stories_prompt();
  StageConfig whole_cfg;
  whole_cfg.all_logits = true;
  whole_cfg.n_threads = 2;
  whole_cfg.n_ctx = 64;
  Stage whole(f, whole_cfg);
  auto want_span = whole.forward(0, tokens);
  std::vector<float> want(want_span.begin(), want_span.end());
  const int32_t next = 426;
  auto want_next_span = whole.forward(0, std::span<const int32_t>(&next, 1));
  std::vector<float> want_next(want_next_span.begin(), want_next_span.end());
  const int n_layer = whole.arch().dims().n_layer;
  ASSERT_EQ(n_layer, 5);
  for (int k = 0; k < n_layer - 1; ++k) {
    SCOPED_TRACE("split after layer " + std::to_string(k));
    StageConfig a = whole_cfg, b = whole_cfg;
    a.last_layer = k;
    a.head = false;
    b.first_layer = k + 1;
    b.embedding = false;
    Stage first(f, a), second(f, b);
    EXPECT_LT(first.memory_plan().bytes(PlanLine::Weights) + second.memory_plan().bytes(PlanLine::Weights),
              whole.memory_plan().bytes(PlanLine::Weights) + 2 * kPlanAlignment * 64);
    // Prefill through both stages, then one decode step.
    auto act = first.forward(0, tokens);
    ASSERT_EQ(act.size(), tokens.size() * size_t(first.boundary_width()));
    std::vector<float> boundary(act.begin(), act.end());
    auto got = second.forward(0, boundary, int64_t(tokens.size()));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "logit " << i;
    auto act2 = first.forward(0, std::span<const int32_t>(&next, 1));
    std::vector<float> boundary2(act2.begin(), act2.end());
    auto got2 = second.forward(0, boundary2, 1);
    ASSERT_EQ(got2.size(), want_next.size());
    for (size_t i = 0; i < want_next.size(); ++i) ASSERT_NEAR(got2[i], want_next[i], 1e-5) << "decode logit " << i;
  }
  // The middle of a three-stage pipeline takes and gives activations.
  StageConfig s0 = whole_cfg, s1 = whole_cfg, s2 = whole_cfg;
  s0.last_layer = 1;
  s0.head = false;
  s1.first_layer = 2;
  s1.last_layer = 2;
  s1.embedding = false;
  s1.head = false;
  s2.first_layer = 3;
  s2.embedding = false;
  Stage st0(f, s0), st1(f, s1), st2(f, s2);
  auto a0 = st0.forward(0, tokens);
  std::vector<float> b0(a0.begin(), a0.end());
  auto a1 = st1.forward(0, b0, int64_t(tokens.size()));
  std::vector<float> b1(a1.begin(), a1.end());
  auto got = st2.forward(0, b1, int64_t(tokens.size()));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "three stages, logit " << i;
}

// Logit rows for every position when the prompt is fed in chunks of `chunk`.
std::vector<float> chunked_logits(const GgufFile& f, const std::vector<int32_t>& tokens, int64_t chunk, int threads) {
  StageConfig sc;
  sc.all_logits = true;
  sc.max_batch = chunk;
  sc.n_threads = threads;
  sc.n_ctx = 32;
  Stage s(f, sc);
  std::vector<float> out;
  for (size_t at = 0; at < tokens.size(); at += size_t(chunk)) {
    size_t n = std::min(tokens.size() - at, size_t(chunk));
    auto l = s.forward(0, std::span<const int32_t>(tokens.data() + at, n));
    out.insert(out.end(), l.begin(), l.end());
  }
  EXPECT_EQ(s.position(0), int64_t(tokens.size()));
  return out;
}

TEST(LlamaEngine, ChunkedPrefillEqualsWholePrefillEqualsDecode) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthConfig sc;
  sc.seed = seed;
  write_synthetic_model(dir.file("synth.gguf"), sc);
  GgufFile f = GgufFile::open(dir.file("synth.gguf"));
  auto tokens = random_tokens(seed, 13, 300);
  auto whole = chunked_logits(f, tokens, 13, 1);
  for (auto [chunk, threads] : {std::pair<int64_t, int>{5, 2}, {4, 3}, {1, 1}, {1, 2}}) {
    auto got = chunked_logits(f, tokens, chunk, threads);
    ASSERT_EQ(got.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_NEAR(got[i], whole[i], 1e-4) << "chunk " << chunk << " threads " << threads << " at " << i;
    }
  }
}

TEST(LlamaEngine, SequenceSlotsAreIndependent) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthConfig syn;
  syn.seed = seed + 9;
  write_synthetic_model(dir.file("synth.gguf"), syn);
  GgufFile f = GgufFile::open(dir.file("synth.gguf"));
  auto a = random_tokens(seed + 1, 6, 300), b = random_tokens(seed + 2, 6, 300);
  StageConfig one;
  one.n_ctx = 16;
  one.max_batch = 3;
  StageConfig two = one;
  two.n_seq = 2;
  Stage sa(f, one), sb(f, one), both(f, two);
  for (size_t at = 0; at < 6; at += 3) {
    auto la = sa.forward(0, std::span<const int32_t>(a.data() + at, 3));
    auto lb = sb.forward(0, std::span<const int32_t>(b.data() + at, 3));
    std::vector<float> wa(la.begin(), la.end()), wb(lb.begin(), lb.end());
    auto ga = both.forward(0, std::span<const int32_t>(a.data() + at, 3));
    std::vector<float> va(ga.begin(), ga.end());
    auto gb = both.forward(1, std::span<const int32_t>(b.data() + at, 3));
    EXPECT_EQ(va, wa);
    EXPECT_EQ(std::vector<float>(gb.begin(), gb.end()), wb);
  }
  EXPECT_EQ(both.position(0), 6);
  EXPECT_EQ(both.position(1), 6);
  both.reset(1);
  EXPECT_EQ(both.position(1), 0);
  EXPECT_THROW(both.forward(2, std::span<const int32_t>(a.data(), 1)), std::out_of_range);
}

TEST(LlamaEngine, PlanAndRealFixtures) {
  const std::string path = test::model_path("stories260K.gguf");
  GgufFile f = GgufFile::open(path);
  StageConfig sc;
  sc.n_ctx = 100;
  MemoryPlan dry = Stage::plan(f, sc);
  uint64_t tensor_bytes = 0;
  for (const auto& t : f.tensors()) tensor_bytes += align_up(t.nbytes);
  EXPECT_EQ(dry.bytes(PlanLine::Weights), tensor_bytes);
  // K and V rows of n_head_kv * head_dim = 4 * 8 floats, 5 layers, 100 positions.
  EXPECT_EQ(dry.bytes(PlanLine::KvCache), 5u * 100u * 2u * 32u * 4u);
  EXPECT_GT(dry.bytes(PlanLine::Workspace), 0u);
  Stage s(f, sc);
  EXPECT_EQ(s.memory_plan().total(), dry.total());
  EXPECT_NE(dry.to_string().find("kv cache"), std::string::npos);

  GgufFile g = GgufFile::open(test::model_path("llama-2-tiny-random.gguf"));
  StageConfig c2;
  Stage t(g, c2);
  EXPECT_EQ(t.n_ctx(), 4096);  // the model's 4096, capped at 4096
  std::vector<int32_t> ids = {1, 9038, 2501, 263, 931};
  auto logits = t.forward(0, ids);
  ASSERT_EQ(logits.size(), 32000u);
  // Reference top-1 after the prompt (reference_outputs.txt): 17196 ('ernal').
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), 17196);
}

// ------------------------------------------------------------ refusals

std::string load_error(const TinyCfg& c) {
  test::TempDir dir;
  write_tiny(dir.file("bad.gguf"), c);
  GgufFile f = GgufFile::open(dir.file("bad.gguf"));
  try {
    Stage s(f, StageConfig{});
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaEngine, RefusesUnknownArchitectureByName) {
  TinyCfg c;
  c.arch = "mamba-9";
  std::string err = load_error(c);
  EXPECT_NE(err.find("unknown architecture 'mamba-9'"), std::string::npos) << err;
  EXPECT_NE(err.find("llama"), std::string::npos) << err;
}

TEST(LlamaEngine, RefusesMissingTensorByName) {
  TinyCfg c;
  c.mutate = [](std::string& name, DType&, std::vector<int64_t>&) { return name != "blk.1.ffn_up.weight"; };
  std::string err = load_error(c);
  EXPECT_NE(err.find("missing tensor blk.1.ffn_up.weight"), std::string::npos) << err;
}

TEST(LlamaEngine, RefusesWrongShapeWithExpectedAndActual) {
  TinyCfg c;
  c.mutate = [](std::string& name, DType&, std::vector<int64_t>& ne) {
    if (name == "blk.0.attn_k.weight") ne = {32, 24};
    return true;
  };
  std::string err = load_error(c);
  EXPECT_NE(err.find("blk.0.attn_k.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("expected shape [32, 16], file has [32, 24]"), std::string::npos) << err;
}

TEST(LlamaEngine, RefusesDtypeWithoutComputeByName) {
  TinyCfg c;
  c.mutate = [](std::string& name, DType& type, std::vector<int64_t>&) {
    if (name == "blk.1.attn_q.weight") type = DType::Q4_1;
    return true;
  };
  ASSERT_FALSE(dtype_info(DType::Q4_1).compute) << "pick another unsupported type for this test";
  std::string err = load_error(c);
  EXPECT_NE(err.find("blk.1.attn_q.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("Q4_1"), std::string::npos) << err;
}

TEST(LlamaEngine, RefusesNormInWrongDtype) {
  TinyCfg c;
  c.mutate = [](std::string& name, DType& type, std::vector<int64_t>&) {
    if (name == "output_norm.weight") type = DType::F16;
    return true;
  };
  std::string err = load_error(c);
  EXPECT_NE(err.find("output_norm.weight: expected dtype F32, file has F16"), std::string::npos) << err;
}

TEST(LlamaEngine, RefusesMissingQwenBias) {
  TinyCfg c;
  c.arch = "qwen2";
  c.bias = false;  // required for qwen2
  std::string err = load_error(c);
  EXPECT_NE(err.find("missing tensor blk.0.attn_q.bias"), std::string::npos) << err;
}

TEST(LlamaEngine, RefusesBadRangesTokensAndOverflow) {
  test::TempDir dir;
  TinyCfg c;
  write_tiny(dir.file("m.gguf"), c);
  GgufFile f = GgufFile::open(dir.file("m.gguf"));
  StageConfig bad;
  bad.first_layer = 1;
  bad.last_layer = 2;  // the model has layers 0..1
  EXPECT_THROW(Stage(f, bad), std::invalid_argument);
  StageConfig sc;
  sc.n_ctx = 4;
  sc.max_batch = 2;
  Stage s(f, sc);
  std::vector<int32_t> bad_id = {3, int32_t(c.V)};
  EXPECT_THROW(s.forward(0, bad_id), std::out_of_range);
  EXPECT_EQ(s.position(0), 0);  // nothing was appended
  std::vector<int32_t> three = {1, 2, 3};
  EXPECT_THROW(s.forward(0, three), std::invalid_argument);  // more than max_batch
  std::vector<int32_t> two = {1, 2};
  s.forward(0, two);
  s.forward(0, two);
  EXPECT_THROW(s.forward(0, std::span<const int32_t>(two.data(), 1)), std::out_of_range);  // context full
  std::vector<float> act(size_t(c.E));
  EXPECT_THROW(s.forward(0, act, 1), std::logic_error);  // a first stage takes token ids
}

}  // namespace
}  // namespace baton
