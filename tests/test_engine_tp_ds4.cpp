// Tensor-parallel ranks of deepseek4 against the whole model
// (docs/TENSOR_PARALLEL.md, "deepseek4"): `deepseek4-tiny` (Q2 experts, Q8_0
// attention) cut by `baton split --tp` (gguf_split/split.h), every rank a
// StageRunner on its own thread, linked by an in-process group
// (engine/runtime/tp_comm.h). Every rank must end each step with the same
// output bit for bit; the last-position logits must be within 1e-5 relative
// of the whole model's and the greedy tokens the whole model's, at two ranks
// (8 sequences x 64 tokens) and at two pipeline stages of two ranks each
// (8 x 16). Also: a batch of 8 sequences
// through two ranks against each sequence alone, the rank files merged back
// byte for byte, the cuts, a rank file run without its link, and the refusal
// of a shape that does not divide.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/model/deepseek4_shape.h"
#include "engine/model/part_info.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/batch.h"
#include "engine/runtime/stage.h"
#include "engine/runtime/tp_comm.h"
#include "engine/tp/slice.h"
#include "kernels/quant.h"
#include "gguf_split/split.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"
#include "tests/tp_test_util.h"

namespace baton {
namespace {

using namespace tp_test;

constexpr int kSeqs = 8;
constexpr int kPrompt = 5;
constexpr int kGen = 64;
constexpr int64_t kCtx = 80;

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

double max_rel_diff(const float* a, const float* b, int64_t n) {
  double scale = 0, diff = 0;
  for (int64_t i = 0; i < n; ++i) {
    scale = std::max(scale, std::fabs(double(a[i])));
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// One CPU thread a rank (two ranks fill two cores); the whole model takes two.
StageConfig config(int n_threads = 1) {
  StageConfig c;
  c.n_ctx = kCtx;
  c.n_seq = kSeqs;
  c.max_batch = kSeqs * kPrompt;
  c.n_threads = n_threads;
  return c;
}

// A pipeline of stages, each served by its ranks (one rank: a whole stage).
class Pipeline {
 public:
  // files[stage][rank]
  explicit Pipeline(const std::vector<std::vector<std::string>>& files) {
    for (const auto& stage : files) {
      Group g;
      if (stage.size() > 1) g.comm = std::make_unique<InProcessTpGroup>(int(stage.size()));
      for (size_t r = 0; r < stage.size(); ++r) g.files.push_back(std::make_unique<GgufFile>(GgufFile::open(stage[r])));
      for (size_t r = 0; r < stage.size(); ++r) {
        StageConfig sc = config(stage.size() > 1 ? 1 : 2);
        if (const std::optional<PartInfo> part = read_part_info(*g.files[r])) {
          sc.first_layer = part->range.first;
          sc.last_layer = part->range.last;
          sc.embedding = part->has_embedding;
          sc.head = part->has_output;
        }
        if (g.comm) sc.tp = &g.comm->member(int(r));
        g.ranks.push_back(make_stage_runner(Backend::Cpu, *g.files[r], sc));
      }
      groups_.push_back(std::move(g));
    }
  }

  int64_t n_vocab() const { return groups_.back().ranks[0]->n_vocab(); }

  // One batch through every stage; the ranks of each stage must agree bit for bit.
  std::vector<float> step(std::span<const BatchChunk> chunks, std::span<const int32_t> tokens) {
    std::vector<float> acts;
    for (size_t s = 0; s < groups_.size(); ++s) {
      Group& g = groups_[s];
      const int n = int(g.ranks.size());
      std::vector<std::vector<float>> out(static_cast<size_t>(n));
      on_threads(n, [&](int r) {
        out[size_t(r)] = as_vector(s == 0 ? g.ranks[size_t(r)]->forward_batch(chunks, tokens)
                                          : g.ranks[size_t(r)]->forward_batch(chunks, std::span<const float>(acts)));
      });
      for (int r = 1; r < n; ++r) {
        EXPECT_TRUE(out[size_t(r)] == out[0]) << "stage " << s << ": rank " << r << " differs from rank 0";
      }
      acts = std::move(out[0]);
    }
    return acts;
  }

 private:
  struct Group {
    std::unique_ptr<InProcessTpGroup> comm;  // declared first: outlives the runners
    std::vector<std::unique_ptr<GgufFile>> files;
    std::vector<std::unique_ptr<StageRunner>> ranks;
  };
  std::vector<Group> groups_;
};

// 8 prompts of 5 tokens, then n_gen greedy tokens each, all 8 sequences in every
// batch: the logits of every step (kSeqs rows) and each sequence's tokens.
struct Decode {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> tokens;
};

std::vector<std::vector<int32_t>> prompts(int64_t n_vocab) {
  std::vector<std::vector<int32_t>> p;
  for (int q = 0; q < kSeqs; ++q) {
    std::vector<int32_t> one;
    for (int i = 0; i < kPrompt; ++i) one.push_back(int32_t((1 + 37 * q + 101 * i) % n_vocab));
    p.push_back(one);
  }
  return p;
}

Decode decode(Pipeline& p, int n_gen = kGen) {
  const int64_t V = p.n_vocab();
  Decode d;
  d.tokens.resize(kSeqs);
  std::vector<BatchChunk> chunks;
  std::vector<int32_t> rows;
  for (int q = 0; q < kSeqs; ++q) {
    chunks.push_back({q, kPrompt, true});
    const auto pr = prompts(V)[size_t(q)];
    rows.insert(rows.end(), pr.begin(), pr.end());
  }
  for (int i = 0; i <= n_gen; ++i) {
    d.logits.push_back(p.step(chunks, rows));
    if (d.logits.back().size() != size_t(kSeqs * V)) throw std::runtime_error("wrong logit rows");
    if (i == n_gen) break;
    chunks.clear();
    rows.clear();
    for (int q = 0; q < kSeqs; ++q) {
      const int32_t next = argmax(d.logits.back().data() + q * V, V);
      d.tokens[size_t(q)].push_back(next);
      chunks.push_back({q, 1, true});
      rows.push_back(next);
    }
  }
  return d;
}

// The tiny model, the whole model's decode and its rank files, made once.
class Ds4TensorParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    SynthOptions o;
    o.arch = "deepseek4";
    o.shape = "deepseek4-tiny-q4";
    o.seed = 0xd54;
    model_ = dir_->file("ds4.gguf");
    write_synth_model(model_, o);
    Pipeline whole({{model_}});
    want_ = new Decode(decode(whole));
  }
  static void TearDownTestSuite() {
    delete want_;
    delete dir_;
    want_ = nullptr;
    dir_ = nullptr;
  }

  // The pipeline's decode of n_gen tokens against the whole model's first n_gen.
  static void expect_matches_whole(Pipeline& p, int n_gen) {
    const Decode got = decode(p, n_gen);
    const int64_t V = p.n_vocab();
    ASSERT_EQ(got.logits.size(), size_t(n_gen + 1));
    double worst = 0;
    for (size_t i = 0; i < got.logits.size(); ++i) {
      for (int q = 0; q < kSeqs; ++q) {
        const double d = max_rel_diff(want_->logits[i].data() + q * V, got.logits[i].data() + q * V, V);
        EXPECT_LT(d, 1e-5) << "step " << i << " sequence " << q;
        worst = std::max(worst, d);
      }
    }
    for (int q = 0; q < kSeqs; ++q) {
      const std::vector<int32_t>& all = want_->tokens[size_t(q)];
      EXPECT_EQ(got.tokens[size_t(q)], std::vector<int32_t>(all.begin(), all.begin() + n_gen)) << "sequence " << q;
    }
    std::printf("deepseek4-tiny: %d sequences x %zu steps, largest relative logit difference %.2e\n", kSeqs,
                got.logits.size(), worst);
  }

  static test::TempDir* dir_;
  static std::string model_;
  static Decode* want_;
};

test::TempDir* Ds4TensorParallel::dir_ = nullptr;
std::string Ds4TensorParallel::model_;
Decode* Ds4TensorParallel::want_ = nullptr;

TEST_F(Ds4TensorParallel, TwoRanksMatchTheWholeModel) {
  const std::vector<std::string> files = write_tp_ranks(model_, 2, dir_->file("tp2"));
  ASSERT_EQ(files.size(), 2u);
  Pipeline p({files});
  expect_matches_whole(p, kGen);
}

TEST_F(Ds4TensorParallel, TwoStagesOfTwoRanksMatchTheWholeModel) {
  // The hash layers 0-2 route by token id: they stay on the first stage.
  const std::vector<std::string> files = write_tp_ranks(model_, 2, dir_->file("pp"), "0:2,3:output");
  ASSERT_EQ(files.size(), 4u);  // stage by stage, rank by rank
  Pipeline p({{files[0], files[1]}, {files[2], files[3]}});
  // 16 tokens: the stage boundary adds no arithmetic of its own, and the
  // 64-token decode above already covers the sums' drift.
  expect_matches_whole(p, 16);
}

TEST_F(Ds4TensorParallel, BatchOfEightThroughTwoRanksEqualsEachSequenceAlone) {
  // The whole model, one sequence at a time (one slot, no batch): the
  // prompt's logits and those of its first greedy token; the two ranks ran
  // all 8 sequences in each batch.
  const std::vector<std::string> files = write_tp_ranks(model_, 2, dir_->file("batch"));
  Pipeline ranks({files});
  const int64_t V = ranks.n_vocab();
  std::vector<BatchChunk> chunks;
  std::vector<int32_t> rows;
  for (int q = 0; q < kSeqs; ++q) {
    chunks.push_back({q, kPrompt, true});
    const auto pr = prompts(V)[size_t(q)];
    rows.insert(rows.end(), pr.begin(), pr.end());
  }
  const std::vector<float> batched_prompt = ranks.step(chunks, rows);
  std::vector<BatchChunk> next_chunks;
  std::vector<int32_t> next_rows;
  for (int q = 0; q < kSeqs; ++q) {
    next_chunks.push_back({q, 1, true});
    next_rows.push_back(argmax(batched_prompt.data() + q * V, V));
  }
  const std::vector<float> batched_next = ranks.step(next_chunks, next_rows);

  GgufFile whole = GgufFile::open(model_);
  for (int q = 0; q < kSeqs; ++q) {
    SCOPED_TRACE("sequence " + std::to_string(q));
    StageConfig c = config();
    c.n_seq = 1;
    c.max_batch = kPrompt;
    Stage s(whole, c);
    const std::vector<float> alone_prompt = as_vector(s.forward(0, prompts(V)[size_t(q)]));
    ASSERT_EQ(alone_prompt.size(), size_t(V));
    EXPECT_LT(max_rel_diff(alone_prompt.data(), batched_prompt.data() + q * V, V), 1e-5);
    const int32_t one[1] = {next_rows[size_t(q)]};
    EXPECT_EQ(argmax(alone_prompt.data(), V), one[0]);
    const std::vector<float> alone_next = as_vector(s.forward(0, one));
    EXPECT_LT(max_rel_diff(alone_next.data(), batched_next.data() + q * V, V), 1e-5);
    EXPECT_EQ(argmax(alone_next.data(), V), argmax(batched_next.data() + q * V, V));
  }
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(Ds4TensorParallel, RankFilesMergeBackByteExact) {
  for (const std::string layers : {"", "0:2,3:output"}) {
    SCOPED_TRACE("layers '" + layers + "'");
    const std::string out = dir_->file(layers.empty() ? "merge1" : "merge2");
    const std::vector<std::string> files = write_tp_ranks(model_, 2, out, layers);
    // The rank files are smaller models: 1/2 of the heads, groups and expert width.
    const GgufFile r1 = GgufFile::open(files[1]);
    const Deepseek4Shape whole = Deepseek4Shape::from_gguf(GgufFile::open(model_));
    const Deepseek4Shape rank = Deepseek4Shape::from_gguf(r1);
    EXPECT_EQ(rank.n_head, whole.n_head / 2);
    EXPECT_EQ(rank.o_groups, whole.o_groups / 2);
    EXPECT_EQ(rank.n_ff_exp, whole.n_ff_exp / 2);
    EXPECT_EQ(rank.n_vocab, whole.n_vocab);
    EXPECT_EQ(rank.tp_size, 2);
    EXPECT_EQ(rank.tp_vocab_begin + rank.tp_vocab_count, whole.n_vocab);
    merge_parts(files, out + "/merged.gguf", nullptr);
    EXPECT_TRUE(bytes_of(out + "/merged.gguf") == bytes_of(model_)) << "the merged file differs from the source";
  }
}

TEST_F(Ds4TensorParallel, CutsOfEveryTensor) {
  const GgufFile f = GgufFile::open(model_);
  const TpDims d = read_tp_dims(f);
  const Deepseek4Shape s = Deepseek4Shape::from_gguf(f);
  const int64_t hd = s.head_dim, g = s.o_groups / 2, heads = s.n_head / 2, ff = s.n_ff_exp / 2;
  auto cut = [&](const std::string& name) { return tp_slice_tensor(d, *f.find_tensor(name), 2, 1); };
  TpSlice t = cut("blk.3.attn_q_b.weight");
  EXPECT_EQ(t.cut, TpCut::Rows);
  EXPECT_EQ(t.begin, heads * hd);
  EXPECT_EQ(t.ne[1], heads * hd);
  t = cut("blk.3.attn_sinks.weight");
  EXPECT_EQ(t.cut, TpCut::Rows);
  EXPECT_EQ(t.begin, heads);
  t = cut("blk.3.attn_output_a.weight");
  EXPECT_EQ(t.cut, TpCut::Rows);
  EXPECT_EQ(t.begin, g * s.o_lora_rank);
  EXPECT_EQ(t.ne[0], s.n_head * hd / s.o_groups);  // one group's heads: unchanged
  t = cut("blk.3.attn_output_b.weight");
  EXPECT_EQ(t.cut, TpCut::Columns);
  EXPECT_EQ(t.begin, g * s.o_lora_rank);
  for (const char* name : {"blk.3.ffn_gate_exps.weight", "blk.3.ffn_up_exps.weight"}) {
    t = cut(name);
    EXPECT_EQ(t.cut, TpCut::ExpertRows) << name;
    EXPECT_EQ(t.begin, ff) << name;
    EXPECT_EQ(t.ne[1], ff) << name;
    EXPECT_EQ(t.ne[2], s.n_expert) << name;
    EXPECT_EQ(t.nbytes * 2, f.find_tensor(name)->nbytes) << name;
  }
  t = cut("blk.3.ffn_down_exps.weight");
  EXPECT_EQ(t.cut, TpCut::Columns);
  EXPECT_EQ(t.ne[0], ff);
  EXPECT_EQ(t.ne[2], s.n_expert);
  EXPECT_EQ(cut("blk.3.ffn_up_shexp.weight").cut, TpCut::Rows);
  EXPECT_EQ(cut("blk.3.ffn_down_shexp.weight").cut, TpCut::Columns);
  EXPECT_EQ(cut("output.weight").cut, TpCut::Rows);
  for (const char* name : {"blk.2.attn_q_a.weight", "blk.2.attn_kv.weight", "blk.2.hc_attn_fn.weight",
                           "blk.2.ffn_gate_inp.weight", "blk.2.ffn_gate_tid2eid.weight", "blk.2.attn_compressor_kv.weight",
                           "blk.2.indexer.attn_q_b.weight", "blk.2.indexer_compressor_gate.weight",
                           "token_embd.weight", "output_hc_fn.weight", "output_norm.weight"}) {
    EXPECT_EQ(cut(name).cut, TpCut::Replicated) << name;
  }
}

TEST_F(Ds4TensorParallel, RankFileAndLinkMustAgree) {
  const std::vector<std::string> files = write_tp_ranks(model_, 2, dir_->file("link"));
  const std::vector<int32_t> prompt = {1, 2};
  StageConfig c = config();
  c.n_seq = 1;
  // A rank file without its group's link.
  {
    GgufFile f = GgufFile::open(files[1]);
    Stage s(f, c);
    try {
      s.forward(0, prompt);
      ADD_FAILURE() << "a rank file ran alone";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 of 2"), std::string::npos) << e.what();
    }
  }
  // The whole model given a link.
  {
    InProcessTpGroup group(2);
    GgufFile f = GgufFile::open(model_);
    StageConfig sc = c;
    sc.tp = &group.member(0);
    Stage s(f, sc);
    EXPECT_THROW(s.forward(0, prompt), std::invalid_argument);
  }
}

TEST_F(Ds4TensorParallel, ShapesThatDoNotDivideAreRefusedNamingTheTensor) {
  // 4 ranks do not divide the 2 output groups: refused at the first tensor
  // cut by groups, before any file is written.
  const std::string out = dir_->file("refused");
  try {
    write_tp_ranks(model_, 4, out);
    ADD_FAILURE() << "4 ranks were accepted";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'blk.0.attn_q_b.weight'"), std::string::npos) << what;
    EXPECT_NE(what.find("output_group_count = 2 is not a multiple of 4"), std::string::npos) << what;
  }
  EXPECT_FALSE(std::filesystem::exists(out) && !std::filesystem::is_empty(out));
  // A column cut off a quantization block: at 4 ranks a 512-wide Q2_K down
  // expert would be cut at 128, inside its 256-element blocks.
  const TpDims d = read_tp_dims(GgufFile::open(model_));
  GgufTensorInfo down;
  down.name = "blk.3.ffn_down_exps.weight";
  down.type = DType::Q2_K;
  down.n_dims = 3;
  down.ne[0] = d.n_ff;
  down.ne[1] = d.n_embd;
  down.ne[2] = 8;
  down.nbytes = *dtype_bytes(down.type, down.n_elements());
  try {
    tp_slice_tensor(d, down, 4, 1);
    ADD_FAILURE() << "a Q2_K column cut at 128 was accepted";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'blk.3.ffn_down_exps.weight'"), std::string::npos) << what;
    EXPECT_NE(what.find("256-element Q2_K block boundary"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace baton
