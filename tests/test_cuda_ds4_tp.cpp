// Tensor-parallel ranks of deepseek4 on the CUDA stage (docs/TENSOR_PARALLEL.md,
// "deepseek4"): the rank files of `baton split --tp 2` of `deepseek4-tiny`
// (gguf_split/synth.h), each in a CudaDs4Stage on one GPU, linked by an
// in-process group (two threads). Every rank must end each step with the
// same logits bit for bit. Against the whole model on the CUDA stage (one
// rank), the greedy picks must be the same and the last-position logits
// within the tolerances tests/test_cuda_ds4_stage.cpp holds the CUDA stage
// to against the CPU: a rank's projections round their own inputs (the
// 16-bit activations of matvec_xq are scaled per row, and a rank's row of
// attn_output_b's input holds only its groups), so the two differ by
// rounding, and random weights leave near-ties in the router's and the
// indexer's top-k that rounding may flip. A pick is compared where the
// reference's top-1 margin is clear (above 2 x kDecodeTol of the row's
// scale). The plan, the refusals and the registry run everywhere; the rest
// skip without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/stages/ds4.h"
#include "engine/gguf/file.h"
#include "engine/model/part_info.h"
#include "engine/model/registry.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/batch.h"
#include "engine/runtime/stage.h"
#include "engine/runtime/tp_comm.h"
#include "engine/tp/slice.h"
#include "gguf_split/split.h"
#include "gguf_split/synth.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"
#include "tests/tp_test_util.h"

namespace baton {
namespace {

using namespace tp_test;

// tests/test_cuda_ds4_stage.cpp's tolerances (CUDA against CPU).
constexpr double kTypical = 5e-3;    // median row error
constexpr double kOutlier = 3e-2;    // a row above this counts as flipped
constexpr double kDecodeTol = 1e-2;  // picks are compared where the top-1 margin exceeds 2x this

std::string write_tiny(const test::TempDir& dir, const std::string& type, uint64_t seed) {
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-tiny";
  o.type = type;
  o.seed = seed;
  const std::string path = dir.file("tiny-" + type + ".gguf");
  write_synth_model(path, o);
  return path;
}

std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return t;
}

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// Whether the row's top-1 leads its second by more than 2 x kDecodeTol of
// its scale: a pick rounding cannot flip.
bool clear_pick(std::span<const float> row) {
  std::vector<float> top(row.begin(), row.end());
  std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
  double scale = 0;
  for (float v : row) scale = std::max(scale, std::fabs(double(v)));
  return double(top[0]) - double(top[1]) > 2 * kDecodeTol * scale;
}

// Relative errors of logit rows: the typical one and the few outliers.
struct RowErrors {
  std::vector<double> e;
  void add(double v) { e.push_back(v); }
  double quantile(double q) const {
    std::vector<double> s = e;
    std::sort(s.begin(), s.end());
    return s.empty() ? 0.0 : s[std::min(s.size() - 1, size_t(q * double(s.size())))];
  }
  int over(double tol) const { return int(std::count_if(e.begin(), e.end(), [&](double v) { return v > tol; })); }
  void report(const std::string& what) const {
    std::printf("%s: %zu rows, rel err median %.3g, p90 %.3g, max %.3g\n", what.c_str(), e.size(), quantile(0.5),
                quantile(0.9), quantile(1.0));
  }
};

StageConfig config(int64_t max_batch, int n_seq = 1) {
  StageConfig c;
  c.n_ctx = 512;
  c.max_batch = max_batch;
  c.n_seq = n_seq;
  c.n_threads = 2;
  return c;
}

// A decode of one sequence: the last-position logits of the prompt and of
// every step, their argmax, and the last pick through forward_greedy (the
// argmax on the device).
struct Decode {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
  int32_t device_pick = -1;
};

// Teacher-forced: the prompt in one forward, `feed` one token at a time (the
// decode graph; cut at the exchanges on a rank), a 5-token forward (the
// small-batch matvecs, queued), then the last pick fed through
// forward_greedy, whose pick (of a row not in `logits`) is device_pick.
Decode forced(StageRunner& s, const std::vector<int32_t>& prompt, const std::vector<int32_t>& feed,
              const std::vector<int32_t>& five) {
  Decode d;
  d.logits.push_back(as_vector(s.forward(0, prompt)));
  for (int32_t t : feed) d.logits.push_back(as_vector(s.forward(0, std::span<const int32_t>(&t, 1))));
  d.logits.push_back(as_vector(s.forward(0, five)));
  for (const auto& row : d.logits) d.tokens.push_back(argmax(row));
  d.device_pick = s.forward_greedy(0, std::span<const int32_t>(&d.tokens.back(), 1));
  return d;
}

// The rank files' stages of one group, built one after another on this
// thread (construction captures the decode graphs and calls no peer), run
// on a thread each. The group waits up to 2 minutes for a rank (the suite
// also runs under compute-sanitizer).
struct Ds4Ranks {
  Ds4Ranks(const std::vector<std::string>& paths, StageConfig c) : group(int(paths.size()), 120000) {
    for (const auto& p : paths) files.push_back(GgufFile::open(p));
    for (size_t r = 0; r < paths.size(); ++r) {
      StageConfig rc = c;
      if (const std::optional<PartInfo> part = read_part_info(files[r])) {
        rc.first_layer = part->range.first;
        rc.last_layer = part->range.last;
        rc.embedding = part->has_embedding;
        rc.head = part->has_output;
      }
      rc.tp = &group.member(int(r));
      stages.push_back(std::make_unique<CudaDs4Stage>(files[r], rc));
    }
  }
  int size() const { return group.size(); }
  CudaDs4Stage& operator[](int r) { return *stages[size_t(r)]; }

  InProcessTpGroup group;  // declared first: outlives the stages
  std::vector<GgufFile> files;
  std::vector<std::unique_ptr<CudaDs4Stage>> stages;
};

// Every rank's run of fn; all ranks must hold the same bits and picks.
Decode on_ranks(Ds4Ranks& ranks, const std::function<Decode(StageRunner&)>& fn) {
  const int n = ranks.size();
  std::vector<Decode> out(static_cast<size_t>(n));
  on_threads(n, [&](int r) {
    ranks[r].reset(0);
    out[size_t(r)] = fn(ranks[r]);
  });
  for (int r = 1; r < n; ++r) {
    SCOPED_TRACE(fmt::format("rank {} against rank 0", r));
    EXPECT_EQ(out[size_t(r)].tokens, out[0].tokens);
    EXPECT_EQ(out[size_t(r)].device_pick, out[0].device_pick);
    EXPECT_EQ(out[size_t(r)].logits.size(), out[0].logits.size());
    for (size_t i = 0; i < std::min(out[size_t(r)].logits.size(), out[0].logits.size()); ++i) {
      EXPECT_EQ(bit_difference(out[size_t(r)].logits[i], out[0].logits[i]), "") << "step " << i;
    }
  }
  return out[0];
}

// got against want, row by row: the median and the outliers within the
// CUDA stage's tolerances (at most max_outliers rows, and at least 10% of
// the rows may be), and every clear pick of want's equal but on an outlier
// row (a flipped router or indexer choice moves that row by up to O(1)).
void expect_close(const Decode& got, const Decode& want, int max_outliers, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  max_outliers = std::max(max_outliers, int(want.logits.size() / 10));
  RowErrors err;
  int compared = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    err.add(rel_err(got.logits[i], want.logits[i]));
    if (!clear_pick(want.logits[i]) || err.e.back() > kOutlier) continue;
    ++compared;
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << "step " << i << ": the reference's " << top_two(want.logits[i])
                                             << "; got " << top_two(got.logits[i]) << " (rel err " << err.e.back()
                                             << ")";
  }
  err.report(what);
  std::printf("%s: %d of %zu picks clear and compared\n", what.c_str(), compared, want.logits.size());
  EXPECT_LT(err.quantile(0.5), kTypical);
  EXPECT_LE(err.over(kOutlier), max_outliers);
  EXPECT_GE(compared, 1) << "no clear pick to compare";
}

// The logits [begin, begin + count) of every row and their argmax.
Decode own_slice(const Decode& d, int64_t begin, int64_t count) {
  Decode out;
  for (const auto& row : d.logits) {
    out.logits.emplace_back(row.begin() + begin, row.begin() + begin + count);
    out.tokens.push_back(argmax(out.logits.back()));
  }
  return out;
}

// ---------------------------------------------------------------- everywhere

// The registry lets the CUDA backend take deepseek4 rank files.
TEST(CudaDs4Tp, RegistryRunsDeepseek4RankFilesOnCuda) {
  const ArchEntry* e = find_arch("deepseek4");
  ASSERT_NE(e, nullptr);
  ASSERT_NE(e->cuda, nullptr) << "a CUDA build has a deepseek4 stage";
  EXPECT_TRUE(e->cuda->tensor_parallel);
}

// A rank's plan: the whole KV cache (the latent KV row, the compressors and
// the indexer serve every head, so deepseek4's KV is not divided), less
// weights, and pinned rooms for a host group's exchanges (the sums' rows of
// the planned batch, the gather's blocks).
TEST(CudaDs4Tp, RankPlanHoldsItsSliceAndTheExchangeRooms) {
  test::TempDir dir;
  const std::string whole = write_tiny(dir, "q2", 3);
  const std::vector<std::string> files = write_tp_ranks(whole, 2, dir.path().string());
  ASSERT_EQ(files.size(), 2u);
  const StageConfig c = config(16, 2);
  const MemoryPlan w = CudaDs4Stage::plan(GgufFile::open(whole), c);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(files[size_t(r)]);
    const GgufFile f = GgufFile::open(files[size_t(r)]);
    const MemoryPlan p = CudaDs4Stage::plan(f, c);
    EXPECT_EQ(p.bytes(PlanLine::KvCache), w.bytes(PlanLine::KvCache));
    EXPECT_LT(p.bytes(PlanLine::Weights), w.bytes(PlanLine::Weights));
    EXPECT_EQ(p.bytes(PlanLine::Weights), Stage::plan(f, c).bytes(PlanLine::Weights));
    // Pinned: at least the sums' 16 x 256 floats beyond the whole model's io.
    EXPECT_GE(p.bytes(PlanLine::PinnedIo), w.bytes(PlanLine::PinnedIo) + 16u * 256u * 4u);
  }
}

// A rank file without its group's link, a link of another rank or size, and
// a whole model given a link are refused before anything is allocated.
TEST(CudaDs4Tp, RankFileAndLinkMustAgree) {
  test::TempDir dir;
  const std::string whole = write_tiny(dir, "q2", 4);
  const std::vector<std::string> files = write_tp_ranks(whole, 2, dir.path().string());
  auto refused = [](const std::string& path, TpComm* tp, const std::string& needle) {
    const GgufFile f = GgufFile::open(path);
    StageConfig c = config(4);
    c.tp = tp;
    try {
      CudaDs4Stage s(f, c);
      ADD_FAILURE() << "constructed " << path;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  InProcessTpGroup two(2), four(4);
  refused(files[1], nullptr, "rank 1 of 2, but the stage runs as rank 0 of 1");
  refused(files[1], &two.member(0), "rank 1 of 2, but the stage runs as rank 0 of 2");
  refused(files[0], &four.member(0), "rank 0 of 2, but the stage runs as rank 0 of 4");
  refused(whole, &two.member(0), "rank 0 of 1, but the stage runs as rank 0 of 2");
}

// ---------------------------------------------------------------- on a GPU

// Two ranks against the whole model on the CUDA stage, Q2 (integer-dot
// experts) and Q4 (dequantizing experts): a 150-token prompt in one forward
// (cuBLAS GEMMs, tensor-core attention, grouped experts with their host
// synchronization; its positions pass the window, fill the indexer's top-k
// and make a ratio-128 row), 24 decode steps through the cut graph
// teacher-forced with the whole model's greedy picks, a 5-token forward
// and a last pick on the device.
TEST(CudaDs4Tp, TwoRanksGiveTheOneRankPicks) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  std::printf("seed %llu (BATON_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  for (const std::string type : {"q2", "q4"}) {
    SCOPED_TRACE("seed " + std::to_string(seed) + ", " + type);
    test::TempDir dir;
    const std::string model = write_tiny(dir, type, seed);
    const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
    const StageConfig c = config(160);
    const GgufFile whole_file = GgufFile::open(model);
    CudaDs4Stage whole(whole_file, c);
    const int64_t V = whole.n_vocab();
    const std::vector<int32_t> prompt = random_tokens(seed + 1, 150, V);
    const std::vector<int32_t> five = random_tokens(seed + 2, 5, V);

    // The whole model's own greedy picks, fed back to every run.
    std::vector<int32_t> feed;
    {
      int32_t next = argmax(whole.forward(0, prompt));
      for (int i = 0; i < 24; ++i) {
        feed.push_back(next);
        next = argmax(whole.forward(0, std::span<const int32_t>(&next, 1)));
      }
    }
    whole.reset(0);
    const Decode want = forced(whole, prompt, feed, five);
    Ds4Ranks ranks(files, c);
    const Decode got = on_ranks(ranks, [&](StageRunner& s) { return forced(s, prompt, feed, five); });
    expect_close(got, want, 2, type + " tp 2 against one CUDA rank");
    // The pick of one more step, whose logits stay on the device: the
    // ranks' agree (on_ranks); against one rank it may be a near-tie.
    std::printf("%s: the device's last pick %d, one CUDA rank's %d\n", type.c_str(), got.device_pick,
                want.device_pick);
  }
}

// A batch of sequences through two ranks (one forward of all their rows, a
// sum carrying every row): 4 prompts of 2..5 tokens in one prefill batch (14
// rows, no chunk asking for logits), then decode batches of 4 single tokens
// give every sequence what it gets alone through the same ranks, within the
// CUDA stage's batch tolerances (a batch's rows take other kernels than a
// sequence alone: small_matmul's F16 rows, the per-row attention), and the
// ids of forward_batch_greedy are the argmax of the logits.
TEST(CudaDs4Tp, BatchThroughTwoRanksEqualsEachSequenceAlone) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const std::string model = write_tiny(dir, "q2", seed + 1);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  const int n_seq = 4, n_steps = 4;
  Ds4Ranks ranks(files, config(16, n_seq));
  ASSERT_TRUE(ranks[0].batches());
  const int64_t V = ranks[0].n_vocab();
  std::vector<std::vector<int32_t>> prompts;
  for (int q = 0; q < n_seq; ++q) prompts.push_back(random_tokens(seed + 10 + uint64_t(q), size_t(q + 2), V));
  const std::vector<int32_t> step_token = random_tokens(seed + 20, n_steps, V);

  // Alone: sequence q in slot q, its prompt, then the step tokens one by one.
  std::vector<std::vector<std::vector<float>>> alone(static_cast<size_t>(n_seq));
  on_threads(2, [&](int r) {
    std::vector<std::vector<std::vector<float>>> mine(static_cast<size_t>(n_seq));
    for (int q = 0; q < n_seq; ++q) {
      ranks[r].reset(q);
      ranks[r].forward(q, prompts[size_t(q)]);
      for (int i = 0; i < n_steps; ++i) {
        mine[size_t(q)].push_back(as_vector(ranks[r].forward(q, std::span<const int32_t>(&step_token[size_t(i)], 1))));
      }
    }
    if (r == 0) alone = std::move(mine);
  });

  // Batched: one prefill batch of the 4 prompts, then n_steps decode batches.
  std::vector<BatchChunk> prefill, step;
  std::vector<int32_t> prefill_rows;
  for (int q = 0; q < n_seq; ++q) {
    prefill.push_back({q, int64_t(prompts[size_t(q)].size()), false});
    prefill_rows.insert(prefill_rows.end(), prompts[size_t(q)].begin(), prompts[size_t(q)].end());
    step.push_back({q, 1, true});
  }
  std::vector<std::vector<float>> got[2];
  std::vector<int32_t> ids[2];
  on_threads(2, [&](int r) {
    for (int q = 0; q < n_seq; ++q) ranks[r].reset(q);
    EXPECT_TRUE(ranks[r].forward_batch(prefill, prefill_rows).empty());
    for (int i = 0; i < n_steps; ++i) {
      const std::vector<int32_t> rows(size_t(n_seq), step_token[size_t(i)]);
      if (i + 1 < n_steps) {
        got[r].push_back(as_vector(ranks[r].forward_batch(step, rows)));
      } else {
        const std::span<const int32_t> picked = ranks[r].forward_batch_greedy(step, rows);
        ids[r].assign(picked.begin(), picked.end());
      }
    }
  });
  EXPECT_EQ(ids[0], ids[1]) << "the ranks' greedy ids";
  ASSERT_EQ(got[0].size(), size_t(n_steps - 1));
  RowErrors err;
  for (int i = 0; i + 1 < n_steps; ++i) {
    SCOPED_TRACE("decode batch " + std::to_string(i));
    EXPECT_EQ(bit_difference(got[0][size_t(i)], got[1][size_t(i)]), "") << "the ranks disagree";
    ASSERT_EQ(got[0][size_t(i)].size(), size_t(n_seq) * size_t(V));
    for (int q = 0; q < n_seq; ++q) {
      const std::span<const float> row(got[0][size_t(i)].data() + size_t(q) * size_t(V), size_t(V));
      const std::vector<float>& want = alone[size_t(q)][size_t(i)];
      err.add(rel_err(row, want));
      if (clear_pick(want) && err.e.back() <= kOutlier) {
        EXPECT_EQ(argmax(row), argmax(want)) << "sequence " << q << ": alone " << top_two(want) << ", batched "
                                             << top_two(row);
      }
    }
  }
  err.report("tp 2 batch against each sequence alone");
  EXPECT_LT(err.quantile(0.5), kTypical);
  EXPECT_LE(err.over(kOutlier), 2);
  ASSERT_EQ(ids[0].size(), size_t(n_seq));
  for (int q = 0; q < n_seq; ++q) {
    const std::vector<float>& want = alone[size_t(q)][size_t(n_steps - 1)];
    if (clear_pick(want)) {
      EXPECT_EQ(ids[0][size_t(q)], argmax(want)) << "sequence " << q << " greedy id";
    }
  }
  for (int q = 0; q < n_seq; ++q) EXPECT_EQ(ranks[0].position(q), ranks[1].position(q));
}

// Pipeline and tensor parallelism together: layers 0-2 (the hash layers,
// with the embedding) and 3-4 (with the head), each served by two ranks;
// the first stage's ranks hand the same HC state on, the second's (input
// rows) give the whole model's picks.
TEST(CudaDs4Tp, TwoStagesOfTwoRanksGiveTheWholeModelsPicks) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const std::string model = write_tiny(dir, "q2", seed + 2);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string(), "0:2,3:output");
  ASSERT_EQ(files.size(), 4u);  // stage by stage, rank by rank
  const StageConfig c = config(64);
  Ds4Ranks first({files[0], files[1]}, c), second({files[2], files[3]}, c);
  const GgufFile whole_file = GgufFile::open(model);
  CudaDs4Stage whole(whole_file, c);
  const int64_t V = whole.n_vocab();
  const std::vector<int32_t> prompt = random_tokens(seed + 3, 40, V);
  std::vector<int32_t> feed;
  Decode want;
  want.logits.push_back(as_vector(whole.forward(0, prompt)));
  for (int i = 0; i < 12; ++i) {
    feed.push_back(argmax(want.logits.back()));
    want.logits.push_back(as_vector(whole.forward(0, std::span<const int32_t>(&feed.back(), 1))));
  }
  for (const auto& row : want.logits) want.tokens.push_back(argmax(row));

  auto step = [&](const std::vector<int32_t>& tokens) {
    std::vector<float> acts[2], logits[2];
    on_threads(2, [&](int r) { acts[r] = as_vector(first[r].forward(0, tokens)); });
    EXPECT_EQ(bit_difference(acts[0], acts[1]), "") << "the first stage's ranks disagree";
    on_threads(2, [&](int r) { logits[r] = as_vector(second[r].forward(0, acts[r], int64_t(tokens.size()))); });
    EXPECT_EQ(bit_difference(logits[0], logits[1]), "") << "the second stage's ranks disagree";
    return logits[0];
  };
  Decode got;
  got.logits.push_back(step(prompt));
  for (int32_t t : feed) got.logits.push_back(step({t}));
  for (const auto& row : got.logits) got.tokens.push_back(argmax(row));
  expect_close(got, want, 2, "two stages of two ranks against the whole model");
}

// --tp-alone's group (LoneTpRank): a rank alone on the CUDA stage gives
// what the CPU stage gives with the same lone group (each sum its own
// partial, the other rank's logits zero), within the CUDA stage's
// tolerances against the CPU, so the bench times the real step of one rank.
TEST(CudaDs4Tp, LoneRankMatchesTheCpuLoneRank) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const std::string model = write_tiny(dir, "q2", seed + 4);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const GgufFile f = GgufFile::open(files[size_t(r)]);
    LoneTpRank lone_cpu(r, 2), lone_gpu(r, 2);
    StageConfig c = config(64);
    c.tp = &lone_cpu;
    std::unique_ptr<StageRunner> cpu = make_stage_runner(Backend::Cpu, f, c);
    c.tp = &lone_gpu;
    std::unique_ptr<StageRunner> gpu = make_stage_runner(Backend::Cuda, f, c);
    ASSERT_EQ(gpu->backend(), Backend::Cuda);
    const int64_t V = gpu->n_vocab();
    const std::vector<int32_t> prompt = random_tokens(seed + 5, 20, V), feed = random_tokens(seed + 6, 12, V),
                               five = random_tokens(seed + 7, 5, V);
    const Decode want = forced(*cpu, prompt, feed, five);
    const Decode got = forced(*gpu, prompt, feed, five);
    // The rank's own vocabulary rows are compared (the zeros of the other
    // rank's may hold a row's largest logit, a tie of equal zeros).
    const auto [mine_begin, mine_count] = tp_vocab_range(V, 2, r);
    expect_close(own_slice(got, mine_begin, mine_count), own_slice(want, mine_begin, mine_count), 2,
                 fmt::format("lone rank {} against the CPU's", r));
    const auto [begin, count] = tp_vocab_range(V, 2, 1 - r);
    for (const auto& row : got.logits) {
      for (int64_t i = begin; i < begin + count; ++i) ASSERT_EQ(row[size_t(i)], 0.0f) << "the other rank's logit " << i;
    }
  }
}

}  // namespace
}  // namespace baton
