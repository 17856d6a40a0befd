// Tensor-parallel slicing decisions (engine/tp/slice.h): which rows or
// columns of each llama-family tensor a rank holds, the refusals, the
// vocabulary slices and the rank file's metadata changes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include <cmath>
#include <random>

#include "engine/arch/llama_family.h"
#include "engine/gguf/file.h"
#include "engine/model/model.h"
#include "engine/tp/slice.h"
#include "gguf_split/split.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

GgufTensorInfo info(const std::string& name, DType type, std::vector<int64_t> ne) {
  GgufTensorInfo t;
  t.name = name;
  t.type = type;
  t.n_dims = uint32_t(ne.size());
  for (size_t i = 0; i < ne.size(); ++i) t.ne[i] = ne[i];
  t.nbytes = *dtype_bytes(type, t.n_elements());
  return t;
}

// llama with GQA: 8 query heads of 16, 4 KV heads, FFN 96, vocabulary 1001.
TpDims gqa_llama() {
  TpDims d;
  d.arch = "llama";
  d.n_head = 8;
  d.n_head_kv = 4;
  d.head_dim_k = d.head_dim_v = 16;
  d.n_embd = 128;
  d.n_ff = 96;
  d.n_vocab = 1001;
  return d;
}

TEST(TpSlice, QkvRowsFollowTheHeadsOfEachRank) {
  const TpDims d = gqa_llama();
  const GgufTensorInfo q = info("blk.3.attn_q.weight", DType::F32, {128, 128});
  const GgufTensorInfo k = info("blk.3.attn_k.weight", DType::Q8_0, {128, 64});
  const GgufTensorInfo v = info("blk.3.attn_v.weight", DType::F16, {128, 64});
  for (int r = 0; r < 2; ++r) {
    const TpSlice sq = tp_slice_tensor(d, q, 2, r);
    EXPECT_EQ(sq.cut, TpCut::Rows);
    // Query heads [4r, 4r+4) of 16 rows each.
    EXPECT_EQ(sq.begin, r * 64);
    EXPECT_EQ(sq.count, 64);
    EXPECT_EQ(sq.ne[0], 128);
    EXPECT_EQ(sq.ne[1], 64);
    EXPECT_EQ(sq.nbytes, q.nbytes / 2);
    // KV heads [2r, 2r+2): the KV heads those query heads use (groups of 2).
    const TpSlice sk = tp_slice_tensor(d, k, 2, r);
    EXPECT_EQ(sk.cut, TpCut::Rows);
    EXPECT_EQ(sk.begin, r * 32);
    EXPECT_EQ(sk.count, 32);
    EXPECT_EQ(sk.nbytes, k.nbytes / 2);
    const TpSlice sv = tp_slice_tensor(d, v, 2, r);
    EXPECT_EQ(sv.begin, r * 32);
    EXPECT_EQ(sv.ne[1], 32);
  }
  // Four ranks: one KV head each, two query heads each.
  const TpSlice q3 = tp_slice_tensor(d, q, 4, 3);
  EXPECT_EQ(q3.begin, 96);
  EXPECT_EQ(q3.count, 32);
  const TpSlice k3 = tp_slice_tensor(d, k, 4, 3);
  EXPECT_EQ(k3.begin, 48);
  EXPECT_EQ(k3.count, 16);
}

TEST(TpSlice, OutputProjectionAndDownAreCutByInputColumns) {
  const TpDims d = gqa_llama();
  const GgufTensorInfo o = info("blk.0.attn_output.weight", DType::Q8_0, {128, 128});
  const GgufTensorInfo down = info("blk.0.ffn_down.weight", DType::F32, {96, 128});
  const TpSlice so = tp_slice_tensor(d, o, 2, 1);
  EXPECT_EQ(so.cut, TpCut::Columns);
  EXPECT_EQ(so.begin, 64);
  EXPECT_EQ(so.count, 64);
  EXPECT_EQ(so.ne[0], 64);
  EXPECT_EQ(so.ne[1], 128);
  EXPECT_EQ(so.nbytes, o.nbytes / 2);
  const TpSlice sd = tp_slice_tensor(d, down, 2, 1);
  EXPECT_EQ(sd.cut, TpCut::Columns);
  EXPECT_EQ(sd.begin, 48);
  EXPECT_EQ(sd.ne[0], 48);
  for (const char* name : {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"}) {
    const TpSlice s = tp_slice_tensor(d, info(name, DType::Q4_K, {256, 96}), 2, 1);
    EXPECT_EQ(s.cut, TpCut::Rows) << name;
    EXPECT_EQ(s.begin, 48) << name;
    EXPECT_EQ(s.ne[1], 48) << name;
  }
}

TEST(TpSlice, NormsAndEmbeddingAreReplicated) {
  TpDims d = gqa_llama();
  d.arch = "qwen3";
  for (const GgufTensorInfo& t :
       {info("token_embd.weight", DType::Q8_0, {128, 1001}), info("output_norm.weight", DType::F32, {128}),
        info("blk.1.attn_norm.weight", DType::F32, {128}), info("blk.1.ffn_norm.weight", DType::F32, {128}),
        info("blk.1.attn_q_norm.weight", DType::F32, {16}), info("blk.1.attn_k_norm.weight", DType::F32, {16}),
        info("rope_freqs.weight", DType::F32, {8})}) {
    for (int r = 0; r < 2; ++r) {
      const TpSlice s = tp_slice_tensor(d, t, 2, r);
      EXPECT_EQ(s.cut, TpCut::Replicated) << t.name;
      EXPECT_EQ(s.nbytes, t.nbytes) << t.name;
      EXPECT_EQ(s.ne[0], t.ne[0]) << t.name;
    }
  }
}

TEST(TpSlice, Qwen2BiasesAreCutWithTheirHeads) {
  TpDims d = gqa_llama();
  d.arch = "qwen2";
  const TpSlice bq = tp_slice_tensor(d, info("blk.0.attn_q.bias", DType::F32, {128}), 2, 1);
  EXPECT_EQ(bq.cut, TpCut::Rows);
  EXPECT_EQ(bq.begin, 64);
  EXPECT_EQ(bq.ne[0], 64);
  EXPECT_EQ(bq.nbytes, 64u * 4);
  const TpSlice bk = tp_slice_tensor(d, info("blk.0.attn_k.bias", DType::F32, {64}), 2, 1);
  EXPECT_EQ(bk.begin, 32);
  EXPECT_EQ(bk.ne[0], 32);
  const TpSlice bv = tp_slice_tensor(d, info("blk.0.attn_v.bias", DType::F32, {64}), 4, 2);
  EXPECT_EQ(bv.begin, 32);
  EXPECT_EQ(bv.ne[0], 16);
}

TEST(TpSlice, UnevenVocabularyLeavesTheLastSliceShorter) {
  EXPECT_EQ(tp_vocab_range(1001, 2, 0), std::make_pair(int64_t(0), int64_t(501)));
  EXPECT_EQ(tp_vocab_range(1001, 2, 1), std::make_pair(int64_t(501), int64_t(500)));
  EXPECT_EQ(tp_vocab_range(1001, 4, 3), std::make_pair(int64_t(753), int64_t(248)));
  const TpDims d = gqa_llama();
  const GgufTensorInfo out = info("output.weight", DType::Q8_0, {128, 1001});
  int64_t rows = 0;
  uint64_t bytes = 0;
  for (int r = 0; r < 4; ++r) {
    const TpSlice s = tp_slice_tensor(d, out, 4, r);
    EXPECT_EQ(s.cut, TpCut::Rows);
    EXPECT_EQ(s.begin, rows);
    rows += s.ne[1];
    bytes += s.nbytes;
  }
  EXPECT_EQ(rows, 1001);
  EXPECT_EQ(bytes, out.nbytes);
  // A tied head: output.weight is cut from token_embd's rows.
  const TpSlice tied = tp_tied_head_slice(d, info("token_embd.weight", DType::F32, {128, 1001}), 2, 1);
  EXPECT_EQ(tied.name, "output.weight");
  EXPECT_EQ(tied.cut, TpCut::HeadFromEmbedding);
  EXPECT_EQ(tied.begin, 501);
  EXPECT_EQ(tied.ne[1], 500);
}

std::string refusal(const TpDims& d, const std::vector<GgufTensorInfo>& tensors, int n) {
  try {
    tp_check_model(d, tensors, n);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TpSlice, RefusalsNameTheTensorItsShapeDtypeAndN) {
  const TpDims d = gqa_llama();  // 4 KV heads, FFN 96
  // 8 ranks do not divide 4 KV heads.
  std::string why = refusal(d, {info("blk.0.attn_q.weight", DType::F32, {128, 128})}, 8);
  EXPECT_NE(why.find("blk.0.attn_q.weight"), std::string::npos) << why;
  EXPECT_NE(why.find("[128, 128]"), std::string::npos) << why;
  EXPECT_NE(why.find("F32"), std::string::npos) << why;
  EXPECT_NE(why.find("8 tensor-parallel ranks"), std::string::npos) << why;
  EXPECT_NE(why.find("head_count_kv"), std::string::npos) << why;
  // FFN 100 over 8: not a multiple.
  TpDims odd = d;
  odd.n_head_kv = 8;
  odd.n_ff = 100;
  why = refusal(odd, {info("blk.2.ffn_up.weight", DType::F32, {128, 100})}, 8);
  EXPECT_NE(why.find("blk.2.ffn_up.weight"), std::string::npos) << why;
  EXPECT_NE(why.find("feed_forward_length"), std::string::npos) << why;
  // Q4_K blocks are 256 wide: half of 256 columns is not a block boundary.
  TpDims wide = d;
  wide.n_embd = 256;
  wide.n_head = 4;
  wide.n_head_kv = 2;
  wide.head_dim_k = wide.head_dim_v = 64;
  why = refusal(wide, {info("blk.1.attn_output.weight", DType::Q4_K, {256, 256})}, 2);
  EXPECT_NE(why.find("blk.1.attn_output.weight"), std::string::npos) << why;
  EXPECT_NE(why.find("Q4_K"), std::string::npos) << why;
  EXPECT_NE(why.find("block boundary"), std::string::npos) << why;
  // A tensor whose cut is unknown is refused, not copied whole.
  why = refusal(d, {info("blk.0.ffn_gate_exps.weight", DType::F32, {128, 96, 4})}, 2);
  EXPECT_NE(why.find("blk.0.ffn_gate_exps.weight"), std::string::npos) << why;
  EXPECT_EQ(refusal(d, {info("blk.0.attn_q.weight", DType::F32, {128, 128})}, 1).empty(), false);
  EXPECT_EQ(refusal(d, {info("blk.0.attn_q.weight", DType::F32, {128, 128})}, 4), "");
}

// Writes a header-only model with the given metadata.
std::string sparse_model(const test::TempDir& tmp, const std::string& arch, bool key_length) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_str(arch));
  w.set(arch + ".block_count", GgufValue::of_u32(1));
  w.set(arch + ".embedding_length", GgufValue::of_u32(128));
  w.set(arch + ".feed_forward_length", GgufValue::of_u32(96));
  w.set(arch + ".attention.head_count", GgufValue::of_u32(8));
  w.set(arch + ".attention.head_count_kv", GgufValue::of_u32(4));
  if (key_length) w.set(arch + ".attention.key_length", GgufValue::of_u32(32));
  w.set("general.name", GgufValue::of_str("x"));
  w.add_tensor("token_embd.weight", DType::F32, {128, 50}, std::vector<uint8_t>(128 * 50 * 4));
  const std::string path = tmp.file(arch + ".gguf");
  w.write_sparse(path);
  return path;
}

TEST(TpSlice, KeyChangesDivideCountsAndWriteHeadDimsOut) {
  test::TempDir tmp;
  const GgufFile f = GgufFile::open(sparse_model(tmp, "qwen3", true));
  const TpDims d = read_tp_dims(f);
  EXPECT_EQ(d.head_dim_k, 32);
  EXPECT_EQ(d.head_dim_v, 16);
  EXPECT_EQ(d.n_vocab, 50);
  const std::vector<TpKeyChange> c = tp_key_changes(f, d, 2);
  // In source order: feed_forward_length, head_count, head_count_kv; then
  // value_length and vocab_size (absent) added.
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].key, "qwen3.feed_forward_length");
  EXPECT_EQ(c[0].value.as_int(), 48);
  EXPECT_EQ(c[0].value.type, GgufType::UINT32);
  EXPECT_EQ(c[1].key, "qwen3.attention.head_count");
  EXPECT_EQ(c[1].value.as_int(), 4);
  EXPECT_EQ(c[2].key, "qwen3.attention.head_count_kv");
  EXPECT_EQ(c[2].value.as_int(), 2);
  EXPECT_FALSE(c[2].added);
  EXPECT_EQ(c[3].key, "qwen3.attention.value_length");
  EXPECT_EQ(c[3].value.as_int(), 16);  // 128 / 8, the source's default
  EXPECT_TRUE(c[3].added);
  EXPECT_EQ(c[4].key, "qwen3.vocab_size");
  EXPECT_EQ(c[4].value.as_int(), 50);
  EXPECT_TRUE(c[4].added);
}

TEST(TpSlice, AnArchitectureWithoutCutsIsRefusedByName) {
  test::TempDir tmp;
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_str("gpt2"));
  const std::string path = tmp.file("g.gguf");
  w.write_sparse(path);
  try {
    read_tp_dims(GgufFile::open(path));
    FAIL() << "gpt2 was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("llama family"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'gpt2'"), std::string::npos) << e.what();
  }
}

TEST(TpSlice, RankFileNames) {
  EXPECT_EQ(tp_rank_file_name("m", 2, 0), "m.tp2-r0.gguf");
  EXPECT_EQ(tp_rank_file_name("m-part2-of-2-layers-3-4", 4, 3), "m-part2-of-2-layers-3-4.tp4-r3.gguf");
}

// The math: the rank files of a small F32 llama with GQA, loaded like any
// model, hold exactly the full model's heads, and summing the ranks' partial
// products (the all-reduce) gives the full attention-output and FFN results.
struct Loaded {
  GgufFile file;
  std::unique_ptr<Arch> arch;
  std::unique_ptr<Model> model;
  explicit Loaded(const std::string& path) : file(GgufFile::open(path)), arch(Arch::from_gguf(file)) {
    const int n_layer = arch->dims().n_layer;
    // Layers only: the head of a rank file is a vocabulary slice the engine
    // gathers; (c) below reads it from the file.
    model = std::make_unique<Model>(file, Model::plan(file, *arch, StageParts{{0, n_layer - 1}, false, false}));
  }
  const LlamaHparams& hp() const { return dynamic_cast<const LlamaFamilyArch&>(*arch).hparams(); }
  const Tensor& t(int layer, int slot) const { return *model->layer(layer, slot); }
};

std::vector<float> random_vector(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// y = W x for an F32 tensor of rows x cols, in double.
std::vector<double> matvec(const Tensor& w, const double* x) {
  const int64_t cols = w.ne[0], rows = w.rows();
  std::vector<double> y(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += double(w.f32()[r * cols + c]) * x[c];
    y[size_t(r)] = acc;
  }
  return y;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(got[i] - want[i]));
  }
  EXPECT_LE(err, 1e-5 * scale) << what << ": max error " << err << " of " << scale;
}

void check_rank_math(bool tied) {
  test::TempDir tmp;
  SynthConfig cfg;  // 64 wide, 4 query heads, 2 KV heads, FFN 128, F32
  cfg.tied_output = tied;
  const std::string src = tmp.file("full.gguf");
  write_synthetic_model(src, cfg);
  const int n = 2;
  const std::vector<std::string> paths = write_tp_ranks(src, n, tmp.file("ranks"));
  ASSERT_EQ(paths.size(), 2u);
  const Loaded full(src);
  std::vector<std::unique_ptr<Loaded>> ranks;
  for (const std::string& p : paths) ranks.push_back(std::make_unique<Loaded>(p));
  const LlamaHparams& hp = full.hp();
  const int64_t E = hp.n_embd, F = hp.n_ff, dk = hp.head_dim_k, dv = hp.head_dim_v;
  using A = LlamaFamilyArch;
  for (int r = 0; r < n; ++r) {
    const LlamaHparams& rh = ranks[size_t(r)]->hp();
    EXPECT_EQ(rh.n_head, hp.n_head / n);
    EXPECT_EQ(rh.n_head_kv, hp.n_head_kv / n);
    EXPECT_EQ(rh.n_ff, F / n);
    EXPECT_EQ(rh.head_dim_k, dk);
    EXPECT_EQ(rh.head_dim_v, dv);
    EXPECT_EQ(rh.n_embd, E);
  }
  for (int l = 0; l < hp.n_layer; ++l) {
    // (a) q/k/v rows of rank r are the full model's rows of its heads.
    for (int r = 0; r < n; ++r) {
      const Loaded& rk = *ranks[size_t(r)];
      for (auto [slot, heads, hd] : {std::tuple{A::kWq, hp.n_head / n, dk}, std::tuple{A::kWk, hp.n_head_kv / n, dk},
                                     std::tuple{A::kWv, hp.n_head_kv / n, dv}}) {
        const Tensor& part = rk.t(l, slot);
        const Tensor& whole = full.t(l, slot);
        ASSERT_EQ(part.rows(), int64_t(heads) * hd);
        EXPECT_EQ(0, std::memcmp(part.data, whole.data + uint64_t(r) * part.nbytes, part.nbytes))
            << "layer " << l << " slot " << slot << " rank " << r;
      }
    }
    // (b) sum over ranks of down_r (silu(gate_r x) * up_r x) is the full FFN output.
    const std::vector<float> xf = random_vector(size_t(E), 1000 + uint64_t(l));
    const std::vector<double> x(xf.begin(), xf.end());
    auto ffn = [&](const Loaded& m) {
      std::vector<double> g = matvec(m.t(l, A::kGate), x.data()), u = matvec(m.t(l, A::kUp), x.data());
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      return matvec(m.t(l, A::kDown), g.data());
    };
    std::vector<double> sum(size_t(E), 0.0);
    for (const auto& rk : ranks) {
      const std::vector<double> y = ffn(*rk);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
    }
    expect_close(sum, ffn(full), "FFN");
    // And the attention output: rank r's columns applied to its heads' values.
    const std::vector<float> af = random_vector(size_t(hp.n_head * dv), 2000 + uint64_t(l));
    const std::vector<double> att(af.begin(), af.end());
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int r = 0; r < n; ++r) {
      const std::vector<double> y = matvec(ranks[size_t(r)]->t(l, A::kWo), att.data() + r * (hp.n_head / n) * dv);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
    }
    expect_close(sum, matvec(full.t(l, A::kWo), att.data()), "attention output");
  }
  // (c) the ranks' output.weight rows, one after another, are the full head
  // (token_embd's rows for a tied head).
  const GgufTensorInfo* head = full.file.find_tensor(tied ? "token_embd.weight" : "output.weight");
  ASSERT_NE(head, nullptr);
  std::vector<uint8_t> want(head->nbytes), got;
  full.file.read_tensor(*head, want.data());
  int64_t begin = 0;
  for (const auto& rk : ranks) {
    const GgufTensorInfo* o = rk->file.find_tensor("output.weight");
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(rk->file.get_int(tp_keys::kVocabBegin), begin);
    EXPECT_EQ(rk->file.get_int(tp_keys::kVocabCount), o->ne[1]);
    begin += o->ne[1];
    std::vector<uint8_t> b(o->nbytes);
    rk->file.read_tensor(*o, b.data());
    got.insert(got.end(), b.begin(), b.end());
    // The embedding stays whole on every rank.
    const GgufTensorInfo* e = rk->file.find_tensor("token_embd.weight");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->ne[1], full.file.find_tensor("token_embd.weight")->ne[1]);
  }
  EXPECT_EQ(begin, head->ne[1]);
  EXPECT_TRUE(got == want);
}

TEST(TpSliceMath, RankModelsSumToTheFullModel) { check_rank_math(false); }
TEST(TpSliceMath, TiedHeadIsCutFromTheEmbedding) { check_rank_math(true); }

}  // namespace
}  // namespace baton
