// ClusterEngine: the GenerationService over a pipeline of worker processes
// (`baton serve --workers K` and `--config`). The HTTP API sees the same
// interface as for LocalEngine (coordinator/api/generation.h).
//
// One scheduler thread owns the sequences. It first waits for the workers,
// places the stages and waits until they are loaded (the HTTP server answers
// /health meanwhile). Then, continuous batching across the pipeline: up to
// n_seq requests hold a KV slot on every stage. The batch scheduler
// (batch_scheduler.h) fills micro-batches within the token budget: ready
// decode tokens and prompt chunks of several sequences in one FORWARD, which
// each stage runs as one batched forward. With K stages, K micro-batches are
// in flight, so every stage works on every step: while the last stage runs
// one micro-batch, the first runs the next. A sequence has at most one
// sampling step in flight; its prompt chunks follow each other through the
// FIFO links. The last stage samples with the request's parameters and seed
// and returns the token ids (and acknowledges a micro-batch that sampled
// nothing), so the coordinator knows when each micro-batch has left.
//
// Failure: when a worker dies, stalls or fails, or a link between two stages
// drops, every request in flight ends with FinishReason::error naming the
// worker and its stage (within the link timeout, 1.5 s), requests are
// refused with UnavailableError while the route is broken, and serving
// resumes when the cluster has healed the route (a worker registered and
// loaded the vacant stage, or the stage re-dialled its next one). A broken route empties the
// prefix cache, so nothing depends on KV that was lost.
//
// Prefix cache (prefix_cache.h): a slot whose sequence ended normally keeps
// its KV on every stage (no FREE_SEQ); the coordinator knows the tokens it
// holds and starts a new request that shares a prefix with them at the end
// of that prefix, in that slot: its first chunk `begins` at start_pos = the
// prefix, and every stage cuts the slot's KV back to it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <variant>
#include <vector>

#include "coordinator/cluster/cluster.h"
#include "coordinator/api/generation.h"
#include "coordinator/cluster/prefix_cache.h"
#include "engine/gguf/file.h"

namespace baton {

class Metrics;

struct ClusterEngineConfig {
  std::string model_path;  // the model's metadata on the coordinator (full GGUF or any split part)
  std::string model_id;    // "" = the file name without ".gguf"
  int n_workers = 1;       // stages
  int64_t n_ctx = 0;       // 0: the model's trained context, at most StageConfig::kDefaultMaxCtx
  int n_seq = 4;           // KV slots on every stage
  int64_t prefill_chunk = 64;   // prompt tokens of one sequence per micro-batch
  int64_t batch_tokens = 64;    // tokens of one micro-batch (each stage's batch)
  int queue_capacity = 64;
  bool prefix_cache = true;  // reuse the KV a free slot kept on every stage (prefix_cache.h)
  // Workers load this path themselves when they registered without a model
  // ("" = model_path, made absolute).
  std::string worker_model_path;
  // Polled while waiting for workers: why waiting is hopeless, else "".
  std::function<std::string()> workers_alive;
};

class ClusterEngine final : public GenerationService, private ClusterObserver {
 public:
  // Reads the model's metadata and tokenizer (throws for a bad file), then
  // starts the scheduler thread, which collects the workers and loads.
  ClusterEngine(ClusterEngineConfig config, Cluster& cluster, Metrics* metrics);
  ~ClusterEngine() override;  // shutdown()

  // Blocks until every stage is loaded; rethrows a start-up failure.
  void wait_loaded();
  // Ends every request (cancelled), stops the scheduler. Idempotent.
  void shutdown();

  const ModelInfo& model() const override { return info_; }
  uint64_t submit(GenerationRequest request, EventSink sink) override;
  void cancel(uint64_t id) override;
  ServiceHealth health() const override;

  // The stages as placed (empty before the workers registered).
  std::vector<StageSlice> slices() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Sequence;
  enum class State { starting, serving, failed, stopped };
  struct RequestError {
    uint64_t request_id;
    std::string text;
  };
  struct RouteBroken {
    std::string why;
  };
  struct RouteHealed {};
  using Event = std::variant<net::Result, RequestError, RouteBroken, RouteHealed>;

  // ClusterObserver (io thread): queue the event for the scheduler.
  void on_result(net::Result&& r) override;
  void on_request_error(uint64_t request_id, const std::string& text) override;
  void on_route_broken(const std::string& why) override;
  void on_route_healed() override;
  void post(Event e);

  void start();
  void scheduler();
  void handle(Event& e);
  struct MicroBatch {
    std::vector<std::pair<int, uint64_t>> seqs;  // (slot, request id) of every chunk
    int results_left = 0;                        // RESULTs still to come (an acknowledgement counts one)
    Clock::time_point sent;
  };
  // Sends micro-batches while fewer than one per stage are in flight and
  // sequences are ready.
  void send_batches();
  void finish(Sequence& s, FinishReason reason, GenerationEvent ev, const std::string& error = {});
  // Frees its slot; keep: the slot's KV on every stage is exactly the
  // tokens sent (nothing in flight) and stays for the prefix cache, else it
  // is freed on every stage.
  void release(Sequence& s, bool keep = false);
  void fail_all(const std::string& why);

  ClusterEngineConfig config_;
  Cluster& cluster_;
  Metrics* metrics_;
  GgufFile file_;
  ModelInfo info_;
  int n_layer_ = 0;
  std::vector<StageSlice> slices_;  // set once by the scheduler, before serving

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::starting;
  std::string error_;      // start-up failure
  std::string broken_;     // why the route is broken ("" when whole)
  uint64_t next_id_ = 1;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::unordered_set<uint64_t> cancel_requests_;
  std::deque<Event> events_;
  int active_ = 0;

  // Scheduler thread only.
  std::vector<std::unique_ptr<Sequence>> slots_;
  PrefixCache cache_;
  std::map<uint64_t, MicroBatch> in_flight_;  // FORWARD request id -> its micro-batch
  uint64_t steps_ = 0, admitted_ = 0;
  std::thread thread_;
};

}  // namespace baton
