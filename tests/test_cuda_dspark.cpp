// The DSpark draft network on the GPU (engine/cuda/dspark_drafter.h) against
// the CPU's (engine/dspark/dspark_drafter.h, itself checked against the
// float64 reference tests/dspark_reference.py): the same context rows and
// bonus tokens give the same confidences, logits and draft tokens, through
// ring wrap-around and rollbacks; float weights and the published dtypes.
// Needs a GPU; skips without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "engine/cuda/dspark_drafter.h"
#include "engine/dspark/dspark_drafter.h"
#include "engine/dspark/dspark_weights.h"
#include "engine/gguf/file.h"
#include "gguf_split/synth.h"
#include "tests/test_cuda_util.h"
#include "tests/dspark_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

// deepseek4-tiny's block dims (rows of 256, every published dtype fits), a
// window of 32 so that 60 context rows wrap the 48-slot rings.
DsparkShape tiny_drafter() {
  Deepseek4Shape s = Deepseek4Shape::tiny();
  s.n_vocab = 512;
  s.n_hash_layers = 0;
  s.compress_ratios.assign(size_t(s.n_layer), 0);
  DsparkShape d = DsparkShape::for_target(s);
  d.markov_rank = 32;
  d.noise_token_id = 510;
  return d;
}

// A host tensor's bytes on the device, with a view of them.
struct DeviceTensor {
  test::DeviceArray<uint8_t> bytes;
  Tensor t;
  explicit DeviceTensor(const Tensor& host) : bytes(host.nbytes), t(host) {
    BATON_CUDA_CHECK(cudaMemcpy(bytes.get(), host.data, host.nbytes, cudaMemcpyHostToDevice));
    t.data = bytes.get();
  }
};

struct Pair {
  test::TempDir dir;
  DsparkShape shape = tiny_drafter();
  std::unique_ptr<GgufFile> f;
  std::unique_ptr<DsparkWeights> host;
  ThreadPool pool{2};
  std::unique_ptr<DsparkDrafter> cpu;
  std::unique_ptr<DeviceTensor> embd, head;
  std::shared_ptr<const DsparkDeviceWeights> weights;
  std::unique_ptr<CudaDsparkDrafter> gpu;

  Pair(const Ds4Types& types, uint64_t seed) {
    const std::string path = dir.file("drafter.gguf");
    write_dspark_file(path, shape, types, seed, true);
    f = std::make_unique<GgufFile>(GgufFile::open(path));
    host = std::make_unique<DsparkWeights>(*f, shape, std::vector<std::string>{"token_embd.weight", "output.weight"});
    cpu = std::make_unique<DsparkDrafter>(*host, host->get("token_embd.weight"), host->get("output.weight"), pool);
    embd = std::make_unique<DeviceTensor>(host->get("token_embd.weight"));
    head = std::make_unique<DeviceTensor>(host->get("output.weight"));
    LoadOptions load;
    load.slot_bytes = uint64_t(1) << 20;  // several pieces through the ring
    weights = std::make_shared<const DsparkDeviceWeights>(*f, shape, embd->t, head->t, load);
    gpu = std::make_unique<CudaDsparkDrafter>(weights);
  }
  void append(const std::vector<float>& rows) {
    const int64_t n = int64_t(rows.size()) / shape.feature_width();
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = cpu->n_context() + i;
    cpu->append_context(rows.data(), pos.data(), n);
    gpu->append_context(rows.data(), pos.data(), n);
  }
};

// One round on both: the same rows kept, confidences within `conf_tol`, each
// kept row's logits within `rel_tol` of the row's range, the same token
// wherever the CPU's top two are apart by more than twice the tolerance.
// Returns the number of rows compared.
int compare_round(Pair& p, int32_t bonus, float threshold, double conf_tol, double rel_tol) {
  const int64_t pos = p.cpu->n_context();
  const DsparkDraft c = p.cpu->draft(bonus, pos, threshold, 5);
  const DsparkDraft g = p.gpu->draft(bonus, pos, threshold, 5);
  const int64_t V = p.shape.target.n_vocab;
  EXPECT_EQ(c.confidence.size(), g.confidence.size());
  for (size_t i = 0; i < std::min(c.confidence.size(), g.confidence.size()); ++i) {
    EXPECT_NEAR(c.confidence[i], g.confidence[i], conf_tol) << "row " << i;
  }
  EXPECT_EQ(c.tokens.size(), g.tokens.size());
  const size_t rows = std::min(c.tokens.size(), g.tokens.size());
  for (size_t r = 0; r < rows; ++r) {
    const float* a = c.logits.data() + r * size_t(V);
    const float* b = g.logits.data() + r * size_t(V);
    const auto [lo, hi] = std::minmax_element(a, a + V);
    const double range = std::max(1e-6, double(*hi - *lo));
    double worst = 0;
    for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(double(a[v]) - double(b[v])) / range);
    EXPECT_LT(worst, rel_tol) << "row " << r;
    std::vector<float> sorted(a, a + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 2 * rel_tol * range) {
      EXPECT_EQ(c.tokens[r], g.tokens[r]) << "row " << r;
    } else if (c.tokens[r] != g.tokens[r]) {
      break;  // a near-tie picked the other way: later rows follow other tokens
    }
  }
  return int(rows);
}

void check_drafters_agree(const Ds4Types& types, double conf_tol, double rel_tol) {
  Pair p(types, 11);
  const int64_t F = p.shape.feature_width();
  // 60 rows: the rings (window 32 + 16 spare slots) wrap.
  p.append(test::random_rows(60, F, 1));
  EXPECT_EQ(p.gpu->n_context(), 60);
  int compared = 0;
  for (int32_t bonus : {3, 77, 400}) compared += compare_round(p, bonus, 0.0f, conf_tol, rel_tol);
  EXPECT_GE(compared, 12);
  // A verify kept 2 of 5 rows: both cut back, then take the kept rows.
  p.append(test::random_rows(5, F, 2));
  p.cpu->truncate(62);
  p.gpu->truncate(62);
  p.append(test::random_rows(3, F, 3));
  compared = compare_round(p, 9, 0.0f, conf_tol, rel_tol);
  EXPECT_EQ(compared, 5);
  // Without logits: the same tokens and confidences, nothing else copied.
  const DsparkDraft full = p.gpu->draft(9, p.gpu->n_context(), 0.0f, 5);
  p.gpu->set_return_logits(false);
  const DsparkDraft bare = p.gpu->draft(9, p.gpu->n_context(), 0.0f, 5);
  p.gpu->set_return_logits(true);
  EXPECT_TRUE(bare.logits.empty());
  EXPECT_EQ(bare.tokens, full.tokens);
  EXPECT_EQ(bare.confidence, full.confidence);
  // A threshold stops both at the same row (row 0 always kept).
  const DsparkDraft one = p.gpu->draft(5, p.gpu->n_context(), 1.1f, 5);
  EXPECT_EQ(one.tokens.size(), 1u);
  EXPECT_EQ(one.confidence.size(), 1u);
  compare_round(p, 5, 0.5f, conf_tol, rel_tol);
}

// F32 weights: the two networks differ only by the order of their sums, but
// the FP8 rounding of the KV rows is a step function: a last-bit difference
// before it can move a value by one FP8 step, which reaches the logits as a
// few 1e-4 of their range (seen on an H100 at 5e-4); a wrong equation moves
// them by tenths.
TEST(CudaDspark, FloatDrafterMatchesCpu) {
  BATON_REQUIRE_CUDA();
  check_drafters_agree(test::ds4_all_f32(), 2e-3, 2e-3);
}

TEST(CudaDspark, PublishedDtypesMatchCpu) {
  BATON_REQUIRE_CUDA();
  // Q8_0 projections and head, IQ2_XXS / Q2_K experts: the GPU reads the
  // activations quantized to 16 bits (matvec_xq), the CPU in float.
  check_drafters_agree(Ds4Types::q2(), 5e-3, 5e-3);
}

// Two GPU contexts' rounds: the same tokens and confidences, logits to the
// last bits (the same kernels on the same inputs).
void expect_same_rounds(const DsparkDraft& a, const DsparkDraft& b) {
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.confidence.size(), b.confidence.size());
  for (size_t i = 0; i < a.confidence.size(); ++i) EXPECT_NEAR(a.confidence[i], b.confidence[i], 1e-6) << "row " << i;
  ASSERT_EQ(a.logits.size(), b.logits.size());
  double worst = 0, size = 1;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a.logits[i]) - b.logits[i]));
    size = std::max(size, std::fabs(double(b.logits[i])));
  }
  EXPECT_LT(worst, 1e-5 * size);
}

// Contexts over one set of weights (serve's slots) keep their own windows
// and workspace: another context's rows and rounds in between change
// nothing. Set against a third context fed the same rows alone, not against
// the CPU: the two networks differ by rounding, which the FP8 step of the KV
// rows can amplify (above). The third queues its launches one by one, so
// the captured round (replayed at a later position too) is checked as well.
TEST(CudaDspark, ContextsShareTheWeightsOnlyAndTheGraphIsTheQueue) {
  BATON_REQUIRE_CUDA();
  Pair p(test::ds4_all_f32(), 13);
  const int64_t F = p.shape.feature_width();
  CudaDsparkDrafter other(p.weights), alone(p.weights);
  alone.set_graph(false);
  const std::vector<float> mine = test::random_rows(47, F, 7);
  std::vector<int64_t> pos(50);
  for (int64_t i = 0; i < 50; ++i) pos[size_t(i)] = i;
  p.gpu->append_context(mine.data(), pos.data(), 40);
  alone.append_context(mine.data(), pos.data(), 40);
  const std::vector<float> rows = test::random_rows(50, F, 8);
  other.append_context(rows.data(), pos.data(), 50);
  other.draft(11, 50, 0.0f, 5);
  expect_same_rounds(p.gpu->draft(21, 40, 0.0f, 5), alone.draft(21, 40, 0.0f, 5));
  EXPECT_TRUE(p.gpu->graphed());
  EXPECT_FALSE(alone.graphed());
  p.gpu->append_context(mine.data() + 40 * F, pos.data() + 40, 7);
  alone.append_context(mine.data() + 40 * F, pos.data() + 40, 7);
  other.draft(12, 50, 0.0f, 5);
  expect_same_rounds(p.gpu->draft(33, 47, 0.0f, 5), alone.draft(33, 47, 0.0f, 5));
}

TEST(CudaDspark, RefusesWrongPositionsAndDeepRollbacks) {
  BATON_REQUIRE_CUDA();
  Pair p(test::ds4_all_f32(), 12);
  const int64_t F = p.shape.feature_width();
  const std::vector<float> rows = test::random_rows(20, F, 4);
  const int64_t wrong[1] = {5};
  EXPECT_THROW(p.gpu->append_context(rows.data(), wrong, 1), std::invalid_argument);
  p.append(rows);
  EXPECT_THROW(p.gpu->truncate(20 - DsparkShape::kSpareRows - 1), std::invalid_argument);
  EXPECT_THROW(p.gpu->draft(1, 19, 0.0f, 5), std::invalid_argument);  // not at n_context()
  EXPECT_THROW(p.gpu->draft(-1, 20, 0.0f, 5), std::invalid_argument);
  p.gpu->truncate(20 - DsparkShape::kSpareRows);
  EXPECT_EQ(p.gpu->n_context(), 20 - DsparkShape::kSpareRows);
}

}  // namespace
}  // namespace baton
