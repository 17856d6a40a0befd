#include "coordinator/cluster/cluster_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "coordinator/api/metrics.h"
#include "coordinator/cluster/batch_scheduler.h"
#include "engine/plan/node_plan.h"
#include "engine/model/part_info.h"
#include "engine/text/tokenizer.h"

namespace baton {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

struct ClusterEngine::Sequence {
  uint64_t id = 0;
  GenerationRequest req;
  EventSink sink;
  Clock::time_point submitted;
  int slot = -1;
  size_t prompt_sent = 0;    // prompt tokens sent or reused from the slot's KV
  int64_t prompt_run = 0;    // prompt tokens sent (those the stages compute)
  int32_t next_input = -1;   // the last sampled token, fed at the next step
  uint64_t in_flight = 0;    // request id of the micro-batch whose RESULT it awaits
  Clock::time_point sent;    // when that micro-batch was sent
  uint64_t admitted = 0, last_run = 0;
  bool begun = false;  // its first chunk was sent (with `begins`)
  bool ended = false;
  std::optional<GrammarMatcher> grammar;  // structured output: the coordinator masks, the last stage samples
  TextAssembler text;
  Usage usage;

  Sequence(GenerationRequest r, EventSink s) : req(std::move(r)), sink(std::move(s)), text(req.stop) {}
  int64_t position() const { return int64_t(req.prompt.size()) + usage.completion_tokens; }
};

ClusterEngine::ClusterEngine(ClusterEngineConfig config, Cluster& cluster, Metrics* metrics)
    : config_(std::move(config)),
      cluster_(cluster),
      metrics_(metrics),
      file_(GgufFile::open(config_.model_path)),
      cache_(0, {}) {
  if (config_.n_workers < 1) throw std::invalid_argument("a cluster needs at least one worker");
  if (config_.n_seq < 1) throw std::invalid_argument("--parallel must be >= 1");
  if (config_.queue_capacity < 0) throw std::invalid_argument("the queue capacity must be >= 0");
  info_ = model_info_from_gguf(file_, config_.model_path, config_.model_id, config_.n_ctx);
  const std::unique_ptr<Arch> arch = Arch::from_gguf(file_);
  n_layer_ = arch->dims().n_layer;
  cache_ = PrefixCache(config_.n_seq, {config_.prefix_cache, arch->kv_truncatable()});
  if (config_.n_workers > n_layer_) {
    throw std::invalid_argument(fmt::format("{} workers for {} layers: each stage needs at least one layer",
                                            config_.n_workers, n_layer_));
  }
  config_.prefill_chunk = std::clamp<int64_t>(config_.prefill_chunk, 1, info_.n_ctx);
  config_.batch_tokens = std::clamp<int64_t>(config_.batch_tokens, 1, info_.n_ctx);
  if (config_.worker_model_path.empty()) {
    config_.worker_model_path = std::filesystem::absolute(config_.model_path).string();
  }
  slots_.resize(size_t(config_.n_seq));
  cluster_.set_observer(this);
  thread_ = std::thread([this] { scheduler(); });
}

ClusterEngine::~ClusterEngine() {
  shutdown();
  cluster_.set_observer(nullptr);
}

void ClusterEngine::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (state_ != State::failed) state_ = State::stopped;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ClusterEngine::wait_loaded() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return state_ != State::starting; });
  if (state_ == State::failed) throw std::runtime_error(error_);
  if (state_ == State::stopped) throw UnavailableError("the engine was shut down");
}

std::vector<StageSlice> ClusterEngine::slices() const {
  std::lock_guard lock(mu_);
  return slices_;
}

uint64_t ClusterEngine::submit(GenerationRequest request, EventSink sink) {
  validate_request(request, info_);
  auto seq = std::make_unique<Sequence>(std::move(request), std::move(sink));
  seq->submitted = Clock::now();
  seq->usage.prompt_tokens = int64_t(seq->req.prompt.size());
  std::lock_guard lock(mu_);
  if (state_ == State::starting) throw UnavailableError("the workers are still loading the model");
  if (state_ == State::failed) throw UnavailableError("the cluster failed to start: " + error_);
  if (state_ == State::stopped) throw UnavailableError("the server is shutting down");
  if (!broken_.empty()) throw UnavailableError("the route is incomplete: " + broken_);
  check_admission(active_, int(queue_.size()), int(slots_.size()), config_.queue_capacity);
  seq->id = next_id_++;
  const uint64_t id = seq->id;
  queue_.push_back(std::move(seq));
  cv_.notify_all();
  return id;
}

void ClusterEngine::cancel(uint64_t id) {
  {
    std::lock_guard lock(mu_);
    cancel_requests_.insert(id);
  }
  cv_.notify_all();
}

ServiceHealth ClusterEngine::health() const {
  ServiceHealth h;
  const std::vector<WorkerStatus> workers = cluster_.workers();
  for (const WorkerStatus& w : workers) {
    StageHealth s;
    s.node = w.name.empty() ? "(none)" : w.name;
    s.address = w.address;
    s.first_layer = w.slice.layers.first;
    s.last_layer = w.slice.layers.last;
    s.embedding = w.slice.embedding;
    s.head = w.slice.head;
    s.state = w.state;
    s.stage = w.stage;
    s.rank = w.rank;
    s.tp = w.slice.tp;
    s.link = w.link;
    s.link_reason = w.link_reason;
    s.error = w.error;  // the previous stage cannot reach it
    s.bytes_loaded = w.bytes_done;
    s.bytes_total = w.bytes_total;
    s.progress = w.state == "loaded" ? 1.0 : w.bytes_total ? double(w.bytes_done) / double(w.bytes_total) : 0.0;
    if (w.state == "loaded") {
      s.memory_planned = {{plan_line_name(PlanLine::Weights), w.ready.weights_bytes},
                          {plan_line_name(PlanLine::KvCache), w.ready.kv_bytes},
                          {plan_line_name(PlanLine::Workspace), w.ready.workspace_bytes}};
      // Each planned line is one allocation of exactly its size (rule 2).
      s.memory_used = w.ready.weights_bytes + w.ready.kv_bytes + w.ready.workspace_bytes;
    }
    h.stages.push_back(std::move(s));
  }
  std::lock_guard lock(mu_);
  for (size_t i = workers.empty() ? 0 : slices_.size(); i < slices_.size(); ++i) {
    StageHealth s;
    s.stage = int(i);
    s.node = "(none)";
    s.first_layer = slices_[i].layers.first;
    s.last_layer = slices_[i].layers.last;
    s.state = "vacant";
    h.stages.push_back(std::move(s));
  }
  switch (state_) {
    case State::starting:
      h.status = "loading";
      break;
    case State::serving:
      h.status = broken_.empty() ? "ok" : "error";
      break;
    case State::failed:
      h.status = "error";
      break;
    case State::stopped:
      h.status = "stopping";
      break;
  }
  if (!broken_.empty() || state_ == State::failed) {
    const std::string& why = state_ == State::failed ? error_ : broken_;
    for (StageHealth& s : h.stages) {
      if (s.state != "loaded") s.error = why;
    }
    if (h.stages.empty()) h.stages.push_back(StageHealth{"(none)", "", 0, n_layer_ - 1, true, true, "failed", 0, 0, 0, {}, 0, 0, why, "", ""});
  }
  h.slots_total = int(slots_.size());
  h.slots_busy = active_;
  h.queue_depth = int(queue_.size());
  h.queue_capacity = config_.queue_capacity;
  return h;
}

// ---- events from the cluster (io thread) ----

void ClusterEngine::post(Event e) {
  {
    std::lock_guard lock(mu_);
    if (auto* b = std::get_if<RouteBroken>(&e)) broken_ = b->why;
    if (std::holds_alternative<RouteHealed>(e)) broken_.clear();
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void ClusterEngine::on_result(net::Result&& r) { post(std::move(r)); }
void ClusterEngine::on_request_error(uint64_t request_id, const std::string& text) {
  post(RequestError{request_id, text});
}
void ClusterEngine::on_route_broken(const std::string& why) { post(RouteBroken{why}); }
void ClusterEngine::on_route_healed() { post(RouteHealed{}); }

// ---- scheduler thread ----

void ClusterEngine::start() {
  const std::vector<net::Hello> hellos = cluster_.wait_for_workers(config_.n_workers, config_.workers_alive);
  std::vector<StageSlice> slices;
  if (auto from_parts = slices_from_parts(hellos, n_layer_)) {
    slices = *from_parts;
  } else {
    ModelPlanner planner(file_);
    slices = split_layers(planner, config_.n_workers);
  }
  {
    std::lock_guard lock(mu_);
    slices_ = slices;
  }
  StageSettings settings;
  settings.n_ctx = uint32_t(info_.n_ctx);
  settings.micro_batch = uint32_t(config_.batch_tokens);
  settings.prefill_chunk = uint32_t(config_.prefill_chunk);
  settings.n_seq = uint32_t(config_.n_seq);
  settings.model_path = config_.worker_model_path;
  const std::optional<PartInfo> part = read_part_info(file_);
  settings.model_hash = part ? part->source_hash : file_.tensor_table_hash();
  cluster_.assign(slices, settings);
}

void ClusterEngine::fail_all(const std::string& why) {
  for (auto& slot : slots_) {
    if (!slot) continue;
    finish(*slot, FinishReason::error, {}, why);
    release(*slot);
  }
  in_flight_.clear();
  // Workers may be replaced with empty KV before the route heals.
  cache_.forget_all();
  std::deque<std::unique_ptr<Sequence>> queued;
  {
    std::lock_guard lock(mu_);
    queued.swap(queue_);
  }
  for (auto& q : queued) finish(*q, FinishReason::error, {}, why);
}

void ClusterEngine::finish(Sequence& s, FinishReason reason, GenerationEvent ev, const std::string& error) {
  if (s.ended) return;
  close_event(ev, reason, error, s.text, s.usage);
  s.ended = true;
  if (metrics_) metrics_->generation_finished(reason, s.usage);
  deliver_event(s.sink, std::move(ev), s.req.id);
}

void ClusterEngine::release(Sequence& s, bool keep) {
  if (s.slot < 0) return;
  const int slot = s.slot;
  if (keep && cache_.policy().enabled) {
    cache_.release(slot);
  } else {
    // Frees the slot's KV on every stage; a micro-batch still in flight with
    // it runs first (links are FIFO) and its RESULT is ignored.
    cache_.forget(slot);
    if (cluster_.route_problem().empty()) cluster_.free_seq(uint32_t(slot));
  }
  slots_[size_t(slot)].reset();  // destroys s
  std::lock_guard lock(mu_);
  --active_;
}

void ClusterEngine::send_batches() {
  const size_t max_in_flight = slices_.empty() ? 1 : slices_.size();
  while (in_flight_.size() < max_in_flight) {
    std::vector<SchedSeq> views;
    for (const auto& slot : slots_) {
      if (!slot || slot->ended) continue;
      const Sequence& s = *slot;
      const int64_t left = int64_t(s.req.prompt.size() - s.prompt_sent);
      // Prompt chunks follow each other through the FIFO links; a decode
      // waits for its input.
      views.push_back({s.slot, left, left > 0 || !s.in_flight, s.last_run, s.admitted});
    }
    const std::vector<SchedChunk> plan = plan_batch(views, config_.batch_tokens, config_.prefill_chunk);
    if (plan.empty()) return;
    ++steps_;
    std::vector<net::SeqChunk> chunks;
    std::vector<int32_t> tokens;
    MicroBatch mb;
    for (const SchedChunk& pc : plan) {
      Sequence& s = *slots_[size_t(pc.slot)];
      net::SeqChunk c;
      const bool samples = !pc.prefill || s.prompt_sent + size_t(pc.n_tokens) == s.req.prompt.size();
      if (samples && s.grammar && !grammar_allowed_tokens(*s.grammar, s.req, info_, c.sampling.allowed)) {
        // Nothing can continue the text: end it rather than sample outside the grammar.
        finish(s, FinishReason::error, {}, "the grammar admits no token of the vocabulary here");
        release(s);
        continue;
      }
      s.last_run = steps_;
      c.seq = uint32_t(s.slot);
      c.sampling.temperature = s.req.sampling.temperature;
      c.sampling.top_k = s.req.sampling.top_k;
      c.sampling.top_p = s.req.sampling.top_p;
      c.sampling.min_p = s.req.sampling.min_p;
      c.sampling.seed = s.req.sampling.seed;
      c.sampling.want_logprobs = s.req.top_logprobs >= 0;
      c.sampling.top_logprobs = uint32_t(std::max(0, s.req.top_logprobs));
      for (const auto& [id, bias] : s.req.logit_bias) c.sampling.logit_bias.push_back({id, bias});
      const SamplerParams& sp = s.req.sampling;
      c.sampling.repeat_penalty = sp.repeat_penalty;
      c.sampling.repeat_last_n = sp.repeat_last_n;
      c.sampling.presence_penalty = sp.presence_penalty;
      c.sampling.frequency_penalty = sp.frequency_penalty;
      c.sampling.min_tokens = sp.min_tokens;
      if (pc.prefill && samples && sp.penalizes()) {
        // The chunk that makes the last stage's sampler: what only the coordinator knows.
        if (sp.repeat_penalty != 1.0f) {
          const size_t n = std::min(s.req.prompt.size(), size_t(std::max(0, sp.repeat_last_n)));
          c.sampling.prompt_tail.assign(s.req.prompt.end() - std::ptrdiff_t(n), s.req.prompt.end());
        }
        if (sp.min_tokens > 0) {
          c.sampling.end_tokens = end_tokens(s.req, info_);
          if (c.sampling.end_tokens.size() > net::kMaxEndTokens) c.sampling.end_tokens.resize(net::kMaxEndTokens);
        }
      }
      c.n_tokens = uint32_t(pc.n_tokens);
      c.begins = !s.begun;
      s.begun = true;
      const size_t first = tokens.size();
      if (pc.prefill) {
        c.start_pos = uint32_t(s.prompt_sent);
        const auto at = s.req.prompt.begin() + std::ptrdiff_t(s.prompt_sent);
        tokens.insert(tokens.end(), at, at + std::ptrdiff_t(pc.n_tokens));
        s.prompt_sent += size_t(pc.n_tokens);
        s.prompt_run += pc.n_tokens;
        c.sample = s.prompt_sent == s.req.prompt.size();
      } else {
        c.start_pos = uint32_t(s.position() - 1);
        tokens.push_back(s.next_input);
        c.sample = true;
      }
      cache_.append(s.slot, std::span<const int32_t>(tokens).subspan(first));
      mb.seqs.emplace_back(s.slot, s.id);
      if (c.sample) ++mb.results_left;
      chunks.push_back(std::move(c));
    }
    if (chunks.empty()) continue;
    if (mb.results_left == 0) mb.results_left = 1;  // the acknowledgement
    uint64_t rid = 0;
    try {
      rid = cluster_.forward(std::move(chunks), std::move(tokens));
    } catch (const std::exception& e) {
      for (const auto& [slot, id] : mb.seqs) {
        Sequence* s = slots_[size_t(slot)].get();
        if (!s || s->id != id) continue;
        finish(*s, FinishReason::error, {}, e.what());
        release(*s);
      }
      return;
    }
    mb.sent = Clock::now();
    for (const SchedChunk& pc : plan) {
      Sequence* s = slots_[size_t(pc.slot)].get();
      if (!s) continue;  // ended by its grammar before the batch left
      if (!pc.prefill || s->prompt_sent == s->req.prompt.size()) {
        s->in_flight = rid;
        s->sent = mb.sent;
      }
    }
    in_flight_[rid] = std::move(mb);
  }
}

void ClusterEngine::handle(Event& e) {
  if (auto* r = std::get_if<net::Result>(&e)) {
    auto mb = in_flight_.find(r->request_id);
    if (mb == in_flight_.end()) return;  // a failed micro-batch's late answer
    if (--mb->second.results_left <= 0) in_flight_.erase(mb);
    if (r->tokens.empty()) return;  // the acknowledgement of a micro-batch that sampled nothing
    Sequence* sp = r->seq < slots_.size() ? slots_[r->seq].get() : nullptr;
    // A cancelled sequence's slot may hold a newer one: only its own step counts.
    if (!sp || sp->in_flight != r->request_id || sp->ended) return;
    Sequence& s = *sp;
    s.in_flight = 0;
    const double dt = seconds_between(s.sent, Clock::now());
    const bool prefill = s.usage.completion_tokens == 0 && s.next_input < 0;
    if (prefill) {
      s.usage.prefill_s += dt;
      s.usage.time_to_first_token_s = seconds_between(s.submitted, Clock::now());
    } else {
      s.usage.decode_s += dt;
    }
    if (metrics_) metrics_->stage_forward(-1, prefill, prefill ? s.prompt_run : 1, dt);
    const int32_t id = r->tokens.front();
    float logprob = r->logprobs.empty() ? 0.f : r->logprobs.front();
    std::vector<std::pair<int32_t, float>> top;
    if (!r->top.empty()) {
      for (const net::TokenLogprob& t : r->top.front()) top.emplace_back(t.token, t.logprob);
    }
    GenerationEvent ev;
    const bool context_full = s.position() >= info_.n_ctx;
    // Its last step is back and nothing of it is in flight: the stages
    // hold the KV of exactly the tokens sent, which the slot keeps.
    if (auto reason = accept_token(s.req, *info_.tokenizer, id, logprob, top, context_full, s.text, s.usage, ev,
                                   s.grammar ? &*s.grammar : nullptr)) {
      finish(s, *reason, std::move(ev));
      release(s, /*keep=*/true);
    } else {
      s.next_input = id;
      if (!deliver_event(s.sink, std::move(ev), s.req.id)) {
        finish(s, FinishReason::cancelled, {});
        release(s, /*keep=*/true);
      }
    }
  } else if (auto* re = std::get_if<RequestError>(&e)) {
    auto mb = in_flight_.find(re->request_id);
    if (mb == in_flight_.end()) return;
    // Every sequence with a chunk in the failed micro-batch fails.
    const std::vector<std::pair<int, uint64_t>> seqs = std::move(mb->second.seqs);
    in_flight_.erase(mb);
    for (const auto& [slot, id] : seqs) {
      Sequence* s = slots_[size_t(slot)].get();
      if (!s || s->id != id || s->ended) continue;
      finish(*s, FinishReason::error, {}, re->text);
      release(*s);
    }
  } else if (auto* b = std::get_if<RouteBroken>(&e)) {
    std::fprintf(stderr, "baton serve: route broken: %s\n", b->why.c_str());
    fail_all(b->why);
  } else if (std::holds_alternative<RouteHealed>(e)) {
    std::fprintf(stderr, "baton serve: route healed: every stage is loaded again\n");
  }
}

void ClusterEngine::scheduler() {
  try {
    start();
    std::lock_guard lock(mu_);
    if (state_ == State::starting) state_ = State::serving;
  } catch (const std::exception& e) {
    std::lock_guard lock(mu_);
    if (state_ == State::starting) {
      state_ = State::failed;
      error_ = e.what();
    }
  }
  cv_.notify_all();

  const auto step_timeout = cluster_.options().step_timeout;
  for (;;) {
    std::deque<Event> events;
    std::unordered_set<uint64_t> cancels;
    std::vector<std::unique_ptr<Sequence>> dropped;
    bool stopping = false, route_whole = false;
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] {
        return state_ != State::serving || !events_.empty() || !cancel_requests_.empty() ||
               (!queue_.empty() && active_ < int(slots_.size()));
      });
      stopping = state_ != State::serving;
      route_whole = broken_.empty();
      events.swap(events_);
      cancels.swap(cancel_requests_);
      for (uint64_t id : cancels) drop_queued(queue_, id, dropped);
      if (stopping) {
        for (auto& q : queue_) dropped.push_back(std::move(q));
        queue_.clear();
      } else if (broken_.empty()) {
        admit_queued(queue_, slots_, [&](Sequence& seq, const std::vector<bool>& free) {
          // The stages cut the slot's KV back to the reused prefix when the
          // first chunk arrives (`begins`).
          const PrefixCache::Choice c = cache_.choose(seq.req.prompt, free);
          cache_.take(c.slot, c.reuse);
          seq.prompt_sent = size_t(c.reuse);
          seq.usage.cached_tokens = c.reuse;
          return c.slot;
        }, [&](Sequence& seq) {
          seq.usage.queue_s = seconds_between(seq.submitted, Clock::now());
          if (seq.req.grammar) seq.grammar.emplace(seq.req.grammar);
          seq.admitted = ++admitted_;
          ++active_;
        });
      }
    }
    for (auto& q : dropped) finish(*q, FinishReason::cancelled, {});
    for (Event& e : events) handle(e);
    for (auto& slot : slots_) {
      if (slot && (stopping || cancels.count(slot->id))) {
        finish(*slot, FinishReason::cancelled, {});
        release(*slot);
      }
    }
    if (stopping) break;
    // A micro-batch without its RESULTs within the step timeout fails its
    // sequences (the pipeline is stalled or lost it).
    const auto now = Clock::now();
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (now - it->second.sent <= step_timeout) {
        ++it;
        continue;
      }
      const std::string why = fmt::format("no result from the pipeline within {} s",
                                          std::chrono::duration<double>(step_timeout).count());
      const std::vector<std::pair<int, uint64_t>> seqs = std::move(it->second.seqs);
      it = in_flight_.erase(it);
      for (const auto& [slot, id] : seqs) {
        Sequence* s = slots_[size_t(slot)].get();
        if (!s || s->id != id || s->ended) continue;
        finish(*s, FinishReason::error, {}, why);
        release(*s);
      }
    }
    if (route_whole) send_batches();
  }
}

}  // namespace baton
