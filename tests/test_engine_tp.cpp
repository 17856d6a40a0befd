// Tensor-parallel ranks of the llama family against the whole model
// (docs/TENSOR_PARALLEL.md): the rank files of `baton split --tp`
// (gguf_split/split.h), each in a Stage on its own thread, linked by an
// in-process group (engine/runtime/tp_comm.h). Every rank must end with the
// same logits bit for bit, within 1e-5 relative of the whole model, and the
// greedy tokens must be the whole model's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/model/arch.h"
#include "engine/model/part_info.h"
#include "engine/tp/slice.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/batch.h"
#include "engine/runtime/stage.h"
#include "engine/runtime/tp_comm.h"
#include "gguf_split/split.h"
#include "gguf_split/synth.h"
#include "kernels/quant.h"
#include "tests/test_util.h"
#include "tests/tp_test_util.h"

namespace baton {
namespace {

using namespace tp_test;

// Greedy decoding of one sequence: the logits of each step and the tokens.
struct Decode {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// The prompt in one forward (all its logits), then n_gen greedy tokens.
Decode decode(Stage& s, const std::vector<int32_t>& prompt, int n_gen) {
  Decode d;
  auto out = s.forward(0, prompt);
  const int64_t V = s.n_vocab();
  for (size_t i = 0; i < prompt.size(); ++i) d.logits.emplace_back(out.begin() + i * V, out.begin() + (i + 1) * V);
  int32_t next = argmax(d.logits.back());
  for (int i = 0; i < n_gen; ++i) {
    d.tokens.push_back(next);
    const int32_t one[1] = {next};
    d.logits.push_back(as_vector(s.forward(0, one)));
    next = argmax(d.logits.back());
  }
  return d;
}

StageConfig config(int64_t n_prompt) {
  StageConfig c;
  c.n_ctx = 256;
  c.max_batch = std::max<int64_t>(n_prompt, 1);
  c.all_logits = true;
  c.n_threads = 2;
  return c;
}

// Decodes on every rank, each on its own thread; rethrows the first failure here.
std::vector<Decode> run_ranks(const std::vector<std::string>& files, const std::vector<int32_t>& prompt, int n_gen,
                              StageConfig c) {
  const int n = int(files.size());
  InProcessTpGroup group(n);
  std::vector<Decode> out(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        GgufFile f = GgufFile::open(files[r]);
        StageConfig rc = c;
        rc.tp = &group.member(r);
        Stage s(f, rc);
        out[r] = decode(s, prompt, n_gen);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(double(a[i])));
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// The whole model and its n rank files decode the same prompt.
void expect_ranks_match_whole(const std::string& model, int n, const std::vector<int32_t>& prompt, int n_gen) {
  test::TempDir dir;
  const std::vector<std::string> files = write_tp_ranks(model, n, dir.path().string());
  ASSERT_EQ(files.size(), size_t(n));
  GgufFile whole_file = GgufFile::open(model);
  Stage whole(whole_file, config(int64_t(prompt.size())));
  const Decode want = decode(whole, prompt, n_gen);
  const std::vector<Decode> got = run_ranks(files, prompt, n_gen, config(int64_t(prompt.size())));
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(got[r].tokens, want.tokens);
    ASSERT_EQ(got[r].logits.size(), want.logits.size());
    double worst = 0;
    for (size_t i = 0; i < want.logits.size(); ++i) {
      // Every rank holds the same bits: the sums add in rank order everywhere.
      EXPECT_EQ(got[r].logits[i], got[0].logits[i]) << "step " << i;
      worst = std::max(worst, max_rel_diff(want.logits[i], got[r].logits[i]));
    }
    EXPECT_LT(worst, 1e-5);
    std::printf("%s, tp %d rank %d: %zu steps, largest relative logit difference %.2e\n", model.c_str(), n, r,
                want.logits.size(), worst);
  }
}

TEST(TensorParallel, StoriesAtTwoRanksMatchesTheWholeModel) {
  const std::string model = test::model_path("stories260K.gguf");
  expect_ranks_match_whole(model, 2, {1, 403, 407, 260, 1576 % 512, 29871 % 512}, 24);
}

TEST(TensorParallel, GqaLlamaAtTwoAndFourRanksMatchesTheWholeModel) {
  test::TempDir dir;
  SynthConfig c;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 8;
  c.n_head_kv = 4;  // GQA: two query heads per KV head
  c.n_ff = 128;
  c.seed = 7;
  const std::string model = dir.file("gqa.gguf");
  write_synthetic_model(model, c);
  for (int n : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(n));
    expect_ranks_match_whole(model, n, {1, 5, 9, 17, 33, 65, 129, 200}, 16);
  }
}

TEST(TensorParallel, QuantizedGqaLlamaAtTwoRanksMatchesTheWholeModel) {
  test::TempDir dir;
  SynthConfig c;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 128;  // ffn_down's columns cut at 64: two Q8_0 blocks a rank
  c.weight_type = DType::Q8_0;
  const std::string model = dir.file("q8.gguf");
  write_synthetic_model(model, c);
  expect_ranks_match_whole(model, 2, {1, 7, 70, 140, 210}, 16);
}

TEST(TensorParallel, TwoStagesOfTwoRanksMatchTheWholeModel) {
  // Pipeline and tensor parallelism together: layers 0:1 and 2:output, each
  // served by two ranks; a stage's ranks hand the same activations on.
  test::TempDir dir;
  SynthConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.seed = 11;
  const std::string model = dir.file("pp.gguf");
  write_synthetic_model(model, c);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string(), "0:1,2:output");
  ASSERT_EQ(files.size(), 4u);  // stage by stage, rank by rank

  const std::vector<int32_t> prompt = {1, 9, 99, 199};
  const int n_gen = 12;
  GgufFile whole_file = GgufFile::open(model);
  Stage whole(whole_file, config(int64_t(prompt.size())));
  const Decode want = decode(whole, prompt, n_gen);

  InProcessTpGroup groups[2] = {InProcessTpGroup(2), InProcessTpGroup(2)};
  std::vector<GgufFile> rank_files;
  std::vector<std::unique_ptr<Stage>> stages;  // [stage * 2 + rank]
  for (int i = 0; i < 4; ++i) rank_files.push_back(GgufFile::open(files[i]));
  for (int i = 0; i < 4; ++i) {
    const std::optional<PartInfo> part = read_part_info(rank_files[i]);
    ASSERT_TRUE(part);
    StageConfig sc = config(int64_t(prompt.size()));
    sc.first_layer = part->range.first;
    sc.last_layer = part->range.last;
    sc.embedding = part->has_embedding;
    sc.head = part->has_output;
    sc.tp = &groups[i / 2].member(i % 2);
    stages.push_back(std::make_unique<Stage>(rank_files[i], sc));
  }
  // One step: the first stage's ranks on the tokens, the second's on their activations.
  auto step = [&](const std::vector<int32_t>& tokens) {
    std::vector<float> acts[2], logits[2];
    on_threads(2, [&](int r) { acts[r] = as_vector(stages[r]->forward(0, tokens)); });
    EXPECT_EQ(acts[0], acts[1]) << "the first stage's ranks disagree";
    on_threads(2, [&](int r) {
      logits[r] = as_vector(stages[2 + r]->forward(0, acts[r], int64_t(tokens.size())));
    });
    EXPECT_EQ(logits[0], logits[1]) << "the second stage's ranks disagree";
    return logits[0];
  };
  const int64_t V = whole.n_vocab();
  const std::vector<float> first = step(prompt);
  ASSERT_EQ(first.size(), prompt.size() * size_t(V));
  std::vector<float> last(first.end() - V, first.end());
  EXPECT_LT(max_rel_diff(want.logits[prompt.size() - 1], last), 1e-5);
  std::vector<int32_t> got;
  for (int i = 0; i < n_gen; ++i) {
    got.push_back(argmax(last));
    last = step({got.back()});
    EXPECT_LT(max_rel_diff(want.logits[prompt.size() + i], last), 1e-5) << "step " << i;
  }
  EXPECT_EQ(got, want.tokens);
}

TEST(TensorParallel, BatchOfEightSequencesMatchesEachAlone) {
  // The rows of a batch (here 8 sequences' prompts, then one decode token
  // each) through two ranks give every sequence what it gets alone.
  test::TempDir dir;
  SynthConfig c;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.seed = 5;
  const std::string model = dir.file("b.gguf");
  write_synthetic_model(model, c);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  const int n_seq = 8;
  std::vector<std::vector<int32_t>> prompts;
  for (int q = 0; q < n_seq; ++q) prompts.push_back({1, int32_t(10 + q), int32_t(40 + 3 * q), int32_t(90 + q)});

  // Alone: the whole model, one sequence at a time; the prompt's last logits
  // and those of one decode token (token 7).
  GgufFile whole_file = GgufFile::open(model);
  std::vector<std::vector<float>> want;
  for (int q = 0; q < n_seq; ++q) {
    Stage s(whole_file, config(4));
    s.forward(0, prompts[q]);
    want.push_back(as_vector(s.forward(0, std::vector<int32_t>{7})));
  }
  // Batched: each rank a runner with 8 slots; one batch of the 8 prompts,
  // then one batch of the 8 decode tokens.
  InProcessTpGroup group(2);
  std::vector<GgufFile> rank_files;
  for (const auto& f : files) rank_files.push_back(GgufFile::open(f));
  std::vector<std::unique_ptr<StageRunner>> runners;
  for (int r = 0; r < 2; ++r) {
    StageConfig sc;
    sc.n_ctx = 64;
    sc.n_seq = n_seq;
    sc.max_batch = 4 * n_seq;
    sc.tp = &group.member(r);
    runners.push_back(make_stage_runner(Backend::Cpu, rank_files[r], sc));
  }
  std::vector<BatchChunk> prefill, decode_step;
  std::vector<int32_t> prefill_rows, decode_rows;
  for (int q = 0; q < n_seq; ++q) {
    prefill.push_back({q, 4, false});
    prefill_rows.insert(prefill_rows.end(), prompts[q].begin(), prompts[q].end());
    decode_step.push_back({q, 1, true});
    decode_rows.push_back(7);
  }
  std::vector<float> got[2];
  on_threads(2, [&](int r) {
    runners[r]->forward_batch(prefill, prefill_rows);
    got[r] = as_vector(runners[r]->forward_batch(decode_step, decode_rows));
  });
  EXPECT_EQ(got[0], got[1]);
  const size_t V = size_t(runners[0]->n_vocab());
  ASSERT_EQ(got[0].size(), n_seq * V);
  for (int q = 0; q < n_seq; ++q) {
    const std::vector<float> row(got[0].begin() + q * V, got[0].begin() + (q + 1) * V);
    EXPECT_LT(max_rel_diff(want[q], row), 1e-5) << "sequence " << q;
    EXPECT_EQ(argmax(row), argmax(want[q])) << "sequence " << q;
  }
}

TEST(TensorParallel, RankKeysOutOfRangeAreRefusedAtLoad) {
  // A rank file's keys come from whoever wrote the file: a claim of 2^30
  // ranks would size the gathered logits by it, so it is refused first.
  test::TempDir dir;
  SynthConfig c;
  c.n_head = 4;
  c.n_head_kv = 2;
  const std::string model = dir.file("m.gguf");
  write_synthetic_model(model, c);
  const GgufFile rank = GgufFile::open(write_tp_ranks(model, 2, dir.path().string())[0]);
  for (const auto& [key, value] : std::vector<std::pair<const char*, GgufValue>>{
           {tp_keys::kSize, GgufValue::of_u32(1u << 30)}, {tp_keys::kSize, GgufValue::of_u32(1)},
           {tp_keys::kRank, GgufValue::of_u32(2)}}) {
    SCOPED_TRACE(key);
    GgufWriter w;
    for (const auto& [k, v] : rank.metadata()) w.set(k, v);
    w.set(key, value);
    for (const GgufTensorInfo& t : rank.tensors()) {
      std::vector<uint8_t> bytes(t.nbytes);
      rank.read_tensor(t, bytes.data());
      w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::move(bytes));
    }
    const std::string bad = dir.file("bad.gguf");
    w.write(bad);
    const GgufFile f = GgufFile::open(bad);
    try {
      Arch::from_gguf(f);
      ADD_FAILURE() << "loaded";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
}

// A group of one rank is no group: a whole model in it gives its own logits
// bit for bit (nothing to exchange, no gather rooms in its workspace).
TEST(TensorParallel, GroupOfOneRunsTheWholeModel) {
  test::TempDir dir;
  SynthConfig c;
  c.n_head = 4;
  c.n_head_kv = 2;
  const std::string model = dir.file("m.gguf");
  write_synthetic_model(model, c);
  GgufFile f = GgufFile::open(model);
  const std::vector<int32_t> prompt = {1, 2, 3};
  Stage alone(f, config(3));
  const std::vector<float> want = as_vector(alone.forward(0, prompt));
  InProcessTpGroup one(1);
  StageConfig sc = config(3);
  sc.tp = &one.member(0);
  Stage grouped(f, sc);
  EXPECT_EQ(as_vector(grouped.forward(0, prompt)), want);
}

TEST(TensorParallel, RankFileAndLinkMustAgree) {
  test::TempDir dir;
  SynthConfig c;
  c.n_head = 4;
  c.n_head_kv = 2;
  const std::string model = dir.file("m.gguf");
  write_synthetic_model(model, c);
  const std::vector<std::string> files = write_tp_ranks(model, 2, dir.path().string());
  const int32_t prompt[2] = {1, 2};
  // A rank file without its group's link.
  {
    GgufFile f = GgufFile::open(files[1]);
    Stage s(f, config(2));
    EXPECT_THROW(
        {
          try {
            s.forward(0, prompt);
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("rank 1 of 2"), std::string::npos) << e.what();
            throw;
          }
        },
        std::invalid_argument);
  }
  // A whole model given a link.
  {
    InProcessTpGroup group(2);
    GgufFile f = GgufFile::open(model);
    StageConfig sc = config(2);
    sc.tp = &group.member(0);
    Stage s(f, sc);
    EXPECT_THROW(s.forward(0, prompt), std::invalid_argument);
  }
}

}  // namespace
}  // namespace baton
