#include "coordinator/cluster/cluster_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "coordinator/api/metrics.h"
#include "engine/node_plan.h"
#include "engine/part_info.h"
#include "engine/tokenizer.h"

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
  bool prefilled = false;    // the prompt was sent
  int32_t next_input = -1;   // the last sampled token, fed at the next step
  uint64_t in_flight = 0;    // request id of the step awaiting its RESULT
  Clock::time_point sent;    // when that step was sent
  bool ended = false;
  TextAssembler text;
  Usage usage;

  Sequence(GenerationRequest r, EventSink s) : req(std::move(r)), sink(std::move(s)), text(req.stop) {}
  int64_t position() const { return int64_t(req.prompt.size()) + usage.completion_tokens; }
};

ClusterEngine::ClusterEngine(ClusterEngineConfig config, Cluster& cluster, Metrics* metrics)
    : config_(std::move(config)), cluster_(cluster), metrics_(metrics), file_(GgufFile::open(config_.model_path)) {
  if (config_.n_workers < 1) throw std::invalid_argument("a cluster needs at least one worker");
  if (config_.n_seq < 1) throw std::invalid_argument("--parallel must be >= 1");
  if (config_.queue_capacity < 0) throw std::invalid_argument("the queue capacity must be >= 0");
  info_ = model_info_from_gguf(file_, config_.model_path, config_.model_id, config_.n_ctx);
  n_layer_ = Arch::from_gguf(file_)->dims().n_layer;
  if (config_.n_workers > n_layer_) {
    throw std::invalid_argument(fmt::format("{} workers for {} layers: each stage needs at least one layer",
                                            config_.n_workers, n_layer_));
  }
  config_.prefill_chunk = std::clamp<int64_t>(config_.prefill_chunk, 1, info_.n_ctx);
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
  if (active_ + int(queue_.size()) >= int(slots_.size()) + config_.queue_capacity) {
    throw QueueFullError(fmt::format("the server is busy: {} requests running and {} waiting (the most)", active_,
                                     queue_.size()),
                         1);
  }
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
    s.link = w.link;
    s.link_reason = w.link_reason;
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
  for (size_t i = h.stages.size(); i < slices_.size(); ++i) {
    StageHealth s;
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
  settings.micro_batch = 1;
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

void ClusterEngine::release(Sequence& s) {
  if (s.slot < 0) return;
  const int slot = s.slot;
  if (s.in_flight) in_flight_.erase(s.in_flight);
  // Frees the slot's KV on every stage; a step still in flight for it runs
  // first (links are FIFO) and its RESULT is ignored.
  if (cluster_.route_problem().empty()) cluster_.free_seq(uint32_t(slot));
  slots_[size_t(slot)].reset();  // destroys s
  std::lock_guard lock(mu_);
  --active_;
}

void ClusterEngine::send_step(Sequence& s) {
  net::SeqChunk c;
  c.seq = uint32_t(s.slot);
  c.sampling.temperature = s.req.sampling.temperature;
  c.sampling.top_k = s.req.sampling.top_k;
  c.sampling.top_p = s.req.sampling.top_p;
  c.sampling.min_p = s.req.sampling.min_p;
  c.sampling.seed = s.req.sampling.seed;
  c.sampling.want_logprobs = s.req.top_logprobs >= 0;
  c.sampling.top_logprobs = uint32_t(std::max(0, s.req.top_logprobs));
  for (const auto& [id, bias] : s.req.logit_bias) c.sampling.logit_bias.push_back({id, bias});
  uint64_t rid = 0;
  if (!s.prefilled) {
    // The whole prompt at once, in chunks: they follow each other through
    // the stages, so stage 1 runs chunk k while stage 0 runs chunk k + 1.
    const auto& prompt = s.req.prompt;
    for (size_t at = 0; at < prompt.size(); at += size_t(config_.prefill_chunk)) {
      const size_t n = std::min(prompt.size() - at, size_t(config_.prefill_chunk));
      c.start_pos = uint32_t(at);
      c.n_tokens = uint32_t(n);
      c.sample = at + n == prompt.size();
      rid = cluster_.forward({c}, std::vector<int32_t>(prompt.begin() + std::ptrdiff_t(at),
                                                       prompt.begin() + std::ptrdiff_t(at + n)));
    }
    s.prefilled = true;
  } else {
    c.start_pos = uint32_t(s.position() - 1);
    c.n_tokens = 1;
    c.sample = true;
    rid = cluster_.forward({c}, {s.next_input});
  }
  s.in_flight = rid;
  s.sent = Clock::now();
  in_flight_[rid] = s.slot;
}

void ClusterEngine::handle(Event& e) {
  if (auto* r = std::get_if<net::Result>(&e)) {
    auto it = in_flight_.find(r->request_id);
    if (it == in_flight_.end()) return;  // a cancelled or failed request's late answer
    Sequence& s = *slots_[size_t(it->second)];
    in_flight_.erase(it);
    s.in_flight = 0;
    const double dt = seconds_between(s.sent, Clock::now());
    const bool prefill = s.usage.completion_tokens == 0 && s.next_input < 0;
    if (prefill) {
      s.usage.prefill_s += dt;
      s.usage.time_to_first_token_s = seconds_between(s.submitted, Clock::now());
    } else {
      s.usage.decode_s += dt;
    }
    if (metrics_) metrics_->stage_forward(-1, prefill, prefill ? int64_t(s.req.prompt.size()) : 1, dt);
    const int32_t id = r->tokens.front();
    float logprob = r->logprobs.empty() ? 0.f : r->logprobs.front();
    std::vector<std::pair<int32_t, float>> top;
    if (!r->top.empty()) {
      for (const net::TokenLogprob& t : r->top.front()) top.emplace_back(t.token, t.logprob);
    }
    GenerationEvent ev;
    const bool context_full = s.position() >= info_.n_ctx;
    if (auto reason = accept_token(s.req, *info_.tokenizer, id, logprob, top, context_full, s.text, s.usage, ev)) {
      finish(s, *reason, std::move(ev));
      release(s);
    } else {
      s.next_input = id;
      if (!deliver_event(s.sink, std::move(ev), s.req.id)) {
        finish(s, FinishReason::cancelled, {});
        release(s);
      }
    }
  } else if (auto* re = std::get_if<RequestError>(&e)) {
    auto it = in_flight_.find(re->request_id);
    if (it == in_flight_.end()) return;
    Sequence& s = *slots_[size_t(it->second)];
    finish(s, FinishReason::error, {}, re->text);
    release(s);
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
    std::vector<std::unique_ptr<Sequence>> admitted, dropped;
    bool stopping = false;
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] {
        return state_ != State::serving || !events_.empty() || !cancel_requests_.empty() ||
               (!queue_.empty() && active_ < int(slots_.size()));
      });
      stopping = state_ != State::serving;
      events.swap(events_);
      cancels.swap(cancel_requests_);
      for (uint64_t id : cancels) {
        auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& q) { return q->id == id; });
        if (it != queue_.end()) {
          dropped.push_back(std::move(*it));
          queue_.erase(it);
        }
      }
      if (stopping) {
        for (auto& q : queue_) dropped.push_back(std::move(q));
        queue_.clear();
      } else if (broken_.empty()) {
        for (size_t i = 0; i < slots_.size() && !queue_.empty(); ++i) {
          if (slots_[i]) continue;
          auto seq = std::move(queue_.front());
          queue_.pop_front();
          seq->slot = int(i);
          seq->usage.queue_s = seconds_between(seq->submitted, Clock::now());
          slots_[i] = std::move(seq);
          ++active_;
        }
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
    const auto now = Clock::now();
    for (auto& slot : slots_) {
      if (!slot) continue;
      Sequence& s = *slot;
      if (s.in_flight) {
        if (now - s.sent > step_timeout) {
          const std::string why = fmt::format("no result from the pipeline within {} s",
                                              std::chrono::duration<double>(step_timeout).count());
          finish(s, FinishReason::error, {}, why);
          release(s);
        }
        continue;
      }
      try {
        send_step(s);
      } catch (const std::exception& e) {
        finish(s, FinishReason::error, {}, e.what());
        release(s);
      }
    }
  }
}

}  // namespace baton
