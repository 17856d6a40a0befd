// Batched forwards (engine/runtime/batch.h): every sequence of a batch gets the
// greedy tokens it gets alone, with prefill chunks and decode tokens of
// different sequences mixed in one forward, sequences that start and finish
// at different steps, and slots reused. On the CPU (the reference) for the
// llama family and deepseek4; on CUDA, where a device is present, for
// stories260K against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/backend.h"
#include "engine/gguf/file.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// Greedy tokens of `prompt` alone in sequence `seq`, fed one chunk at a time.
std::vector<int32_t> alone(StageRunner& r, int seq, const std::vector<int32_t>& prompt, int n_gen, int64_t chunk) {
  r.reset(seq);
  std::vector<int32_t> out;
  std::span<const float> logits;
  for (size_t at = 0; at < prompt.size(); at += size_t(chunk)) {
    const size_t n = std::min(prompt.size() - at, size_t(chunk));
    logits = r.forward(seq, std::span<const int32_t>(prompt.data() + at, n));
  }
  const int64_t v = r.n_vocab();
  for (int i = 0; i < n_gen; ++i) {
    const int32_t id = argmax(logits.subspan(logits.size() - size_t(v)));
    out.push_back(id);
    if (i + 1 < n_gen) logits = r.forward(seq, std::span<const int32_t>(&id, 1));
  }
  r.reset(seq);
  return out;
}

struct Request {
  std::vector<int32_t> prompt;
  int start_step = 0;  // the step it joins the batch
  int n_gen = 0;
  int slot = -1;
  size_t prefilled = 0;
  std::vector<int32_t> got;
  bool done() const { return int(got.size()) == n_gen; }
};

// Runs every request through batched forwards: each step holds a prompt
// chunk (at most `chunk` tokens) or the next decode token of every request
// that has started and not finished; finished requests free their slot for
// later ones. greedy_ids: the ids from forward_batch_greedy instead of the
// argmax of forward_batch's logits.
void run_batched(StageRunner& r, std::vector<Request>& reqs, int64_t chunk, bool greedy_ids = false) {
  const int n_seq = r.config().n_seq;
  std::vector<bool> busy(size_t(n_seq), false);
  for (int step = 0; step < 1000; ++step) {
    std::vector<BatchChunk> chunks;
    std::vector<int32_t> tokens;
    std::vector<Request*> order;
    for (Request& q : reqs) {
      if (q.done() || q.start_step > step) continue;
      if (q.slot < 0) {
        auto free = std::find(busy.begin(), busy.end(), false);
        if (free == busy.end()) continue;
        q.slot = int(free - busy.begin());
        busy[size_t(q.slot)] = true;
        r.reset(q.slot);
      }
      if (q.prefilled < q.prompt.size()) {
        const size_t n = std::min(q.prompt.size() - q.prefilled, size_t(chunk));
        tokens.insert(tokens.end(), q.prompt.begin() + std::ptrdiff_t(q.prefilled),
                      q.prompt.begin() + std::ptrdiff_t(q.prefilled + n));
        q.prefilled += n;
        chunks.push_back({q.slot, int64_t(n), q.prefilled == q.prompt.size()});
      } else {
        tokens.push_back(q.got.back());
        chunks.push_back({q.slot, 1, true});
      }
      order.push_back(&q);
    }
    if (chunks.empty()) {
      if (std::all_of(reqs.begin(), reqs.end(), [](const Request& q) { return q.done(); })) return;
      continue;
    }
    std::span<const float> out;
    std::span<const int32_t> ids;
    if (greedy_ids) {
      ids = r.forward_batch_greedy(chunks, tokens);
      ASSERT_EQ(ids.size(), size_t(batch_outputs(chunks)));
    } else {
      out = r.forward_batch(chunks, tokens);
      ASSERT_EQ(out.size(), size_t(batch_outputs(chunks)) * size_t(r.n_vocab()));
    }
    const size_t v = size_t(r.n_vocab());
    size_t k = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (!chunks[i].output) continue;
      Request& q = *order[i];
      q.got.push_back(greedy_ids ? ids[k] : argmax(out.subspan(k * v, v)));
      ++k;
      if (q.done()) busy[size_t(q.slot)] = false;
    }
  }
  FAIL() << "the requests did not finish";
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, size_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(1, vocab - 1);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = d(rng);
  return p;
}

// Six requests through four slots: prompts of different lengths (chunked
// when longer than `chunk`), joining at different steps, finishing at
// different steps; each must get its tokens alone.
void expect_batched_equals_alone(StageRunner& batched, StageRunner& reference, uint64_t seed, int64_t chunk,
                                 bool greedy_ids = false) {
  std::mt19937_64 rng(seed);
  const auto vocab = int32_t(reference.n_vocab());
  std::vector<Request> reqs;
  const size_t lengths[] = {5, 1, 9, 3, 12, 2};
  const int starts[] = {0, 0, 1, 3, 4, 6};
  const int gens[] = {6, 9, 4, 7, 5, 3};
  for (int i = 0; i < 6; ++i) {
    Request q;
    q.prompt = random_prompt(rng, lengths[i], vocab);
    q.start_step = starts[i];
    q.n_gen = gens[i];
    reqs.push_back(q);
  }
  run_batched(batched, reqs, chunk, greedy_ids);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(reqs[i].got, alone(reference, 0, reqs[i].prompt, reqs[i].n_gen, chunk));
  }
}

StageConfig batch_config() {
  StageConfig sc;
  sc.n_ctx = 64;
  sc.n_seq = 4;
  sc.max_batch = 32;
  return sc;
}

TEST(EngineBatch, LlamaCpuBatchEqualsAlone) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  auto batched = make_stage_runner(Backend::Cpu, f, batch_config());
  auto reference = make_stage_runner(Backend::Cpu, f, batch_config());
  expect_batched_equals_alone(*batched, *reference, seed, 4);
  expect_batched_equals_alone(*batched, *reference, seed + 1, 3, /*greedy_ids=*/true);
}

TEST(EngineBatch, Deepseek4CpuBatchEqualsAlone) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-tiny";
  o.seed = seed;
  const std::string path = dir.file("ds4.gguf");
  write_synth_model(path, o);
  GgufFile f = GgufFile::open(path);
  auto batched = make_stage_runner(Backend::Cpu, f, batch_config());
  auto reference = make_stage_runner(Backend::Cpu, f, batch_config());
  expect_batched_equals_alone(*batched, *reference, seed, 4);
}

TEST(EngineBatch, RefusesBadBatches) {
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  auto r = make_stage_runner(Backend::Cpu, f, batch_config());
  const std::vector<int32_t> two = {1, 2};
  // The same sequence twice, a sequence out of range, an empty chunk, ids that do not match.
  EXPECT_THROW(r->forward_batch(std::vector<BatchChunk>{{0, 1, true}, {0, 1, true}}, two), std::invalid_argument);
  EXPECT_THROW(r->forward_batch(std::vector<BatchChunk>{{7, 2, true}}, two), std::out_of_range);
  EXPECT_THROW(r->forward_batch(std::vector<BatchChunk>{{0, 0, true}, {1, 2, true}}, two), std::invalid_argument);
  EXPECT_THROW(r->forward_batch(std::vector<BatchChunk>{{0, 3, true}}, two), std::invalid_argument);
  EXPECT_THROW(r->forward_batch(std::vector<BatchChunk>{}, std::vector<int32_t>{}), std::invalid_argument);
  // Past the context, past the planned batch.
  std::vector<int32_t> many(65, 1);
  EXPECT_THROW(r->forward_batch(std::vector<BatchChunk>{{0, 65, true}}, many), std::exception);
  EXPECT_EQ(r->position(0), 0);
}

// A batch may hold more tokens than one context (one chunk per sequence,
// each within it): three 60-token prompts in one forward of 180 rows with a
// 64-token context give each sequence the logits it gets alone.
TEST(EngineBatch, BatchBeyondOneContextEqualsAlone) {
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  StageConfig sc = batch_config();
  sc.max_batch = 1000;
  auto r = make_stage_runner(Backend::Cpu, f, sc);
  EXPECT_EQ(r->config().max_batch, sc.n_ctx * sc.n_seq);  // cut to a context per sequence, not to one context
  auto alone_runner = make_stage_runner(Backend::Cpu, f, batch_config());
  std::mt19937_64 rng(test::test_seed());
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> want;
  std::vector<BatchChunk> chunks;
  for (int q = 0; q < 3; ++q) {
    const auto prompt = random_prompt(rng, 60, int32_t(r->n_vocab()));
    tokens.insert(tokens.end(), prompt.begin(), prompt.end());
    chunks.push_back({q, 60, true});
    std::span<const float> l;
    for (size_t at = 0; at < prompt.size(); at += 30) {
      l = alone_runner->forward(q, std::span<const int32_t>(prompt).subspan(at, 30));
    }
    want.emplace_back(l.begin(), l.end());
  }
  const std::span<const float> got = r->forward_batch(chunks, tokens);
  const size_t v = size_t(r->n_vocab());
  ASSERT_EQ(got.size(), 3 * v);
  for (size_t q = 0; q < 3; ++q) {
    const std::span<const float> row = got.subspan(q * v, v);
    EXPECT_EQ(std::vector<float>(row.begin(), row.end()), want[q]) << "sequence " << q;
  }
}

// The prefix cache's step (StageRunner::truncate): sequence `seq` ran `first`
// and generated from it; its first `keep` positions are kept and `second`
// continues from there, as one chunk of the rest, in a batch with a decode
// of another sequence. Returns second's greedy tokens.
std::vector<int32_t> after_truncate(StageRunner& r, int seq, const std::vector<int32_t>& first, int64_t keep,
                                    const std::vector<int32_t>& second, int n_gen) {
  r.reset(seq);
  r.forward(seq, first);
  const int other = seq == 0 ? 1 : 0;
  r.reset(other);
  r.forward(other, std::span<const int32_t>(first.data(), 2));
  std::span<const float> logits = r.forward(seq, std::span<const int32_t>(first.data(), 1));  // a stray decode
  EXPECT_EQ(r.position(seq), int64_t(first.size()) + 1);
  r.truncate(seq, keep);
  EXPECT_EQ(r.position(seq), keep);
  std::vector<int32_t> rest(second.begin() + keep, second.end());
  rest.push_back(7);  // the other sequence's decode token
  const std::vector<BatchChunk> chunks = {{seq, int64_t(second.size()) - keep, true}, {other, 1, true}};
  logits = r.forward_batch(chunks, rest);
  const size_t v = size_t(r.n_vocab());
  std::vector<int32_t> out;
  for (int i = 0; i < n_gen; ++i) {
    const int32_t id = argmax(logits.subspan(0, v));
    out.push_back(id);
    if (i + 1 < n_gen) logits = r.forward(seq, std::span<const int32_t>(&id, 1));
  }
  r.reset(seq);
  r.reset(other);
  return out;
}

// A sequence cut back to a shared prefix and continued with another prompt
// gets the greedy tokens that prompt gets from an empty sequence.
TEST(EngineBatch, LlamaTruncateContinuesAsFresh) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  auto r = make_stage_runner(Backend::Cpu, f, batch_config());
  auto reference = make_stage_runner(Backend::Cpu, f, batch_config());
  ASSERT_TRUE(r->arch().kv_truncatable());
  std::mt19937_64 rng(seed);
  const auto vocab = int32_t(r->n_vocab());
  for (int64_t keep : {1, 6, 11}) {
    SCOPED_TRACE("keep " + std::to_string(keep));
    const std::vector<int32_t> first = random_prompt(rng, 12, vocab);
    std::vector<int32_t> second(first.begin(), first.begin() + keep);
    for (int32_t t : random_prompt(rng, 5, vocab)) second.push_back(t);
    EXPECT_EQ(after_truncate(*r, 2, first, keep, second, 8), alone(*reference, 0, second, 8, 32));
  }
  EXPECT_THROW(r->truncate(0, 1), std::out_of_range);  // empty: nothing to keep
  EXPECT_THROW(r->truncate(9, 0), std::out_of_range);
}

// deepseek4's KV cannot be cut: only a reset or keeping all of it; a
// sequence continued from its end gets the tokens of the whole prompt.
TEST(EngineBatch, Deepseek4KeepsOnlyWholeSequences) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-tiny";
  o.seed = seed;
  const std::string path = dir.file("ds4.gguf");
  write_synth_model(path, o);
  GgufFile f = GgufFile::open(path);
  auto r = make_stage_runner(Backend::Cpu, f, batch_config());
  auto reference = make_stage_runner(Backend::Cpu, f, batch_config());
  EXPECT_FALSE(r->arch().kv_truncatable());
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> first = random_prompt(rng, 9, int32_t(r->n_vocab()));
  r->forward(1, first);
  EXPECT_THROW(r->truncate(1, 4), std::invalid_argument);
  EXPECT_EQ(r->position(1), 9);
  r->truncate(1, 9);
  std::vector<int32_t> second = first;
  for (int32_t t : random_prompt(rng, 4, int32_t(r->n_vocab()))) second.push_back(t);
  std::span<const float> logits = r->forward(1, std::span<const int32_t>(second.data() + 9, 4));
  EXPECT_EQ(argmax(logits), alone(*reference, 0, second, 1, 32).front());
  r->truncate(1, 0);
  EXPECT_EQ(r->position(1), 0);
}

// On a GPU: eight different prompts through the batched CUDA stage give each
// the CPU's greedy tokens (stories260K's logits differ from the CPU's by
// ~1e-5; these prompts have no near ties).
TEST(EngineBatch, CudaBatchEqualsCpu) {
  if (!backend_unavailable(Backend::Cuda).empty()) GTEST_SKIP() << "no CUDA device on this machine";
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  StageConfig sc = batch_config();
  sc.n_seq = 8;
  auto gpu = make_stage_runner(Backend::Cuda, f, sc);
  ASSERT_TRUE(gpu->batches());
  auto cpu = make_stage_runner(Backend::Cpu, f, sc);
  std::mt19937_64 rng(seed);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request q;
    q.prompt = {1};  // BOS, then a short random start
    for (int32_t t : random_prompt(rng, size_t(1 + i % 4), int32_t(cpu->n_vocab()))) q.prompt.push_back(t);
    q.start_step = i / 3;
    q.n_gen = 12;
    reqs.push_back(q);
  }
  for (bool greedy_ids : {false, true}) {
    SCOPED_TRACE(greedy_ids ? "ids from the device" : "logits");
    std::vector<Request> run = reqs;
    run_batched(*gpu, run, 3, greedy_ids);
    for (size_t i = 0; i < run.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(run[i].got, alone(*cpu, 0, run[i].prompt, run[i].n_gen, 3));
    }
    for (int seq = 0; seq < sc.n_seq; ++seq) gpu->reset(seq);
  }
}

// On a GPU: a CUDA sequence cut back to a shared prefix and continued with
// another prompt (in a batch with another sequence's decode) gets the CPU's
// greedy tokens of that prompt.
TEST(EngineBatch, CudaTruncateEqualsCpu) {
  if (!backend_unavailable(Backend::Cuda).empty()) GTEST_SKIP() << "no CUDA device on this machine";
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  auto gpu = make_stage_runner(Backend::Cuda, f, batch_config());
  auto cpu = make_stage_runner(Backend::Cpu, f, batch_config());
  std::mt19937_64 rng(seed);
  for (int64_t keep : {1, 5}) {
    SCOPED_TRACE("keep " + std::to_string(keep));
    std::vector<int32_t> first = {1};  // BOS, then a short random start
    for (int32_t t : random_prompt(rng, 7, int32_t(cpu->n_vocab()))) first.push_back(t);
    std::vector<int32_t> second(first.begin(), first.begin() + keep);
    for (int32_t t : random_prompt(rng, 3, int32_t(cpu->n_vocab()))) second.push_back(t);
    EXPECT_EQ(after_truncate(*gpu, 3, first, keep, second, 10), alone(*cpu, 0, second, 10, 32));
  }
}

}  // namespace
}  // namespace baton
