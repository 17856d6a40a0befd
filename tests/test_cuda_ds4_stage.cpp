// The CUDA deepseek4 stage against the CPU stage on `deepseek4-tiny`
// (random weights, every layer kind: sliding-only, ratio 4 with the
// indexer, ratio 128; hash and top-k routing). A 320-token prompt gives 80
// ratio-4 rows (the indexer keeps 8 of them) and 2 ratio-128 rows; its
// logits are compared at every position (prefill: cuBLAS GEMMs and grouped
// experts), then token-by-token decode (the captured graph), a 5-token
// batch (matvec and moe_decode), two stages passing the HC state, a Q4 file,
// a file whose expert types differ by layer, a batch of 12 sequences, and
// greedy tokens through the backend seam. The plan test runs without a
// GPU; the rest skip.
//
// Tolerance, per logit row, relative to its max |logit|: the CPU is exact
// float32; the GPU rounds activations to F16 for cuBLAS in prefill (about
// 5e-4 relative per product) and to 16-bit integers in the decode matvecs,
// through ~12 projections per layer and 5 layers: about 1e-3 on a typical
// row, so the median row must stay under 5e-3. Random weights also leave
// near-ties in the discrete choices (the indexer's top-k, whose 4 heads' relu
// scores often tie at 0, and the router's top 2 of 8); rounding flips a few
// of them, and a flipped choice moves that token's logits by up to O(1).
// Such rows are allowed up to a small share (10% of the prompt, 2 of 13
// decode rows); a real error in a path (window ring, compressed rows,
// indexer, experts) touches most rows after its first use and fails the
// median.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/backend.h"
#include "engine/cuda/stages/ds4.h"
#include "engine/gguf/file.h"
#include "engine/runtime/stage.h"
#include "gguf_split/synth.h"
#include "tests/test_cuda_ds4_util.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::kDecodeTol;
using test::kOutlier;
using test::kOutlierShare;
using test::kTypical;
using test::random_tokens;
using test::rel_err;
using test::RowErrors;
using test::write_tiny;
constexpr int64_t kPrompt = 320;

// A file whose expert types differ by layer, as users' mixed files do:
// the Q2 tiny model with the routed experts of layers 2 and 4 taken from its
// Q4 twin; CPU and GPU run the same spliced file. The CUDA
// stage picks the integer-dot expert kernels per layer (IQ2_XXS / Q2_K) and
// the dequantizing ones for Q4_K.
std::string write_mixed(const test::TempDir& dir, uint64_t seed) {
  const GgufFile q2 = GgufFile::open(write_tiny(dir, "q2", seed));
  const GgufFile q4 = GgufFile::open(write_tiny(dir, "q4", seed));
  GgufWriter w;
  for (const auto& [key, value] : q2.metadata()) w.set(key, value);
  auto from_q4 = [](const std::string& name) {
    for (const char* l : {"blk.2.", "blk.4."}) {
      if (name.rfind(l, 0) == 0 && name.find("_exps.") != std::string::npos) return true;
    }
    return false;
  };
  int swapped = 0;
  for (const GgufTensorInfo& t : q2.tensors()) {
    const GgufFile& src = from_q4(t.name) ? q4 : q2;
    const GgufTensorInfo& st = *src.find_tensor(t.name);
    swapped += &src == &q4;
    std::vector<int64_t> ne(st.ne, st.ne + st.n_dims);
    w.add_tensor(st.name, st.type, ne, [&src, &st](uint8_t* dst, uint64_t) { src.read_tensor(st, dst); });
  }
  EXPECT_EQ(swapped, 6);  // gate, up and down of two layers
  const std::string path = dir.file("tiny-mixed.gguf");
  w.write(path);
  return path;
}

StageConfig config(int64_t batch, bool all_logits) {
  StageConfig c;
  c.n_ctx = 512;
  c.max_batch = batch;
  c.all_logits = all_logits;
  c.n_threads = 4;
  return c;
}

TEST(CudaDs4Stage, PlanKvLineEqualsCpuPlan) {
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", 7));
  for (int first : {0, 3}) {
    StageConfig c = config(64, false);
    c.first_layer = first;
    c.embedding = first == 0;
    c.n_seq = 2;
    const MemoryPlan gpu = CudaDs4Stage::plan(f, c);
    const MemoryPlan cpu = Stage::plan(f, c);
    EXPECT_EQ(gpu.bytes(PlanLine::KvCache), cpu.bytes(PlanLine::KvCache)) << "first layer " << first;
    EXPECT_GT(gpu.bytes(PlanLine::Weights), 0u);
    EXPECT_EQ(gpu.bytes(PlanLine::Weights), cpu.bytes(PlanLine::Weights));
    EXPECT_GT(gpu.bytes(PlanLine::Workspace), 0u);
  }
}

// Prefill logits of every prompt position, then 8 decode steps and one
// 5-token batch, against the CPU.
void compare_with_cpu(const std::string& type) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + type);
  test::TempDir dir;
  const GgufFile f = GgufFile::open(type == "mixed" ? write_mixed(dir, seed) : write_tiny(dir, type, seed));
  if (type == "mixed") {
    ASSERT_EQ(f.find_tensor("blk.1.ffn_gate_exps.weight")->type, DType::IQ2_XXS);
    ASSERT_EQ(f.find_tensor("blk.2.ffn_gate_exps.weight")->type, DType::Q4_K);
    ASSERT_EQ(f.find_tensor("blk.4.ffn_down_exps.weight")->type, DType::Q4_K);
    ASSERT_EQ(f.find_tensor("blk.3.ffn_down_exps.weight")->type, DType::Q2_K);
  }
  Stage cpu(f, config(kPrompt, true));
  CudaDs4Stage gpu(f, config(kPrompt, true));
  const int64_t V = cpu.n_vocab();
  const auto prompt = random_tokens(seed + 1, size_t(kPrompt), V);
  const auto c0 = cpu.forward(0, prompt);
  const std::vector<float> want(c0.begin(), c0.end());
  const auto got = gpu.forward(0, prompt);
  ASSERT_EQ(got.size(), size_t(kPrompt * V));
  RowErrors pre, dec;
  for (int64_t t = 0; t < kPrompt; ++t) {
    const size_t at = size_t(t * V);
    pre.add(rel_err(got.subspan(at, size_t(V)), std::span<const float>(want).subspan(at, size_t(V))));
  }
  pre.report(("[" + type + "] prefill").c_str());
  EXPECT_LT(pre.quantile(0.5), kTypical);
  EXPECT_LE(pre.over(kOutlier), kOutlierShare);

  const auto extra = random_tokens(seed + 2, 13, V);
  for (int i = 0; i < 8; ++i) {
    const std::span<const int32_t> one(&extra[size_t(i)], 1);
    const auto cw = cpu.forward(0, one);
    const std::vector<float> w1(cw.begin(), cw.end());
    dec.add(rel_err(gpu.forward(0, one), w1));
  }
  // Five tokens at once: the small-batch matvec and moe_decode path.
  const std::span<const int32_t> five(&extra[8], 5);
  const auto c5 = cpu.forward(0, five);
  const std::vector<float> w5(c5.begin(), c5.end());
  const auto g5 = gpu.forward(0, five);
  for (int64_t t = 0; t < 5; ++t) {
    const size_t at = size_t(t * V);
    dec.add(rel_err(g5.subspan(at, size_t(V)), std::span<const float>(w5).subspan(at, size_t(V))));
  }
  dec.report(("[" + type + "] decode + 5-token batch").c_str());
  EXPECT_LT(dec.quantile(0.5), kTypical);
  EXPECT_LE(dec.over(kOutlier), 2.0 / 13.0);
  EXPECT_EQ(gpu.position(0), kPrompt + 13);
}

TEST(CudaDs4Stage, Q2MatchesCpu) {
  BATON_REQUIRE_CUDA();
  compare_with_cpu("q2");
}

TEST(CudaDs4Stage, MixedExpertTypesMatchCpu) {
  BATON_REQUIRE_CUDA();
  compare_with_cpu("mixed");
}

TEST(CudaDs4Stage, Q4MatchesCpu) {
  BATON_REQUIRE_CUDA();
  compare_with_cpu("q4");
}

// Layers 0-2 (the hash layers, with the embedding) and 3-4 (with the head)
// on two stages passing the HC state equal the whole model on one.
TEST(CudaDs4Stage, TwoStagesEqualWhole) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", seed));
  CudaDs4Stage whole(f, config(kPrompt, false));
  StageConfig c1 = config(kPrompt, false), c2 = config(kPrompt, false);
  c1.last_layer = 2;
  c1.head = false;
  c2.first_layer = 3;
  c2.embedding = false;
  CudaDs4Stage a(f, c1), b(f, c2);
  const int64_t V = whole.n_vocab();
  const int64_t HC = whole.arch().boundary_elems_per_token();
  auto tokens = random_tokens(seed + 3, size_t(kPrompt), V);
  double worst = 0;
  auto step = [&](std::span<const int32_t> t) {
    const auto w = whole.forward(0, t);
    const std::vector<float> want(w.begin(), w.end());
    const auto mid = a.forward(0, t);
    ASSERT_EQ(mid.size(), t.size() * size_t(HC));
    const std::vector<float> state(mid.begin(), mid.end());
    worst = std::max(worst, rel_err(b.forward(0, state, int64_t(t.size())), want));
  };
  step(tokens);
  for (int i = 0; i < 4; ++i) step(std::span<const int32_t>(&tokens[size_t(i)], 1));
  std::printf("two stages vs whole: max rel err %.3g\n", worst);
  // The same kernels on the same data: only launch shapes could differ.
  EXPECT_LT(worst, 1e-5);
}

// A batch of several sequences in one forward (enqueue_batch): prompt
// chunks of different lengths beside single decode tokens, sequences that
// start late, a chunk that asks for no logits, then decode-only batches of
// 12 rows (small_matmul, experts per pair) and 5 rows (the matvecs). Each
// output row against the CPU running that sequence alone.
TEST(CudaDs4Stage, BatchOfSequencesMatchesCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", seed));
  constexpr int kSeqs = 12;
  StageConfig c = config(128, false);
  c.n_seq = kSeqs;
  Stage cpu(f, c);
  CudaDs4Stage gpu(f, c);
  ASSERT_TRUE(gpu.batches());
  const int64_t V = cpu.n_vocab();
  std::mt19937_64 rng(seed + 5);
  RowErrors err;
  int steps = 0;
  // lengths[s]: the tokens sequence s takes this step (0: not in the batch);
  // quiet: a sequence whose chunk asks for no logits.
  auto step = [&](const std::vector<int64_t>& lengths, int quiet) {
    std::vector<BatchChunk> chunks;
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> want;
    for (int sq = 0; sq < kSeqs; ++sq) {
      if (lengths[size_t(sq)] == 0) continue;
      const auto t = random_tokens(rng(), size_t(lengths[size_t(sq)]), V);
      chunks.push_back({sq, lengths[size_t(sq)], sq != quiet});
      tokens.insert(tokens.end(), t.begin(), t.end());
      const auto l = cpu.forward(sq, t);
      if (sq != quiet) want.emplace_back(l.begin(), l.end());
    }
    const auto got = gpu.forward_batch(chunks, tokens);
    ASSERT_EQ(got.size(), want.size() * size_t(V));
    for (size_t i = 0; i < want.size(); ++i) err.add(rel_err(got.subspan(i * size_t(V), size_t(V)), want[i]));
    ++steps;
  };
  // 86 rows: two long prompts (tensor-core attention), short ones, and
  // sequence 2's chunk without logits.
  step({40, 17, 5, 1, 3, 2, 9, 1, 1, 4, 2, 1}, 2);
  // 14 rows: sequence 2's next 3 tokens beside 11 decode tokens.
  step({1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1}, -1);
  for (int i = 0; i < 3; ++i) step(std::vector<int64_t>(kSeqs, 1), -1);  // 12 decode rows
  // Decode batches replay one graph per batch size: 5 rows of other
  // sequences at other positions take the graph the first 5 captured.
  for (int i = 0; i < 3; ++i) step({1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0}, -1);  // 5 decode rows
  for (int i = 0; i < 2; ++i) step({0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 1, 0}, -1);  // 5 other decode rows
  err.report("batch of sequences");
  EXPECT_LT(err.quantile(0.5), kTypical);
  EXPECT_LE(err.over(kOutlier), 0.15);
  for (int sq = 0; sq < kSeqs; ++sq) EXPECT_EQ(gpu.position(sq), cpu.position(sq)) << "sequence " << sq;
  EXPECT_EQ(steps, 10);
}

// Greedy tokens through the backend seam (what `baton run` uses): the CUDA
// runner's on-device argmax against the CPU's, teacher-forced with the CPU's
// token, compared where the CPU's top-1 margin exceeds the decode tolerance
// (random weights can leave near-ties that any rounding flips).
TEST(CudaDs4Stage, GreedyTokensMatchCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", seed));
  auto cpu = make_stage_runner(Backend::Cpu, f, config(64, false));
  auto gpu = make_stage_runner(Backend::Cuda, f, config(64, false));
  ASSERT_EQ(gpu->backend(), Backend::Cuda);
  const int64_t V = cpu->n_vocab();
  const auto prompt = random_tokens(seed + 4, 300, V);
  std::vector<float> logits;
  int32_t g = 0;
  for (size_t at = 0; at < prompt.size(); at += 64) {
    const std::span<const int32_t> chunk(prompt.data() + at, std::min<size_t>(64, prompt.size() - at));
    const auto l = cpu->forward(0, chunk);
    logits.assign(l.begin(), l.end());
    g = gpu->forward_greedy(0, chunk);
  }
  int compared = 0;
  for (int i = 0; i < 8; ++i) {
    std::vector<float> sorted = logits;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    double scale = 0;
    for (float v : logits) scale = std::max(scale, std::fabs(double(v)));
    const int32_t want = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (sorted[0] - sorted[1] > 2 * kDecodeTol * scale) {
      EXPECT_EQ(g, want) << "step " << i;
      ++compared;
    }
    const std::span<const int32_t> one(&want, 1);
    const auto l = cpu->forward(0, one);
    logits.assign(l.begin(), l.end());
    g = gpu->forward_greedy(0, one);
  }
  std::printf("greedy: %d of 8 steps had a clear CPU top-1 and were compared\n", compared);
  EXPECT_GE(compared, 1);
}

}  // namespace
}  // namespace baton
