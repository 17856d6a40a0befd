// LocalEngine: the GenerationService over one stage holding the whole model
// in this process (`baton serve -m MODEL`), on the CPU or a CUDA device.
//
// Continuous batching: one scheduler thread owns the stage runner. It admits
// up to n_seq requests into KV sequence slots; each step it asks the batch
// scheduler (batch_scheduler.h) for a batch within the token budget (every
// ready decode token, then prompt chunks of at most prefill_chunk tokens)
// and runs it as one batched forward (StageRunner::forward_batch), then
// samples each sequence that produced logits. A slot is freed when its
// sequence ends or is cancelled and keeps its KV for the prefix cache
// (prefix_cache.h): a later prompt that begins with the same tokens takes
// it and prefills only the rest. Beyond the slots, up to
// queue_capacity requests wait in FIFO order; more are refused with
// QueueFullError.
//
// With a DSpark drafter on the CPU backend, a sequence that decodes alone
// (no other slot busy, no request waiting) drafts: its step is one verify
// forward of the drafter's guesses, and emits every token it confirms
// (slot_drafters.h; docs/DSPARK.md, "Drafting in baton serve").
//
// The weights load on the scheduler thread, so the HTTP server can answer
// /health ("loading") while they do; submit() refuses until then.
#pragma once

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "coordinator/api/generation.h"
#include "coordinator/cluster/prefix_cache.h"
#include "engine/gguf/file.h"
#include "engine/runtime/backend.h"
#include "engine/model/loader.h"
#include "engine/base/memory_plan.h"
#include "engine/runtime/stage.h"
#include "engine/dspark/dspark_shape.h"
#include "engine/spec/draft_pacer.h"
#include "engine/spec/speculative.h"

namespace baton {

class Metrics;
class SlotDrafters;
struct SchedSeq;

struct LocalEngineConfig {
  std::string model_path;
  std::string model_id;  // "" = the file name without ".gguf"
  Backend backend = Backend::Cpu;
  // n_ctx, n_seq (parallel slots), n_threads, max_batch (the token budget
  // of one step's batch); whole model.
  StageConfig stage;
  int queue_capacity = 64;     // requests waiting beyond the busy slots
  int64_t prefill_chunk = 0;   // prompt tokens of one sequence per step; 0 = the stage's max_batch
  bool prefix_cache = true;    // reuse the KV a free slot kept of its last request (prefix_cache.h)
  uint64_t staging_slot_bytes = uint64_t(64) << 20;  // each of the loader's staging buffers (--staging-mb)
  // The most memory the plan may use (serve --mem-limit; engine/runtime/backend.h's
  // memory_limit_problem); 0: on the CPU, what the machine has available.
  uint64_t mem_limit = 0;
  // Each step sleeps this long first (a slow machine, for tests: chat --step-delay-ms).
  int step_delay_ms = 0;
  // The DSpark drafter's settings (--no-draft, --draft-max, --draft-threshold),
  // for a model file or --draft (stage.draft_path) that has one.
  DraftChoice draft;
  // Tests: each slot's draft source made by this instead of the model's
  // DSpark drafter (which it replaces, and whose captured rows it does not
  // get); drafting then follows `draft` as with a drafter.
  std::function<std::unique_ptr<DraftSource>()> draft_source;
  // Called on the loading thread as the weights arrive (engine/model/loader.h).
  std::function<void(const LoadProgress&)> on_load_progress;
};

class LocalEngine final : public GenerationService {
 public:
  // Opens the file, builds the tokenizer and computes the memory plan (throws
  // what loading would: unreadable file, unknown architecture, missing tensor,
  // bad config), then starts the scheduler thread, which loads the weights.
  LocalEngine(LocalEngineConfig config, Metrics* metrics);
  ~LocalEngine() override;  // shutdown()

  // Blocks until the weights are loaded; rethrows a load failure.
  void wait_loaded();
  // Ends every request (FinishReason::cancelled), stops the scheduler and
  // refuses new requests. Idempotent.
  void shutdown();

  const ModelInfo& model() const override { return info_; }
  uint64_t submit(GenerationRequest request, EventSink sink) override;
  void cancel(uint64_t id) override;
  ServiceHealth health() const override;

  const MemoryPlan& memory_plan() const { return plan_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Sequence;
  enum class State { loading, loaded, failed, stopped };

  // Whether serve drafts (drafting_, drafter_, the stage's verify rows and
  // capture), with the model's DSpark drafter if any; logs why on or off.
  void decide_drafting(const std::optional<DsparkShape>& drafter);
  // Whether the drafter is one CUDA places on the GPU by default (not asked
  // for with --gpu-drafter), which stays off where it does not fit.
  bool drafter_may_give_way() const;
  // Drafting off after all, with a log line that says why.
  void drop_drafter(const std::string& why);
  void scheduler();
  // Runs one batch of the active sequences; false when none was ready.
  bool step();
  // The one sequence that decodes while nothing else runs or waits, when
  // the drafter is on; else null. `views`: the step's runnable sequences.
  Sequence* lone_decoder(std::span<const SchedSeq> views);
  // One decode step of s with the drafter's guesses: a verify forward, then
  // each confirmed token emitted as a plain step would emit it.
  void draft_step(Sequence& s);
  // forward_batch, each chunk's tokens (and captured rows) handed to its slot's drafter.
  std::span<const float> forward_for_drafters(std::span<const BatchChunk> chunks, std::span<const int32_t> tokens);
  // Samples from the logits row, or takes greedy_id when there is none
  // (forward_batch_greedy); kv_length: the slot's positions once this
  // token's row is in the KV (for "context full"); guess: the drafter's
  // guess for this token (-1: none), counted as kept in the usage when it is
  // the token, before a final event reports the usage. The token, or -1 when
  // the request ended without one.
  int32_t sample(Sequence& s, std::span<const float> logits, int32_t greedy_id, int64_t kv_length,
                 int32_t guess = -1);
  void finish(Sequence& s, FinishReason reason, GenerationEvent ev, const std::string& error = {});
  void emit(Sequence& s, GenerationEvent&& ev);

  LocalEngineConfig config_;
  Metrics* metrics_;
  GgufFile file_;
  ModelInfo info_;
  MemoryPlan plan_;
  int n_layer_ = 0;
  std::unique_ptr<StageRunner> stage_;  // created and used only on the scheduler thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::loading;
  std::string load_error_;
  double load_seconds_ = 0;
  std::atomic<uint64_t> load_done_{0};  // weight bytes in place so far
  uint64_t next_id_ = 1;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::unordered_set<uint64_t> cancel_requests_;
  int active_ = 0;  // slots in use (scheduler writes, under mu_)

  std::vector<std::unique_ptr<Sequence>> slots_;  // scheduler thread only
  PrefixCache cache_;                             // scheduler thread only
  std::vector<float> biased_;                     // scheduler thread only: logits + logit_bias
  std::vector<uint64_t> allowed_;                 // scheduler thread only: a grammar's token mask
  uint64_t steps_ = 0, admitted_ = 0;             // scheduler thread only
  bool drafting_ = false;                         // decided in the constructor
  std::optional<DsparkShape> drafter_;            // the model's DSpark drafter, when it drafts
  uint64_t drafter_bytes_ = 0;                    // its plan line: weights and a context per slot
  std::unique_ptr<SlotDrafters> drafters_;        // scheduler thread only (made once the stage loads)
  std::vector<float> batch_logits_;               // scheduler thread only: forward_for_drafters' rows
  std::vector<int32_t> verify_tokens_;            // scheduler thread only: a verify's [bonus, guesses]
  DraftPacer pacer_;                              // scheduler thread only: whether a lone step drafts
  std::thread thread_;
};

}  // namespace baton
