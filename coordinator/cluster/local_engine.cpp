#include "coordinator/cluster/local_engine.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "coordinator/api/metrics.h"
#include "coordinator/cluster/batch_scheduler.h"
#include "coordinator/cluster/slot_drafters.h"
#include "engine/dspark/dspark_device.h"
#include "chat/family.h"
#include "engine/dspark/dspark_weights.h"
#include "engine/text/tokenizer.h"
#include "net/log.h"

namespace baton {

struct LocalEngine::Sequence {
  uint64_t id = 0;
  GenerationRequest req;
  EventSink sink;
  Clock::time_point submitted;
  int slot = -1;
  size_t prefilled = 0;     // prompt tokens already in the KV cache
  int32_t next_input = -1;  // the last sampled token, fed at the next decode step
  uint64_t admitted = 0;    // admission order
  uint64_t last_run = 0;    // the step it last ran in
  bool cancelled = false;
  bool ended = false;    // the final event was sent
  bool kv_lost = false;  // a forward failed: the slot's KV is not what it ran
  std::optional<Sampler> sampler;
  std::optional<GrammarMatcher> grammar;
  TextAssembler text;
  Usage usage;

  Sequence(GenerationRequest r, EventSink s) : req(std::move(r)), sink(std::move(s)), text(req.stop) {}
};

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

uint64_t resident_bytes() {
  // /proc/self/statm: size resident shared ... in pages.
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? uint64_t(resident) * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace

LocalEngine::LocalEngine(LocalEngineConfig config, Metrics* metrics)
    : config_(std::move(config)), metrics_(metrics), file_(GgufFile::open(config_.model_path)), cache_(0, {}) {
  config_.stage.first_layer = 0;
  config_.stage.last_layer = -1;
  config_.stage.embedding = true;
  config_.stage.head = true;
  config_.stage.all_logits = false;
  if (config_.queue_capacity < 0) throw std::invalid_argument("the queue capacity must be >= 0");
  if (config_.prefill_chunk < 0) throw std::invalid_argument("the prefill chunk must be >= 0");
  // A drafter that is named or present must be whole (every tensor by name
  // and shape), so that a broken one fails here and not as poor drafts.
  if (config_.draft.on_gpu && config_.backend != Backend::Cuda) {
    throw std::invalid_argument("--gpu-drafter places the drafter beside a CUDA target: give --backend cuda");
  }
  const std::optional<DsparkPlan> drafter = dspark_plan(file_, config_.stage.draft_path);
  decide_drafting(drafter ? std::optional<DsparkShape>(drafter->shape) : std::nullopt);
  // The dry-run plan checks the architecture and every tensor first, so a bad
  // file fails here, before the server listens.
  LoadOptions staging;  // the plan counts the ring the load will use
  staging.slot_bytes = config_.staging_slot_bytes;
  plan_ = plan_stage_runner(config_.backend, file_, config_.stage, staging);
  // Its weights once, and a context per slot (slot_drafters.h). On CUDA a
  // drafter that --gpu-drafter did not ask for gives way to the model: off
  // where it would not fit under --mem-limit (here) or in the device memory
  // the load leaves (scheduler()).
  if (drafter_) {
    drafter_bytes_ = drafter->weights + drafter->per_context() * uint64_t(config_.stage.n_seq);
    MemoryPlan with = plan_;
    with.add(PlanLine::Drafter, drafter_bytes_, fmt::format("{}; a context per slot", drafter->detail));
    const std::string why =
        drafter_may_give_way() ? dspark_limit_room(config_.backend, plan_, with, config_.mem_limit) : std::string();
    if (!why.empty()) {
      drop_drafter(why);
    } else {
      plan_ = std::move(with);
    }
  }
  if (std::string why = memory_limit_problem(config_.backend, plan_, config_.mem_limit); !why.empty()) {
    throw std::runtime_error(why + " (baton plan shows the lines)");
  }
  info_ = model_info_from_gguf(file_, config_.model_path, config_.model_id, config_.stage.n_ctx);
  const std::unique_ptr<Arch> arch = Arch::from_gguf(file_);
  n_layer_ = arch->dims().n_layer;
  // The stage plans a batch of at most a context per sequence
  // (Stage::resolve); a step budget beyond it would build forwards the stage
  // refuses. One prompt's chunk stays within the context.
  config_.stage.max_batch = std::min(config_.stage.max_batch, info_.n_ctx * config_.stage.n_seq);
  cache_ = PrefixCache(config_.stage.n_seq, {config_.prefix_cache, arch->kv_truncatable()});
  if (config_.prefill_chunk == 0) config_.prefill_chunk = std::min(config_.stage.max_batch, info_.n_ctx);
  config_.prefill_chunk = std::min({config_.prefill_chunk, config_.stage.max_batch, info_.n_ctx});
  slots_.resize(size_t(config_.stage.n_seq));
  thread_ = std::thread([this] { scheduler(); });
}

LocalEngine::~LocalEngine() { shutdown(); }

void LocalEngine::decide_drafting(const std::optional<DsparkShape>& drafter) {
  if (!drafter && !config_.draft_source) return;
  std::string state;
  if (config_.draft.off) {
    state = "off (--no-draft)";
  } else if (config_.stage.max_batch < 2) {
    state = "off: a verify forward needs --batch 2 or more";
  } else {
    drafting_ = true;
    // The stage plans verify forwards, and the rows a DSpark drafter reads.
    config_.draft.max = int(std::min<int64_t>(config_.draft.max, config_.stage.max_batch - 1));
    config_.stage.verify_rows = std::max<int64_t>(config_.stage.verify_rows, config_.draft.max + 1);
    if (!config_.draft_source) {
      drafter_ = drafter;
      config_.stage.capture_layers = drafter->target_layer_ids;
    }
    state = fmt::format("on while one request decodes alone{} ({} guesses per verify at most, confidence "
                        "threshold {})",
                        config_.draft.always ? "" : " and drafting keeps up with plain steps", config_.draft.max,
                        config_.draft.threshold);
  }
  const std::string what = config_.draft_source ? std::string("test draft source")
                           : drafter->describe() + " (" +
                                 (config_.stage.draft_path.empty() ? "in the model file" : config_.stage.draft_path) +
                                 "): checked;";
  net::log(net::LogLevel::info, fmt::format("{} drafting {}", what, state));
}

bool LocalEngine::drafter_may_give_way() const {
  return drafter_ && config_.backend == Backend::Cuda && !config_.draft.on_gpu;
}

void LocalEngine::drop_drafter(const std::string& why) {
  drafting_ = false;
  drafter_.reset();
  net::log(net::LogLevel::info, fmt::format("drafting off: {} (--gpu-drafter loads it anyway)", why));
}

void LocalEngine::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (state_ != State::failed) state_ = State::stopped;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LocalEngine::wait_loaded() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return state_ != State::loading; });
  if (state_ == State::failed) throw std::runtime_error(load_error_);
  if (state_ == State::stopped) throw UnavailableError("the engine was shut down");
}

uint64_t LocalEngine::submit(GenerationRequest request, EventSink sink) {
  validate_request(request, info_);
  const int64_t n_prompt = int64_t(request.prompt.size());
  auto seq = std::make_unique<Sequence>(std::move(request), std::move(sink));
  seq->submitted = Clock::now();
  seq->usage.prompt_tokens = n_prompt;

  std::lock_guard lock(mu_);
  if (state_ == State::loading) throw UnavailableError("the model is still loading");
  if (state_ == State::failed) throw UnavailableError("the model failed to load: " + load_error_);
  if (state_ == State::stopped) throw UnavailableError("the server is shutting down");
  // Slots plus queue, counted together: whether a request waits or runs
  // depends only on how many are in the system, not on scheduler timing.
  check_admission(active_, int(queue_.size()), int(slots_.size()), config_.queue_capacity);
  seq->id = next_id_++;
  const uint64_t id = seq->id;
  queue_.push_back(std::move(seq));
  cv_.notify_all();
  return id;
}

void LocalEngine::cancel(uint64_t id) {
  {
    std::lock_guard lock(mu_);
    if (state_ != State::loaded) return;
    cancel_requests_.insert(id);
  }
  cv_.notify_all();
}

ServiceHealth LocalEngine::health() const {
  ServiceHealth h;
  StageHealth s;
  s.node = "local";
  s.first_layer = 0;
  s.embedding = s.head = true;
  for (const auto& line : plan_.lines()) s.memory_planned.emplace_back(line.name(), line.bytes);
  s.bytes_total = plan_.bytes(PlanLine::Weights);
  s.rss_bytes = resident_bytes();
  std::lock_guard lock(mu_);
  s.last_layer = n_layer_ - 1;
  switch (state_) {
    case State::loading:
      h.status = "loading";
      s.state = "loading";
      s.bytes_loaded = std::min(load_done_.load(), s.bytes_total);
      s.progress = s.bytes_total > 0 ? double(s.bytes_loaded) / double(s.bytes_total) : 0.0;
      break;
    case State::loaded:
    case State::stopped:
      h.status = state_ == State::loaded ? "ok" : "stopping";
      s.state = "loaded";
      s.progress = 1;
      s.bytes_loaded = s.bytes_total;
      // Every planned line is one allocation of exactly its size (rule 2).
      s.memory_used = plan_.total();
      break;
    case State::failed:
      h.status = "error";
      s.state = "failed";
      s.error = load_error_;
      break;
  }
  h.stages.push_back(std::move(s));
  h.slots_total = int(slots_.size());
  h.slots_busy = active_;
  h.queue_depth = int(queue_.size());
  h.queue_capacity = config_.queue_capacity;
  return h;
}

void LocalEngine::emit(Sequence& s, GenerationEvent&& ev) {
  if (!deliver_event(s.sink, std::move(ev), s.req.id)) s.cancelled = true;
}

void LocalEngine::finish(Sequence& s, FinishReason reason, GenerationEvent ev, const std::string& error) {
  close_event(ev, reason, error, s.text, s.usage);
  s.ended = true;
  if (metrics_) metrics_->generation_finished(reason, s.usage);
  emit(s, std::move(ev));
}

namespace {

// Greedy without bias, logprobs or penalties: the stage's own argmax is the sample.
bool greedy_only(const GenerationRequest& r) {
  return r.sampling.temperature <= 0 && r.logit_bias.empty() && r.top_logprobs < 0 && !r.grammar &&
         !r.sampling.penalizes();
}

}  // namespace

int32_t LocalEngine::sample(Sequence& s, std::span<const float> logits, int32_t greedy_id, int64_t kv_length,
                            int32_t guess) {
  std::span<const float> dist = logits;
  if (!logits.empty() && (!s.req.logit_bias.empty() || s.grammar)) {
    biased_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : s.req.logit_bias) biased_[size_t(id)] += bias;
    if (s.grammar) {
      if (!grammar_allowed_tokens(*s.grammar, s.req, info_, allowed_)) {
        finish(s, FinishReason::error, {}, "the grammar admits no token of the vocabulary here");
        return -1;
      }
      mask_logits(allowed_, biased_);
    }
    dist = biased_;
  }
  const int32_t id = logits.empty() ? greedy_id : s.sampler->sample(dist);
  if (s.usage.completion_tokens == 0) s.usage.time_to_first_token_s = seconds_between(s.submitted, Clock::now());
  if (guess >= 0 && id == guess) ++s.usage.draft_n_accepted;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  if (s.req.top_logprobs >= 0 && !logits.empty()) {
    std::vector<TokenLogprobEntry> entries;
    logprob = token_logprobs(dist, id, s.req.top_logprobs, &entries);
    for (const auto& e : entries) {
      if (std::isfinite(e.logprob)) top.emplace_back(e.id, e.logprob);  // a grammar's masked tokens are not alternatives
    }
  }
  GenerationEvent ev;
  const bool context_full = kv_length >= stage_->n_ctx();
  if (auto reason = accept_token(s.req, *info_.tokenizer, id, logprob, top, context_full, s.text, s.usage, ev,
                                 s.grammar ? &*s.grammar : nullptr)) {
    finish(s, *reason, std::move(ev));
  } else {
    s.next_input = id;
    emit(s, std::move(ev));
  }
  return id;
}

LocalEngine::Sequence* LocalEngine::lone_decoder(std::span<const SchedSeq> views) {
  if (!drafters_ || views.size() != 1 || views[0].prompt_left > 0) return nullptr;
  {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) return nullptr;
  }
  return slots_[size_t(views[0].slot)].get();
}

std::span<const float> LocalEngine::forward_for_drafters(std::span<const BatchChunk> chunks,
                                                        std::span<const int32_t> tokens) {
  // The CPU runner runs a batch chunk by chunk (StageRunner::forward_batch),
  // so running the chunks here one by one, each with its captured rows,
  // costs the batch nothing. The drafters see every token their slot's KV
  // gains, so that each can draft when its sequence is left alone.
  const size_t width = size_t(stage_->n_vocab());
  batch_logits_.clear();
  ForwardOptions capture;
  capture.capture = bool(drafter_);
  size_t at = 0;
  for (const BatchChunk& c : chunks) {
    const std::span<const int32_t> ids = tokens.subspan(at, size_t(c.n_tokens));
    at += ids.size();
    const int64_t position = stage_->position(c.seq);
    const ForwardRows rows = stage_->forward_rows(c.seq, ids, capture);
    drafters_->committed(c.seq, ids, position, rows.hidden);
    if (c.output) batch_logits_.insert(batch_logits_.end(), rows.out.end() - std::ptrdiff_t(width), rows.out.end());
  }
  return batch_logits_;
}

void LocalEngine::draft_step(Sequence& s) {
  const int64_t n = stage_->position(s.slot);
  // A verify of L guesses decides up to L + 1 tokens: no more than the
  // request still wants, and within the context.
  const int64_t limit = std::min<int64_t>(
      {config_.draft.max, stage_->n_ctx() - n - 1, s.req.max_tokens - s.usage.completion_tokens - 1});
  Draft d;
  // The step runs from the draft round to the verify's last token: what the
  // pacer sets against plain steps, and the request's decode time.
  const auto t0 = Clock::now();
  if (limit > 0 && (config_.draft.always || pacer_.draft_now())) {
    d = drafters_->propose(s.slot, s.next_input, n, int(limit));
  }
  if (int64_t(d.tokens.size()) > limit) d.tokens.resize(size_t(std::max<int64_t>(limit, 0)));
  // A guess the grammar forbids could never be sampled: the draft ends before it.
  if (s.grammar) d.tokens.resize(grammar_draft_prefix(*s.grammar, s.req, info_, d.tokens, allowed_));
  const size_t n_guesses = d.tokens.size();
  verify_tokens_.assign(1, s.next_input);
  verify_tokens_.insert(verify_tokens_.end(), d.tokens.begin(), d.tokens.end());
  ForwardOptions verify;
  verify.capture = bool(drafter_);
  verify.all_logits = verify.checkpoint = n_guesses > 0;  // none: a plain decode step
  ForwardRows res;
  const auto t_forward = Clock::now();
  try {
    res = stage_->forward_rows(s.slot, verify_tokens_, verify);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton serve: request %s failed: %s\n", s.req.id.c_str(), e.what());
    s.kv_lost = true;
    finish(s, FinishReason::error, {}, e.what());
    return;
  }
  const double forward_s = seconds_between(t_forward, Clock::now());  // the stage's latency, without the round
  // Row i is what a plain step after the i-th token would see (the CPU
  // forward does not depend on the batching), so each row is sampled as that
  // step would sample it: logit bias, grammar, penalties, stop strings,
  // max_tokens and the same random draws. A guess is kept when the token
  // sampled from its row is the guess; the first other token ends the block.
  // Greedy and seeded output therefore equal plain decoding's.
  // The usage counts each guess before a token can end the request.
  const size_t width = size_t(stage_->n_vocab());
  s.usage.draft_n += int64_t(n_guesses);
  size_t used = 0;  // rows whose token was sampled: their inputs stay in the KV
  while (used <= n_guesses) {
    const int32_t guess = used < n_guesses ? d.tokens[used] : -1;
    const int32_t id = sample(s, res.out.subspan(used * width, width), -1, n + int64_t(used) + 1, guess);
    ++used;
    if (id != guess || s.ended || s.cancelled) break;
  }
  const double dt = seconds_between(t0, Clock::now());
  s.usage.decode_s += dt;
  if (config_.draft.always) {
    // --draft-always: no pacing.
  } else if (n_guesses > 0) {
    const int64_t before = pacer_.pauses();
    pacer_.drafted(int64_t(used), dt);
    if (pacer_.pauses() > before) {
      if (metrics_) metrics_->draft_paused();
      // The first pause at info (a drafter that does not pay here), later ones at debug.
      net::log(pacer_.pauses() == 1 ? net::LogLevel::info : net::LogLevel::debug,
               fmt::format("drafting paused for {} steps: drafting steps gave {:.1f} tokens/s, plain steps {:.1f}",
                           pacer_.last_pause(), pacer_.judged_tokens_per_s(), 1.0 / pacer_.plain_seconds()));
    }
  } else {
    pacer_.plain(dt);
  }
  // The sequence keeps the rows that fed the tokens handed out, as plain
  // decoding leaves it; the drafter and the prefix cache see the same rows.
  const std::span<const int32_t> fed(verify_tokens_.data(), used);
  const size_t hidden_width = res.hidden.size() / verify_tokens_.size();  // 0 without capture
  drafters_->committed(s.slot, fed, n, res.hidden.subspan(0, used * hidden_width));
  stage_->truncate_seq(s.slot, n + int64_t(used));
  cache_.append(s.slot, fed);
  if (metrics_) metrics_->stage_forward(0, false, int64_t(used), forward_s);
}

bool LocalEngine::step() {
  std::vector<SchedSeq> views;
  for (const auto& slot : slots_) {
    if (!slot || slot->ended || slot->cancelled) continue;
    const Sequence& s = *slot;
    const int64_t left = int64_t(s.req.prompt.size() - s.prefilled);
    views.push_back({s.slot, left, true, s.last_run, s.admitted});
  }
  const std::vector<SchedChunk> plan = plan_batch(views, config_.stage.max_batch, config_.prefill_chunk);
  if (plan.empty()) return false;
  ++steps_;
  if (config_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(config_.step_delay_ms));
  // One sequence alone drafts. With others running or waiting the step stays
  // one batch: a verify of k rows costs what k batch rows cost, and those
  // rows serve the other requests better (docs/DSPARK.md).
  if (Sequence* lone = lone_decoder(views)) {
    lone->last_run = steps_;
    draft_step(*lone);
    return true;
  }
  std::vector<BatchChunk> chunks;
  std::vector<int32_t> tokens;
  bool any_prefill = false;
  for (const SchedChunk& c : plan) {
    Sequence& s = *slots_[size_t(c.slot)];
    s.last_run = steps_;
    if (c.prefill) {
      const auto at = s.req.prompt.begin() + std::ptrdiff_t(s.prefilled);
      tokens.insert(tokens.end(), at, at + std::ptrdiff_t(c.n_tokens));
      any_prefill = true;
    } else {
      tokens.push_back(s.next_input);
    }
    const bool last_prompt_chunk = !c.prefill || s.prefilled + size_t(c.n_tokens) == s.req.prompt.size();
    chunks.push_back({c.slot, c.n_tokens, last_prompt_chunk});
  }
  // All greedy: only the ids come back from the stage (no logits rows). With
  // the drafter, a forward captures its rows for it: every forward on the
  // CPU, which runs a batch chunk by chunk anyway; elsewhere only one
  // sequence's, so that a batch stays one pass (the slots it leaves out lose
  // step until they start over: slot_drafters.h).
  const bool capture = drafters_ && (config_.backend == Backend::Cpu || chunks.size() == 1);
  bool greedy = !capture;
  for (const BatchChunk& c : chunks) greedy = greedy && (!c.output || greedy_only(slots_[size_t(c.seq)]->req));
  const auto t0 = Clock::now();
  std::span<const float> logits;
  std::span<const int32_t> ids;
  try {
    if (capture) {
      logits = forward_for_drafters(chunks, tokens);
    } else if (greedy) {
      ids = stage_->forward_batch_greedy(chunks, tokens);
    } else {
      logits = stage_->forward_batch(chunks, tokens);
    }
  } catch (const std::exception& e) {
    // The batch's sequences fail; their slots are reset by the caller.
    for (const BatchChunk& c : chunks) {
      Sequence& s = *slots_[size_t(c.seq)];
      std::fprintf(stderr, "baton serve: request %s failed: %s\n", s.req.id.c_str(), e.what());
      s.kv_lost = true;
      finish(s, FinishReason::error, {}, e.what());
    }
    return true;
  }
  // The slots now hold these tokens' KV.
  for (size_t i = 0, at = 0; i < chunks.size(); at += size_t(chunks[i].n_tokens), ++i) {
    cache_.append(chunks[i].seq, std::span<const int32_t>(tokens).subspan(at, size_t(chunks[i].n_tokens)));
  }
  const double dt = seconds_between(t0, Clock::now());
  if (metrics_) metrics_->stage_forward(0, any_prefill, int64_t(tokens.size()), dt);
  const size_t width = size_t(stage_->n_vocab());
  size_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Sequence& s = *slots_[size_t(chunks[i].seq)];
    if (plan[i].prefill) {
      s.usage.prefill_s += dt;
      s.prefilled += size_t(plan[i].n_tokens);
    } else {
      s.usage.decode_s += dt;
    }
    if (!chunks[i].output) continue;
    const int64_t kv_length = stage_->position(s.slot);
    if (greedy) {
      sample(s, {}, ids[row], kv_length);
    } else {
      sample(s, logits.subspan(row * width, width), -1, kv_length);
    }
    ++row;
  }
  return true;
}

void LocalEngine::scheduler() {
  try {
    auto t0 = Clock::now();
    LoadOptions load;
    load.slot_bytes = config_.staging_slot_bytes;
    load.progress = [this](const LoadProgress& p) {
      load_done_.store(p.done);
      if (config_.on_load_progress) config_.on_load_progress(p);
    };
    auto stage = make_stage_runner(config_.backend, file_, config_.stage, load);
    if (drafter_may_give_way()) {
      if (std::string why = dspark_device_room(*stage, drafter_bytes_); !why.empty()) drop_drafter(why);
    }
    if (drafting_) {
      SlotDrafters::Factory make = config_.draft_source;
      if (!make) {
        const std::string& path = config_.stage.draft_path;
        const std::optional<GgufFile> sidecar =
            path.empty() ? std::nullopt : std::optional<GgufFile>(GgufFile::open(path));
        const GgufFile& df = sidecar ? *sidecar : file_;
        if (const Model* host = stage->host_model()) {
          make = SlotDrafters::dspark(df, *drafter_, *host, config_.stage.n_threads, config_.draft.threshold);
        } else {
          LoadOptions drafter_load = load;
          drafter_load.progress = nullptr;  // the model's load is reported; this one is not part of it
          make = SlotDrafters::dspark_device(df, *drafter_, *stage, drafter_load, config_.draft.threshold);
        }
      }
      drafters_ = std::make_unique<SlotDrafters>(config_.stage.n_seq, std::move(make));
    }
    std::lock_guard lock(mu_);
    stage_ = std::move(stage);
    load_seconds_ = seconds_between(t0, Clock::now());
    if (state_ == State::loading) state_ = State::loaded;
  } catch (const std::exception& e) {
    std::lock_guard lock(mu_);
    state_ = State::failed;
    load_error_ = e.what();
  }
  cv_.notify_all();

  std::vector<std::unique_ptr<Sequence>> dropped;  // cancelled while queued
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return state_ != State::loaded || active_ > 0 || !queue_.empty() || !cancel_requests_.empty();
      });
      stopping = state_ != State::loaded;
      for (uint64_t id : cancel_requests_) {
        if (drop_queued(queue_, id, dropped)) continue;
        for (auto& slot : slots_) {
          if (slot && slot->id == id) slot->cancelled = true;
        }
      }
      cancel_requests_.clear();
      if (stopping) {
        for (auto& q : queue_) dropped.push_back(std::move(q));
        queue_.clear();
      } else {
        admit_queued(queue_, slots_, [&](Sequence& seq, const std::vector<bool>& free) {
          PrefixCache::Choice c = cache_.choose(seq.req.prompt, free);
          // The slot keeps the reused prefix's KV and forgets the rest.
          try {
            stage_->truncate(c.slot, c.reuse);
          } catch (const std::exception& e) {
            // The stage refused the cut (it and the cache disagree): the
            // request computes its whole prompt instead.
            std::fprintf(stderr, "baton serve: prefix cache: %s\n", e.what());
            stage_->reset(c.slot);
            c.reuse = 0;
          }
          cache_.take(c.slot, c.reuse);
          if (drafters_) drafters_->cut(c.slot, c.reuse);
          seq.prefilled = size_t(c.reuse);
          seq.usage.cached_tokens = c.reuse;
          return c.slot;
        }, [&](Sequence& seq) {
          seq.usage.queue_s = seconds_between(seq.submitted, Clock::now());
          seq.sampler.emplace(make_sampler(seq.req, info_));
          if (seq.req.grammar) seq.grammar.emplace(seq.req.grammar);
          seq.admitted = ++admitted_;
          ++active_;
        });
      }
    }
    for (auto& q : dropped) {
      q->usage.queue_s = seconds_between(q->submitted, Clock::now());
      finish(*q, FinishReason::cancelled, {});
    }
    dropped.clear();

    // Cancelled (or stopping) sequences end first; then one batch of the
    // others, and the slots of those that ended are freed.
    for (auto& slot : slots_) {
      if (slot && (stopping || slot->cancelled)) finish(*slot, FinishReason::cancelled, {});
    }
    if (!stopping) step();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i] || !(slots_[i]->ended || slots_[i]->cancelled)) continue;
      if (!slots_[i]->ended) finish(*slots_[i], FinishReason::cancelled, {});
      // A sequence's steps ran whole (this thread runs them), so its slot
      // holds the KV of exactly the tokens the cache appended.
      if (cache_.policy().enabled && !slots_[i]->kv_lost) {
        cache_.release(int(i));
      } else {
        stage_->reset(int(i));
        cache_.forget(int(i));
        if (drafters_) drafters_->cut(int(i), 0);
      }
      slots_[i].reset();
      std::lock_guard lock(mu_);
      --active_;
    }
    if (stopping) break;
  }
}

}  // namespace baton
