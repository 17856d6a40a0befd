// The batch scheduler (coordinator/cluster/batch_scheduler.h) and the
// prefix cache (prefix_cache.h) on their own, and through LocalEngine on the
// CPU: concurrent requests with chunked prefill beside decodes get the
// tokens they get alone; a full server refuses with QueueFullError and
// serves the rest; a request cancelled mid-batch ends alone; a prompt that
// shares a prefix with a finished request computes only the rest and gets
// the tokens it gets without the cache; free slots are evicted LRU.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/api/metrics.h"
#include "coordinator/cluster/batch_scheduler.h"
#include "coordinator/cluster/local_engine.h"
#include "coordinator/cluster/prefix_cache.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

// ---- plan_batch

int64_t tokens_of(const std::vector<SchedChunk>& plan) {
  int64_t n = 0;
  for (const SchedChunk& c : plan) n += c.n_tokens;
  return n;
}

TEST(BatchScheduler, DecodesFirstThenPromptChunksWithinTheBudget) {
  // Slots 0-2 decode, 3 and 4 have prompts of 10 and 3 tokens left.
  std::vector<SchedSeq> seqs = {{0, 0, true, 5, 1}, {1, 0, true, 5, 2}, {2, 0, true, 5, 3},
                                {3, 10, true, 0, 4}, {4, 3, true, 0, 5}};
  const auto plan = plan_batch(seqs, 8, 4);
  ASSERT_EQ(plan.size(), 5u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(plan[size_t(i)].slot, i);
    EXPECT_EQ(plan[size_t(i)].n_tokens, 1);
    EXPECT_FALSE(plan[size_t(i)].prefill);
  }
  // The older prompt takes a whole chunk; the next what is left of the budget.
  EXPECT_EQ(plan[3].slot, 3);
  EXPECT_EQ(plan[3].n_tokens, 4);
  EXPECT_TRUE(plan[3].prefill);
  EXPECT_EQ(plan[4].slot, 4);
  EXPECT_EQ(plan[4].n_tokens, 1);
  EXPECT_EQ(tokens_of(plan), 8);
}

TEST(BatchScheduler, KeepsAShareForPromptsWhenDecodesFillTheBudget) {
  std::vector<SchedSeq> seqs;
  for (int i = 0; i < 16; ++i) seqs.push_back({i, 0, true, 1, uint64_t(i)});
  seqs.push_back({16, 50, true, 0, 16});
  const auto plan = plan_batch(seqs, 8, 64);
  EXPECT_EQ(tokens_of(plan), 8);
  ASSERT_FALSE(plan.empty());
  EXPECT_TRUE(plan.back().prefill);
  EXPECT_EQ(plan.back().slot, 16);
  EXPECT_EQ(plan.back().n_tokens, 2);  // a quarter of the budget
}

TEST(BatchScheduler, EverySequenceGetsItsTurnWhenTheBudgetIsShort) {
  // Ten decoding sequences, a budget of four: over three steps each runs at
  // least once, and none twice before all ran once.
  std::vector<SchedSeq> seqs;
  for (int i = 0; i < 10; ++i) seqs.push_back({i, 0, true, 0, uint64_t(i + 1)});
  std::map<int, int> runs;
  for (uint64_t step = 1; step <= 3; ++step) {
    const auto plan = plan_batch(seqs, 4, 4);
    EXPECT_EQ(plan.size(), 4u);
    for (const SchedChunk& c : plan) {
      ++runs[c.slot];
      seqs[size_t(c.slot)].last_run = step;
    }
  }
  EXPECT_EQ(runs.size(), 10u);
  for (const auto& [slot, n] : runs) EXPECT_LE(n, 2) << "slot " << slot;
}

TEST(BatchScheduler, SkipsSequencesThatAreNotReady) {
  std::vector<SchedSeq> seqs = {{0, 0, false, 0, 1}, {1, 5, false, 0, 2}, {2, 0, true, 0, 3}};
  const auto plan = plan_batch(seqs, 16, 16);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].slot, 2);
  EXPECT_TRUE(plan_batch(std::vector<SchedSeq>{{0, 0, false, 0, 1}}, 16, 16).empty());
}

TEST(BatchScheduler, AdmissionCountsSlotsAndQueue) {
  EXPECT_NO_THROW(check_admission(3, 1, 4, 2));
  EXPECT_THROW(check_admission(4, 2, 4, 2), QueueFullError);
}

// ---- the prefix cache

TEST(PrefixCache, ReusesTheCommonPrefixButComputesTheLastPromptToken) {
  const std::vector<int32_t> kept = {1, 2, 3, 4, 5, 6, 7};
  PrefixPolicy p;
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 4, 5, 9, 9}, p), 5);
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, p), 7);
  // The whole prompt is kept: its last token is computed again for its logits.
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 4, 5, 6}, p), 5);
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 9, 9, 9}, p), 0);  // below min_match
  p.min_match = 2;
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 9, 9, 9}, p), 3);
  // KV that cannot be cut: all of it, or nothing.
  p.truncatable = false;
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 9, 9, 9}, p), 0);
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}, p), 0);
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, p), 7);
  p.enabled = false;
  EXPECT_EQ(reusable_prefix(kept, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, p), 0);
}

TEST(PrefixCache, ChoosesTheLongestMatchElseTheLeastRecentlyUsed) {
  PrefixCache c(3, {});
  const std::vector<bool> all(3, true);
  // Empty slots: the first.
  EXPECT_EQ(c.choose(std::vector<int32_t>{1, 2, 3, 4, 5}, all).slot, 0);
  c.take(1, 0);
  c.append(1, std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  c.release(1);
  c.take(2, 0);
  c.append(2, std::vector<int32_t>{1, 2, 3, 4, 9, 9});
  c.release(2);
  c.take(0, 0);
  c.append(0, std::vector<int32_t>{7, 7, 7, 7, 7});
  c.release(0);
  auto got = c.choose(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}, all);
  EXPECT_EQ(got.slot, 1);
  EXPECT_EQ(got.reuse, 6);
  got = c.choose(std::vector<int32_t>{1, 2, 3, 4, 9, 8}, all);
  EXPECT_EQ(got.slot, 2);
  EXPECT_EQ(got.reuse, 5);
  // No match: the least recently released (slot 1), unless it is busy.
  got = c.choose(std::vector<int32_t>{5, 5, 5, 5, 5}, all);
  EXPECT_EQ(got.slot, 1);
  EXPECT_EQ(got.reuse, 0);
  EXPECT_EQ(c.choose(std::vector<int32_t>{5, 5, 5, 5, 5}, {true, false, true}).slot, 2);
  EXPECT_EQ(c.choose(std::vector<int32_t>{5}, {false, false, false}).slot, -1);
  // A forgotten slot holds nothing and goes first.
  c.forget(0);
  EXPECT_EQ(c.choose(std::vector<int32_t>{5, 5, 5, 5, 5}, all).slot, 0);
  c.take(1, 2);
  EXPECT_EQ(c.tokens(1), (std::vector<int32_t>{1, 2}));
  PrefixCache off(2, {.enabled = false});
  off.append(0, std::vector<int32_t>{1, 2, 3, 4, 5});
  EXPECT_TRUE(off.tokens(0).empty());
}

// ---- LocalEngine on the CPU

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, FinishReason> finished;
  std::map<uint64_t, Usage> usage;
};

EventSink sink_for(Collected& c, uint64_t* id_slot, std::mutex* id_mu) {
  return [&c, id_slot, id_mu](GenerationEvent&& ev) {
    uint64_t id;
    {
      std::lock_guard lock(*id_mu);
      id = *id_slot;
    }
    std::lock_guard lock(c.mu);
    for (const GeneratedToken& t : ev.tokens) c.tokens[id].push_back(t.id);
    if (ev.finish) {
      c.finished[id] = *ev.finish;
      c.usage[id] = ev.usage;
    }
    c.cv.notify_all();
  };
}

// A slot is freed just after its request's final event: poll briefly.
int busy_slots_settled(const LocalEngine& e) {
  for (int i = 0; i < 200 && e.health().slots_busy > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return e.health().slots_busy;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

LocalEngineConfig engine_config(int n_seq, int64_t budget, int queue) {
  LocalEngineConfig c;
  c.model_path = test::model_path("stories260K.gguf");
  c.stage.n_ctx = 96;
  c.stage.n_seq = n_seq;
  c.stage.max_batch = budget;
  c.prefill_chunk = 4;
  c.queue_capacity = queue;
  return c;
}

// Submits every request at once (ids in `ids`), waits until all finished.
void run_all(LocalEngine& e, const std::vector<GenerationRequest>& reqs, Collected& c, std::vector<uint64_t>& ids) {
  std::mutex id_mu;
  ids.assign(reqs.size(), 0);
  {
    std::lock_guard lock(id_mu);  // the sinks read their id once it is known
    for (size_t i = 0; i < reqs.size(); ++i) ids[i] = e.submit(reqs[i], sink_for(c, &ids[i], &id_mu));
  }
  std::unique_lock lock(c.mu);
  ASSERT_TRUE(c.cv.wait_for(lock, std::chrono::seconds(60), [&] { return c.finished.size() == reqs.size(); }));
}

std::vector<GenerationRequest> story_requests() {
  // BOS + word pieces of stories260K; prompts longer than the 4-token chunk.
  return {greedy({1, 403, 407, 261, 378, 414, 261}, 20), greedy({1, 378}, 14), greedy({1, 261, 403}, 24),
          greedy({1, 407, 407, 261, 378, 403, 261, 378, 414}, 9), greedy({1, 414, 261, 378, 403}, 17)};
}

TEST(LocalEngineBatch, ConcurrentRequestsGetTheirTokensAlone) {
  const auto reqs = story_requests();
  // Alone: one slot, one request at a time.
  std::vector<std::vector<int32_t>> want;
  {
    LocalEngine alone(engine_config(1, 8, 8), nullptr);
    alone.wait_loaded();
    for (const GenerationRequest& r : reqs) {
      Collected c;
      std::vector<uint64_t> ids;
      run_all(alone, {r}, c, ids);
      want.push_back(c.tokens[ids[0]]);
      EXPECT_FALSE(want.back().empty());
    }
  }
  // Together: three slots (two requests wait), a budget of 6 tokens so that
  // prompt chunks share steps with decodes.
  LocalEngine together(engine_config(3, 6, 8), nullptr);
  together.wait_loaded();
  Collected c;
  std::vector<uint64_t> ids;
  run_all(together, reqs, c, ids);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(c.tokens[ids[i]], want[i]);
    EXPECT_NE(c.finished[ids[i]], FinishReason::error);
  }
  EXPECT_EQ(busy_slots_settled(together), 0);
}

TEST(LocalEngineBatch, FullServerRefusesAndServesTheRest) {
  LocalEngine e(engine_config(2, 8, 1), nullptr);
  e.wait_loaded();
  Collected c;
  std::mutex id_mu;
  std::vector<uint64_t> ids(3, 0);
  const auto reqs = story_requests();
  {
    std::lock_guard lock(id_mu);
    for (size_t i = 0; i < 3; ++i) ids[i] = e.submit(reqs[i], sink_for(c, &ids[i], &id_mu));
    // Two slots and one queue place are taken: a fourth is refused.
    uint64_t unused = 0;
    EXPECT_THROW(e.submit(reqs[3], sink_for(c, &unused, &id_mu)), QueueFullError);
  }
  std::unique_lock lock(c.mu);
  ASSERT_TRUE(c.cv.wait_for(lock, std::chrono::seconds(60), [&] { return c.finished.size() == 3; }));
  for (uint64_t id : ids) EXPECT_NE(c.finished[id], FinishReason::error);
}

TEST(LocalEngineBatch, CancelMidBatchEndsOnlyThatRequest) {
  const auto reqs = story_requests();
  std::vector<int32_t> want0;
  {
    LocalEngine alone(engine_config(1, 8, 8), nullptr);
    alone.wait_loaded();
    Collected c;
    std::vector<uint64_t> ids;
    run_all(alone, {reqs[0]}, c, ids);
    want0 = c.tokens[ids[0]];
  }
  LocalEngine e(engine_config(3, 8, 8), nullptr);
  e.wait_loaded();
  Collected c;
  std::mutex id_mu;
  std::vector<uint64_t> ids(2, 0);
  GenerationRequest longest = greedy({1, 261, 403}, 80);
  {
    std::lock_guard lock(id_mu);
    ids[0] = e.submit(reqs[0], sink_for(c, &ids[0], &id_mu));
    ids[1] = e.submit(longest, sink_for(c, &ids[1], &id_mu));
  }
  {
    // Cancel the long one once it has produced a token, while both run.
    std::unique_lock lock(c.mu);
    ASSERT_TRUE(c.cv.wait_for(lock, std::chrono::seconds(60),
                              [&] { return !c.tokens[ids[1]].empty() || c.finished.count(ids[1]) > 0; }));
  }
  e.cancel(ids[1]);
  std::unique_lock lock(c.mu);
  ASSERT_TRUE(c.cv.wait_for(lock, std::chrono::seconds(60), [&] { return c.finished.size() == 2; }));
  EXPECT_EQ(c.tokens[ids[0]], want0);
  EXPECT_TRUE(c.finished[ids[1]] == FinishReason::cancelled || c.finished[ids[1]] == FinishReason::stop);
  EXPECT_LT(c.tokens[ids[1]].size(), 80u);
  lock.unlock();
  EXPECT_EQ(busy_slots_settled(e), 0);
}

// ---- the prefix cache through LocalEngine

// A counter's value in the metrics text.
int64_t metric(const Metrics& m, const std::string& name) {
  const std::string text = m.render(ServiceHealth{});
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + name.size() + 2));
}

struct OneResult {
  std::vector<int32_t> tokens;
  Usage usage;
  FinishReason finish = FinishReason::error;
};

// The tokens whose KV a slot keeps after `r` ran `prompt`: every sampled
// token was fed but the last, unless that was an end-of-generation token
// (not among the tokens, never fed).
std::vector<int32_t> kept_after(std::vector<int32_t> prompt, const OneResult& r) {
  const size_t fed = r.finish == FinishReason::stop ? r.tokens.size() : r.tokens.size() - 1;
  prompt.insert(prompt.end(), r.tokens.begin(), r.tokens.begin() + std::ptrdiff_t(fed));
  return prompt;
}

OneResult run_one(LocalEngine& e, const GenerationRequest& r) {
  Collected c;
  std::vector<uint64_t> ids;
  run_all(e, {r}, c, ids);
  EXPECT_NE(c.finished[ids[0]], FinishReason::error);
  return {c.tokens[ids[0]], c.usage[ids[0]], c.finished[ids[0]]};
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Requests in turn: a story, then prompts that share a prefix with what the
// slot kept (part of the prompt; the prompt and part of its answer, as a
// chat's next turn), then one that shares nothing. Each gets the greedy
// tokens of an engine without the cache, reports the reused tokens, and
// only the rest runs through the stage.
void expect_prefix_reuse(const std::string& model, bool truncatable) {
  LocalEngineConfig cfg = engine_config(1, 8, 8);
  cfg.model_path = model;
  Metrics metrics;
  LocalEngine cached(cfg, &metrics);
  cfg.prefix_cache = false;
  LocalEngine plain(cfg, nullptr);
  cached.wait_loaded();
  plain.wait_loaded();

  const std::vector<int32_t> story = {1, 203, 207, 161, 178, 214, 161, 203, 178};
  const OneResult first = run_one(cached, greedy(story, 10));
  EXPECT_EQ(first.tokens, run_one(plain, greedy(story, 10)).tokens);
  EXPECT_EQ(first.usage.cached_tokens, 0);
  ASSERT_FALSE(first.tokens.empty());
  std::vector<int32_t> kept = kept_after(story, first);

  struct Case {
    std::vector<int32_t> prompt;
    int64_t reused;
  };
  std::vector<Case> cases;
  // The next turn: everything kept, then new tokens.
  cases.push_back({concat(kept, {161, 178, 207}), int64_t(kept.size())});
  // Part of the story, then something else: only a KV that can be cut reuses it.
  cases.push_back({concat(std::vector<int32_t>(story.begin(), story.begin() + 6), {207, 207, 161}),
                   truncatable ? 6 : 0});
  cases.push_back({{1, 214, 161, 178, 203}, 0});
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const int64_t prefill_before = metric(metrics, "baton_prefill_tokens_total");
    const OneResult got = run_one(cached, greedy(cases[i].prompt, 8));
    EXPECT_EQ(got.tokens, run_one(plain, greedy(cases[i].prompt, 8)).tokens);
    EXPECT_EQ(got.usage.cached_tokens, cases[i].reused);
    EXPECT_EQ(got.usage.prompt_tokens, int64_t(cases[i].prompt.size()));
    // Only the prompt tokens past the reused prefix ran as prefill.
    EXPECT_EQ(metric(metrics, "baton_prefill_tokens_total") - prefill_before,
              int64_t(cases[i].prompt.size()) - cases[i].reused);
    // What the slot keeps now, for the next case.
    ASSERT_FALSE(got.tokens.empty());
    kept = kept_after(cases[i].prompt, got);
  }
  EXPECT_EQ(metric(metrics, "baton_prompt_tokens_cached_total"), cases[0].reused + cases[1].reused);
}

TEST(LocalEnginePrefixCache, LlamaReusesSharedPrefixes) {
  expect_prefix_reuse(test::model_path("stories260K.gguf"), true);
}

TEST(LocalEnginePrefixCache, Deepseek4ReusesWholeSlotsOnly) {
  test::TempDir dir;
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-tiny";
  o.seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  const std::string path = dir.file("ds4.gguf");
  write_synth_model(path, o);
  expect_prefix_reuse(path, false);
}

// Two slots: a prompt that matches neither takes the least recently used
// one, whose prefix is then lost; the other slot's survives.
TEST(LocalEnginePrefixCache, EvictsTheLeastRecentlyUsedSlot) {
  LocalEngine e(engine_config(2, 8, 8), nullptr);
  e.wait_loaded();
  const std::vector<int32_t> a = {1, 403, 407, 261, 378, 414};
  const std::vector<int32_t> b = {1, 378, 261, 403, 407, 407};
  const std::vector<int32_t> c = {1, 414, 414, 261, 403, 378};
  EXPECT_EQ(run_one(e, greedy(a, 4)).usage.cached_tokens, 0);
  EXPECT_EQ(run_one(e, greedy(b, 4)).usage.cached_tokens, 0);  // the empty slot, not a's
  EXPECT_EQ(run_one(e, greedy(concat(a, {261}), 4)).usage.cached_tokens, int64_t(a.size()));  // a's is the LRU now
  EXPECT_EQ(run_one(e, greedy(c, 4)).usage.cached_tokens, 0);  // evicts b's
  EXPECT_EQ(run_one(e, greedy(concat(b, {261}), 4)).usage.cached_tokens, 0);
  EXPECT_EQ(run_one(e, greedy(concat(c, {261}), 4)).usage.cached_tokens, int64_t(c.size()));
}

TEST(LocalEnginePrefixCache, OffReusesNothing) {
  LocalEngineConfig cfg = engine_config(1, 8, 8);
  cfg.prefix_cache = false;
  LocalEngine e(cfg, nullptr);
  e.wait_loaded();
  const std::vector<int32_t> a = {1, 403, 407, 261, 378, 414};
  EXPECT_EQ(run_one(e, greedy(a, 4)).usage.cached_tokens, 0);
  EXPECT_EQ(run_one(e, greedy(concat(a, {261}), 4)).usage.cached_tokens, 0);
}

}  // namespace
// A step budget beyond the context (serve --batch 1024 --ctx 512) is cut to
// the batch the stage plans: three 60-token prompts fit one 200-token budget
// but not one forward of the 96-token stage.
TEST(LocalEngineBatch, BudgetBeyondTheContextIsCutToTheStageBatch) {
  LocalEngineConfig config = engine_config(3, 200, 8);
  config.prefill_chunk = 0;
  LocalEngine e(config, nullptr);
  e.wait_loaded();
  std::vector<GenerationRequest> reqs;
  for (int r = 0; r < 3; ++r) {
    std::vector<int32_t> prompt{1};
    for (int i = 1; i < 60; ++i) prompt.push_back(std::vector<int32_t>{403, 407, 261, 378, 414}[size_t(i + r) % 5]);
    reqs.push_back(greedy(prompt, 4));
  }
  Collected c;
  std::vector<uint64_t> ids;
  run_all(e, reqs, c, ids);
  for (uint64_t id : ids) {
    EXPECT_NE(c.finished[id], FinishReason::error);
    EXPECT_FALSE(c.tokens[id].empty());
  }
}

}  // namespace baton
