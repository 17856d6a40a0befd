// The batch scheduler (coordinator/cluster/batch_scheduler.h) on its own,
// and through LocalEngine on the CPU: concurrent requests with chunked
// prefill beside decodes get the tokens they get alone; a full server
// refuses with QueueFullError and serves the rest; a request cancelled
// mid-batch ends alone.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/cluster/batch_scheduler.h"
#include "coordinator/cluster/local_engine.h"
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

// ---- LocalEngine on the CPU

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, FinishReason> finished;
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
    if (ev.finish) c.finished[id] = *ev.finish;
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
