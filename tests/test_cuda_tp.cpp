// Tensor-parallel ranks on the CUDA stage (docs/TENSOR_PARALLEL.md): the
// rank files of `baton split --tp` (gguf_split/split.h), each in a CudaStage,
// linked by an in-process group (two threads, one GPU) or by NCCL (one GPU
// each, where two are visible). Every rank must end each step with the same
// logits bit for bit; against one rank (the whole model on the CUDA stage)
// the greedy tokens must be equal and the logits within the CUDA stage's
// tolerances against the CPU (tests/test_cuda_stage.cpp). The plan and the
// refusals run everywhere; the rest skip without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/stages/llama.h"
#include "engine/gguf/file.h"
#include "engine/model/part_info.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/batch.h"
#include "engine/runtime/stage.h"
#include "engine/runtime/tp_comm.h"
#include "engine/cuda/lone_rank.h"
#include "engine/tp/slice.h"
#include "gguf_split/split.h"
#include "gguf_split/synth.h"
#include "net/nccl_allreduce.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"
#include "tests/tp_test_util.h"

namespace baton {
namespace {

using namespace tp_test;

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// Decoding of one sequence: the last-position logits of the prompt and of
// each step, and the argmax of each.
struct Decode {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

// The prompt in chunks of at most max_batch; its last logits.
std::vector<float> prefill(StageRunner& s, const std::vector<int32_t>& prompt) {
  std::vector<float> last;
  for (size_t at = 0; at < prompt.size(); at += size_t(s.max_batch())) {
    const size_t n = std::min(prompt.size() - at, size_t(s.max_batch()));
    last = as_vector(s.forward(0, std::span<const int32_t>(prompt.data() + at, n)));
  }
  return last;
}

// Greedy: the prompt, then n_gen steps of one token (the decode graph, cut
// at the exchanges on a rank), each fed the last pick; one more pick
// through forward_greedy (the argmax on the device) ends the tokens.
Decode decode(StageRunner& s, const std::vector<int32_t>& prompt, int n_gen) {
  Decode d;
  d.logits.push_back(prefill(s, prompt));
  int32_t next = argmax(d.logits.back());
  for (int i = 0; i < n_gen; ++i) {
    d.tokens.push_back(next);
    d.logits.push_back(as_vector(s.forward(0, std::span<const int32_t>(&next, 1))));
    next = argmax(d.logits.back());
  }
  d.tokens.push_back(next);
  d.tokens.push_back(s.forward_greedy(0, std::span<const int32_t>(&next, 1)));
  return d;
}

// Teacher-forced: the prompt, then the given tokens one at a time whatever
// the picks; tokens[i] is the argmax of logits[i].
Decode forced(StageRunner& s, const std::vector<int32_t>& prompt, const std::vector<int32_t>& feed) {
  Decode d;
  d.logits.push_back(prefill(s, prompt));
  for (int32_t t : feed) d.logits.push_back(as_vector(s.forward(0, std::span<const int32_t>(&t, 1))));
  for (const auto& row : d.logits) d.tokens.push_back(argmax(row));
  return d;
}

StageConfig config(int64_t max_batch) {
  StageConfig c;
  c.n_ctx = 256;
  c.max_batch = max_batch;
  c.n_threads = 2;
  return c;
}

// The rank files' stages of one group, built one after another on this
// thread (construction captures the decode graphs and calls no peer), run
// on a thread each. The group waits up to 2 minutes for a rank (the
// suite also runs under compute-sanitizer, bench/gpu_check.sh).
struct CudaRanks {
  explicit CudaRanks(const std::vector<std::string>& paths, StageConfig c) : group(int(paths.size()), 120000) {
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
      stages.push_back(std::make_unique<CudaStage>(files[r], rc));
    }
  }
  int size() const { return group.size(); }
  CudaStage& operator[](int r) { return *stages[size_t(r)]; }

  InProcessTpGroup group;
  std::vector<GgufFile> files;
  std::vector<std::unique_ptr<CudaStage>> stages;
};

// Every rank's run of `fn` (a decode); all ranks must hold the same bits.
Decode on_ranks(CudaRanks& ranks, const std::function<Decode(StageRunner&)>& fn) {
  const int n = ranks.size();
  std::vector<Decode> out(static_cast<size_t>(n));
  on_threads(n, [&](int r) {
    ranks[r].reset(0);
    out[size_t(r)] = fn(ranks[r]);
  });
  for (int r = 1; r < n; ++r) {
    SCOPED_TRACE(fmt::format("rank {} against rank 0", r));
    EXPECT_EQ(out[size_t(r)].tokens, out[0].tokens);
    EXPECT_EQ(out[size_t(r)].logits.size(), out[0].logits.size());
    for (size_t i = 0; i < std::min(out[size_t(r)].logits.size(), out[0].logits.size()); ++i) {
      EXPECT_EQ(bit_difference(out[size_t(r)].logits[i], out[0].logits[i]), "") << "step " << i;
    }
  }
  return out[0];
}

Decode decode_ranks(CudaRanks& ranks, const std::vector<int32_t>& prompt, int n_gen) {
  return on_ranks(ranks, [&](StageRunner& s) { return decode(s, prompt, n_gen); });
}

Decode forced_ranks(CudaRanks& ranks, const std::vector<int32_t>& prompt, const std::vector<int32_t>& feed) {
  return on_ranks(ranks, [&](StageRunner& s) { return forced(s, prompt, feed); });
}

// Two teacher-forced decodes of the same tokens: the logits within tol of
// want's at every step, and each pick want's, or (tie_tol > 0) another id
// whose logit on want's row is within tie_tol of the row's scale of want's
// pick: the rounding of the integer-dot matvec may reorder a near-tie
// (tests/test_cuda_stage.cpp).
void expect_close_picks(const Decode& got, const Decode& want, double tol, double tie_tol, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  ASSERT_EQ(got.tokens.size(), want.tokens.size());
  double worst = 0;
  size_t worst_at = 0;
  int flips = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    const double e = rel_err(got.logits[i], want.logits[i]);
    if (e > worst) worst = e, worst_at = i;
    if (got.tokens[i] == want.tokens[i]) continue;
    ++flips;
    const std::vector<float>& row = want.logits[i];
    double scale = 0;
    for (float v : row) scale = std::max(scale, std::fabs(double(v)));
    EXPECT_LE(double(row[size_t(want.tokens[i])]) - double(row[size_t(got.tokens[i])]), tie_tol * scale)
        << "step " << i << ": picked " << got.tokens[i] << ", the reference " << want.tokens[i] << "; the reference's "
        << top_two(row) << "; the ranks' " << top_two(got.logits[i]);
  }
  EXPECT_LE(worst, tol) << "at step " << worst_at;
  std::printf("%s: %zu steps, largest relative logit difference %.2e (step %zu), %d near-tie picks differ\n",
              what.c_str(), want.logits.size(), worst, worst_at, flips);
}

// The tokens equal, the logits within tol of want's at every step; a
// failure says where the tokens first part and how close want's pick was.
void expect_same_decode(const Decode& got, const Decode& want, double tol, const std::string& what) {
  SCOPED_TRACE(what);
  if (got.tokens != want.tokens) {
    size_t i = 0;
    while (i < got.tokens.size() && i < want.tokens.size() && got.tokens[i] == want.tokens[i]) ++i;
    ADD_FAILURE() << "the greedy tokens first differ at step " << i << ": "
                  << (i < got.tokens.size() ? std::to_string(got.tokens[i]) : "-") << " against "
                  << (i < want.tokens.size() ? std::to_string(want.tokens[i]) : "-")
                  << (i < want.logits.size() ? "; the reference's " + top_two(want.logits[i]) : "")
                  << (i < got.logits.size() ? "; the ranks' " + top_two(got.logits[i]) : "");
  }
  ASSERT_EQ(got.logits.size(), want.logits.size());
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    const double e = rel_err(got.logits[i], want.logits[i]);
    if (e > worst) worst = e, worst_at = i;
  }
  EXPECT_LE(worst, tol) << "at step " << worst_at;
  std::printf("%s: %zu steps, largest relative logit difference %.2e (step %zu)\n", what.c_str(), want.logits.size(),
              worst, worst_at);
}

std::string write_gqa(const test::TempDir& dir, DType type, uint64_t seed, int64_t n_embd = 256,
                      int64_t n_ff = 512) {
  SynthConfig sc;
  sc.n_layer = 2;
  sc.n_embd = n_embd;
  sc.n_head = 4;
  sc.n_head_kv = 2;  // GQA: two query heads per KV head; one KV head a rank at N = 2
  sc.n_ff = n_ff;
  sc.n_ctx = 512;
  sc.weight_type = type;
  sc.seed = seed;
  const std::string path = dir.file(fmt::format("gqa-{}-{}.gguf", dtype_name(type), n_embd));
  write_synthetic_model(path, sc);
  return path;
}

// ---------------------------------------------------------------- everywhere

// A rank's plan: the whole KV cache split by KV heads, the weights its
// slice, and pinned rooms for a host group's exchanges (the sums' rows of
// the planned batch, the gather's blocks).
TEST(CudaTp, RankPlanHoldsItsSliceAndTheExchangeRooms) {
  test::TempDir dir;
  const std::string whole = write_gqa(dir, DType::Q8_0, 3);
  const std::vector<std::string> files = write_tp_ranks(whole, 2, dir.path().string());
  ASSERT_EQ(files.size(), 2u);
  const StageConfig c = config(16);
  const MemoryPlan w = CudaStage::plan(GgufFile::open(whole), c);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(files[size_t(r)]);
    const MemoryPlan p = CudaStage::plan(GgufFile::open(files[size_t(r)]), c);
    EXPECT_EQ(p.bytes(PlanLine::KvCache) * 2, w.bytes(PlanLine::KvCache));
    EXPECT_LT(p.bytes(PlanLine::Weights), w.bytes(PlanLine::Weights));
    // Pinned: at least the sums' 16 x 256 floats beyond the whole model's io.
    EXPECT_GE(p.bytes(PlanLine::PinnedIo), w.bytes(PlanLine::PinnedIo) + 16u * 256u * 4u);
  }
}

// A rank file without its group's link, a link of another rank or size, and
// a whole model given a link are refused before anything is allocated.
TEST(CudaTp, RankFileAndLinkMustAgree) {
  test::TempDir dir;
  const std::string whole = write_gqa(dir, DType::F32, 4);
  const std::vector<std::string> files = write_tp_ranks(whole, 2, dir.path().string());
  auto refused = [](const std::string& path, TpComm* tp, const std::string& needle) {
    const GgufFile f = GgufFile::open(path);
    StageConfig c = config(4);
    c.tp = tp;
    try {
      CudaStage s(f, c);
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

// stories260K (F32) at two ranks against the whole model on the CUDA stage,
// several prompts: short ones through the matvecs, a 12-token one through
// cuBLAS's float32 GEMM, then 20 greedy steps through the cut decode graph.
// A rank's ffn_down rows (86 columns) take the float32 cuBLAS GEMM at every
// size, its attention and head the matvec.
TEST(CudaTp, Stories260KAtTwoRanksGivesTheOneRankTokens) {
  BATON_REQUIRE_CUDA();
  test::TempDir dir;
  const std::string model = test::model_path("stories260K.gguf");
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  const StageConfig c = config(16);
  const GgufFile whole_file = GgufFile::open(model);
  CudaStage whole(whole_file, c);
  CudaRanks ranks(files, c);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 403, 407, 261, 378},  // BOS + "Once upon a time"
      {1, 9, 99, 199},
      {1},
      {1, 403, 407, 260, 64, 128, 256, 300, 310, 320, 330, 340},
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    whole.reset(0);
    const Decode want = decode(whole, prompts[i], 20);
    const Decode got = decode_ranks(ranks, prompts[i], 20);
    expect_same_decode(got, want, 1e-4, fmt::format("stories260K tp 2, prompt {}", i));
  }
}

// A GQA llama with quantized weights at two ranks: the prompt's and every
// step's last-position logits against the CPU's whole model within the
// CUDA stage's own tolerances (tests/test_cuda_stage.cpp: Q8_0 5e-4, Q4_K
// 3e-3 for a prompt through small_matmul), the picks the CPU's but for
// near-ties, and the same against the CUDA stage's whole model.
// Q8_0 is `baton synth --shape llama-tiny-q8_0`; llama-tiny's attention
// output columns (128 a rank) are no Q4_K block boundary, so Q4_K takes the
// same shape at n_embd 512.
TEST(CudaTp, QuantizedGqaLlamaAtTwoRanksMatchesCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  std::printf("seed %llu (BATON_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  for (DType type : {DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(type));
    std::string model;
    if (type == DType::Q8_0) {
      SynthOptions o;
      o.arch = "llama";
      o.shape = "llama-tiny";
      o.type = "q8_0";
      o.seed = seed;
      model = dir.file("llama-tiny-q8_0.gguf");
      write_synth_model(model, o);
    } else {
      model = write_gqa(dir, DType::Q4_K, seed, 512, 1024);
    }
    const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
    const GgufFile whole_file = GgufFile::open(model);
    const int32_t vocab = int32_t(whole_file.find_tensor("token_embd.weight")->ne[1]);
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 5; ++i) prompt.push_back(int32_t((seed + 37u * uint64_t(i) + 11u) % uint64_t(vocab)));
    const StageConfig c = config(8);
    const double tol = type == DType::Q4_K ? 3e-3 : 5e-4;

    // The CPU's greedy tokens are fed to every decode (teacher forcing).
    std::unique_ptr<StageRunner> cpu = make_stage_runner(Backend::Cpu, whole_file, c);
    const Decode free_run = decode(*cpu, prompt, 16);
    const std::vector<int32_t> feed(free_run.tokens.begin(), free_run.tokens.begin() + 16);
    cpu->reset(0);
    const Decode want = forced(*cpu, prompt, feed);
    CudaStage whole(whole_file, c);
    const Decode one = forced(whole, prompt, feed);
    CudaRanks ranks(files, c);
    const Decode got = forced_ranks(ranks, prompt, feed);
    expect_close_picks(one, want, tol, 5e-4, fmt::format("{} one CUDA rank against the CPU", dtype_name(type)));
    expect_close_picks(got, want, tol, 5e-4, fmt::format("{} tp 2 against the CPU", dtype_name(type)));
    expect_close_picks(got, one, tol, 5e-4, fmt::format("{} tp 2 against one CUDA rank", dtype_name(type)));
  }
}

// A batch of sequences through two ranks (one forward of all their rows, a
// sum carrying every row): 4 prompts of different lengths in one prefill
// batch (14 rows through cuBLAS, no chunk asking for logits), then decode
// batches of 4 single tokens (the batch graph, cut at the exchanges,
// replayed) give every sequence what it gets alone through the same ranks,
// and the ids of forward_batch_greedy are the argmax of the logits.
TEST(CudaTp, BatchThroughTwoRanksEqualsEachSequenceAlone) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const std::string model = write_gqa(dir, DType::F32, seed + 1);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  const int n_seq = 4, n_steps = 3;
  StageConfig c = config(16);
  c.n_seq = n_seq;
  CudaRanks ranks(files, c);
  std::vector<std::vector<int32_t>> prompts;
  for (int q = 0; q < n_seq; ++q) {
    std::vector<int32_t> p = {1};
    for (int i = 0; i <= q; ++i) p.push_back(int32_t(10 + 7 * q + 3 * i));
    prompts.push_back(p);
  }
  const int32_t step_token[n_steps] = {7, 42, 99};

  // Alone: sequence q in slot q, its prompt, then the step tokens one by one.
  std::vector<std::vector<std::vector<float>>> alone(static_cast<size_t>(n_seq));
  on_threads(2, [&](int r) {
    std::vector<std::vector<std::vector<float>>> mine(static_cast<size_t>(n_seq));
    for (int q = 0; q < n_seq; ++q) {
      ranks[r].reset(q);
      ranks[r].forward(q, prompts[size_t(q)]);
      for (int i = 0; i < n_steps; ++i) {
        mine[size_t(q)].push_back(as_vector(ranks[r].forward(q, std::span<const int32_t>(&step_token[i], 1))));
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
    ranks[r].forward_batch(prefill, prefill_rows);
    for (int i = 0; i < n_steps; ++i) {
      const std::vector<int32_t> rows(size_t(n_seq), step_token[i]);
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
  const size_t V = size_t(ranks[0].n_vocab());
  for (int i = 0; i + 1 < n_steps; ++i) {
    SCOPED_TRACE("decode batch " + std::to_string(i));
    EXPECT_EQ(bit_difference(got[0][size_t(i)], got[1][size_t(i)]), "") << "the ranks disagree";
    ASSERT_EQ(got[0][size_t(i)].size(), size_t(n_seq) * V);
    for (int q = 0; q < n_seq; ++q) {
      const std::span<const float> row(got[0][size_t(i)].data() + size_t(q) * V, V);
      EXPECT_LE(rel_err(row, alone[size_t(q)][size_t(i)]), 1e-4) << "sequence " << q;
      EXPECT_EQ(argmax(row), argmax(alone[size_t(q)][size_t(i)])) << "sequence " << q;
    }
  }
  ASSERT_EQ(ids[0].size(), size_t(n_seq));
  for (int q = 0; q < n_seq; ++q) {
    EXPECT_EQ(ids[0][size_t(q)], argmax(alone[size_t(q)][n_steps - 1])) << "sequence " << q << " greedy id";
  }
}

// Pipeline and tensor parallelism together on the CUDA stage: layers 0 and
// 1:output, each served by two ranks; the first stage's ranks (no head: a
// sum ends them, then the residual add) hand the same rows on, the second's
// (no embedding: input rows) give the whole model's tokens.
TEST(CudaTp, TwoStagesOfTwoRanksGiveTheWholeModelsTokens) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const std::string model = write_gqa(dir, DType::F16, seed + 2);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string(), "0:0,1:output");
  ASSERT_EQ(files.size(), 4u);  // stage by stage, rank by rank
  const StageConfig c = config(8);
  CudaRanks first({files[0], files[1]}, c), second({files[2], files[3]}, c);
  const GgufFile whole_file = GgufFile::open(model);
  CudaStage whole(whole_file, c);
  const std::vector<int32_t> prompt = {1, 9, 99, 199, 250};
  const Decode free_run = decode(whole, prompt, 12);
  const std::vector<int32_t> feed(free_run.tokens.begin(), free_run.tokens.begin() + 12);
  whole.reset(0);
  const Decode want = forced(whole, prompt, feed);

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
  expect_close_picks(got, want, 1e-3, 1e-3, "F16 two stages of two ranks against the whole model");
}

// A group of one rank is no group: a whole model in it runs as without one
// (one graph a step) and gives the same bits.
TEST(CudaTp, GroupOfOneRunsTheWholeModel) {
  BATON_REQUIRE_CUDA();
  const std::string model = test::model_path("stories260K.gguf");
  const GgufFile f = GgufFile::open(model);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  CudaStage alone(f, config(8));
  const Decode want = decode(alone, prompt, 8);
  InProcessTpGroup one(1);
  StageConfig c = config(8);
  c.tp = &one.member(0);
  CudaStage grouped(f, c);
  const Decode got = decode(grouped, prompt, 8);
  EXPECT_EQ(got.tokens, want.tokens);
  for (size_t i = 0; i < want.logits.size(); ++i) {
    EXPECT_EQ(bit_difference(got.logits[i], want.logits[i]), "") << "step " << i;
  }
}

// --tp-alone's group (LoneTpRank): a rank alone on the CUDA stage gives
// what the CPU stage gives with the same lone group (each sum its own
// partial, the other rank's logits zero), so the bench times the real
// step of one rank.
TEST(CudaTp, LoneRankMatchesTheCpuLoneRank) {
  BATON_REQUIRE_CUDA();
  test::TempDir dir;
  const std::string model = write_gqa(dir, DType::F32, 9);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const GgufFile f = GgufFile::open(files[size_t(r)]);
    LoneTpRank lone_cpu(r, 2), lone_gpu(r, 2);
    StageConfig c = config(8);
    c.tp = &lone_cpu;
    std::unique_ptr<StageRunner> cpu = make_stage_runner(Backend::Cpu, f, c);
    c.tp = &lone_gpu;
    CudaStage gpu(f, c);
    const std::vector<int32_t> prompt = {1, 5, 9, 17}, feed = {3, 30, 60, 90, 120, 150, 180, 210};
    const Decode want = forced(*cpu, prompt, feed);
    const Decode got = forced(gpu, prompt, feed);
    expect_close_picks(got, want, 1e-4, 1e-4, fmt::format("lone rank {} against the CPU's", r));
    const auto [begin, count] = tp_vocab_range(gpu.n_vocab(), 2, 1 - r);
    for (const auto& row : got.logits) {
      for (int64_t i = begin; i < begin + count; ++i) ASSERT_EQ(row[size_t(i)], 0.0f) << "the other rank's logit " << i;
    }
  }
}

// `--tp-alone`'s default on CUDA: the lone rank queued on the stage's
// stream (engine/cuda/lone_rank.h), the decode step one graph. It gives the
// host lone rank's logits bit for bit: the same kernels on the same rows,
// only the exchanges stay on the device.
TEST(CudaTp, LoneRankOnTheStreamMatchesTheHostLoneRank) {
  BATON_REQUIRE_CUDA();
  test::TempDir dir;
  const std::string model = write_gqa(dir, DType::Q8_0, 11);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const GgufFile f = GgufFile::open(files[size_t(r)]);
    LoneTpRank host(r, 2);
    std::unique_ptr<TpComm> device = make_cuda_lone_rank(r, 2);
    ASSERT_TRUE(device->on_stream());
    StageConfig c = config(8);
    c.tp = &host;
    CudaStage a(f, c);
    c.tp = device.get();
    CudaStage b(f, c);
    const std::vector<int32_t> prompt = {1, 5, 9, 17};
    const Decode want = decode(a, prompt, 12);
    const Decode got = decode(b, prompt, 12);
    EXPECT_EQ(got.tokens, want.tokens);
    for (size_t i = 0; i < want.logits.size(); ++i) {
      EXPECT_EQ(bit_difference(got.logits[i], want.logits[i]), "") << "step " << i;
    }
  }
}

// The NCCL group behind the CUDA stage (device rows handed over as they
// are, no pinned copies), one GPU a rank: the ranks hold the same bits and
// give the in-process group's tokens (NCCL adds in its own order, so the
// logits agree within rounding, not bit for bit). Needs two GPUs and NCCL.
TEST(CudaTp, NcclGroupOnTwoGpusGivesTheHostGroupsTokens) {
  BATON_REQUIRE_CUDA();
  if (!net::nccl_built()) GTEST_SKIP() << "this build has no NCCL (BATON_NCCL)";
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 2) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "needs two CUDA devices, found " << n_dev;
  }
  test::TempDir dir;
  const std::string model = test::model_path("stories260K.gguf");
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  const StageConfig c = config(8);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  Decode want;
  {
    CudaRanks host(files, c);
    want = decode_ranks(host, prompt, 20);
  }
  const std::vector<uint8_t> id = net::nccl_unique_id();
  std::vector<Decode> got(2);
  // Each rank's stage lives on its own device: built, run and destroyed on
  // its thread, whose current device it is.
  on_threads(2, [&](int r) {
    BATON_CUDA_CHECK(cudaSetDevice(r));
    net::NcclAllReduceConfig nc;
    nc.device = r;
    nc.rank = r;
    nc.size = 2;
    nc.op_timeout = std::chrono::milliseconds(30000);
    net::NcclAllReduce group(id, nc);
    group.wait_ready();
    const GgufFile f = GgufFile::open(files[size_t(r)]);
    StageConfig rc = c;
    rc.tp = &group;
    CudaStage s(f, rc);
    got[size_t(r)] = decode(s, prompt, 20);
  });
  EXPECT_EQ(got[0].tokens, got[1].tokens);
  for (size_t i = 0; i < got[0].logits.size(); ++i) {
    EXPECT_EQ(bit_difference(got[0].logits[i], got[1].logits[i]), "") << "step " << i;
  }
  expect_same_decode(got[0], want, 1e-4, "stories260K tp 2 over NCCL against the in-process group");
}

}  // namespace
}  // namespace baton
