// The worker: one io thread runs the links (coordinator, next stage, upstream
// stages) and answers heartbeats; the calling thread loads the stage and runs
// every FORWARD in arrival order, so a long forward never starves the links.
// The links between stages are links.cpp's.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/runtime/backend.h"
#include "engine/sampling/grammar.h"
#include "engine/model/loader.h"
#include "engine/plan/node_plan.h"
#include "engine/model/part_info.h"
#include "engine/tp/slice.h"
#include "net/address.h"
#include "net/log.h"
#include "worker/worker_impl.h"
#include "engine/model/layer_range_text.h"

namespace baton {
namespace worker_impl {

using namespace std::chrono_literals;

namespace {

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

}  // namespace

net::ModelIdentity model_identity(const GgufFile& f) {
  net::ModelIdentity id;
  const std::optional<PartInfo> info = read_part_info(f);
  if (!info) {
    id.tensor_table_hash = f.tensor_table_hash();
    return id;
  }
  id.tensor_table_hash = info->source_hash;
  net::ModelPart part;
  part.tensor_table_hash = f.tensor_table_hash();
  part.layer_first = info->range.first;
  part.layer_last = info->range.last;
  part.has_embedding = info->has_embedding;
  part.has_output = info->has_output;
  // A rank file of `baton split --tp`. A rank count beyond what a group can
  // have reads as no rank file here, and the stage's checks refuse it.
  if (f.has(tp_keys::kSize)) {
    const int64_t size = f.get_int(tp_keys::kSize), rank = f.get_int(tp_keys::kRank, -1);
    if (size >= 2 && size <= int64_t(net::kMaxGroupRanks) && rank >= 0 && rank < size) {
      part.tp_size = uint32_t(size);
      part.tp_rank = uint32_t(rank);
    }
  }
  id.parts.push_back(part);
  return id;
}

Worker::Worker(WorkerOptions opt) : opt_(std::move(opt)) {
  if (opt_.name.empty()) opt_.name = "worker-" + std::to_string(getpid());
}

Worker::~Worker() {
  // Connections first (their destructors detach the handlers that capture
  // this), then the io loop.
  {
    std::lock_guard lock(mu_);
    upstream_.clear();
    inbox_.clear();
    next_nccl_.reset();
  }
  group_links_.clear();
  next_.reset();
  coord_.reset();
  if (listener_) listener_->close();
  listener_.reset();
  guard_.reset();
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
  // A dial that ended during the above left its connection here.
  std::lock_guard lock(mu_);
  inbox_.clear();
}

int Worker::run() {
  net::disable_nvls();  // before anything can start NCCL
  secret_ = net::load_secret_file(opt_.secret_file);
  if (!opt_.model.empty()) file_.emplace(GgufFile::open(opt_.model));
  io_thread_ = std::thread([this] { io_.run(); });

  // A coordinator name that does not resolve is one line now, not a link
  // that fails after its retries.
  boost::asio::ip::address coordinator_ip;
  try {
    coordinator_ip = net::resolve_host(net::split_host_port(opt_.coordinator).first);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot connect to the coordinator at " + opt_.coordinator + ": " + e.what());
  }
  auto [lhost, lport] = net::split_host_port(opt_.listen);
  listener_ = std::make_unique<net::Listener>(
      io_, lhost, lport, net::LocalIdentity{net::Role::worker, opt_.name}, secret_, link_config(),
      [this](std::shared_ptr<net::Connection> c) { accept_upstream(std::move(c)); });
  const std::string bound_address = net::join_host_port(lhost, listener_->port());
  const std::string listen_address = opt_.advertise.empty() ? bound_address : opt_.advertise;
  choose_mesh_address(lhost, net::split_host_port(listen_address).first);
  // A stock /etc/hosts maps the machine's own name to 127.0.1.1: a stage on
  // another machine (where the coordinator is) could not dial that.
  if (const auto ip = net::resolve_host(lhost); ip.is_loopback() && !coordinator_ip.is_loopback()) {
    net::log(net::LogLevel::warn, opt_.name + ": --listen " + opt_.listen + " is the loopback address " +
                                      ip.to_string() + " while the coordinator is at " + opt_.coordinator +
                                      ": a stage on another machine cannot reach this one");
  }

  net::Hello hello;
  hello.role = net::Role::worker;
  hello.node_name = opt_.name;
  hello.caps.backend = opt_.backend == Backend::Cuda ? net::Backend::cuda : net::Backend::cpu;
  hello.caps.device_name = backend_name(opt_.backend);
  hello.caps.memory_total = opt_.mem_limit ? opt_.mem_limit : physical_memory();
  hello.caps.n_threads = uint32_t(opt_.n_threads);
  fill_link_caps(hello.caps);
  if (file_) hello.model = model_identity(*file_);
  hello.listen_address = listen_address;
  hello.mesh_address = mesh_address_;
  {
    // While it waits for the coordinator, run_worker says so at most every
    // 5 s; the net layer's line about each failed dial would say it every
    // few hundred milliseconds, so it is kept for debug logs only.
    const net::LogLevel level = net::log_level();
    const bool hush = !opt_.exit_with_coordinator && level != net::LogLevel::debug;
    if (hush) net::set_log_level(net::LogLevel::error);
    try {
      coord_ = connect_blocking(io_, opt_.coordinator, hello, secret_, "the coordinator");
    } catch (...) {
      if (hush) net::set_log_level(level);
      throw;
    }
    if (hush) net::set_log_level(level);
  }
  coord_->start([this](net::Message&& m) { enqueue({std::move(m), nullptr, 0}); },
                [this](std::error_code, const std::string& reason) {
                  stop(1, "the link to the coordinator closed: " + reason);
                });
  net::log(net::LogLevel::info, opt_.name + ": registered with the coordinator at " + opt_.coordinator +
                                    ", listening on " + bound_address +
                                    (opt_.advertise.empty() ? "" : ", advertised as " + opt_.advertise));
  loop();
  return exit_code_;
}

void Worker::enqueue(Inbound&& m) {
  {
    std::lock_guard lock(mu_);
    inbox_.push_back(std::move(m));
  }
  cv_.notify_all();
}

void Worker::stop(int code, const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    // The coordinator sends SHUTDOWN and then closes. When the loop had
    // already taken SHUTDOWN from the inbox, the close can stop the worker
    // first; the shutdown still says how it ends (an orderly 0, no warning).
    const bool shutdown_after_close = code == 0 && exit_code_ == 1;
    if (stopped_ && !shutdown_after_close) return;
    stopped_ = true;
    exit_code_ = code;
    stop_reason_ = reason;
  }
  cv_.notify_all();
}

void Worker::loop() {
  for (;;) {
    Inbound in;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopped_ || !inbox_.empty(); });
      if (stopped_) {
        // The coordinator sends SHUTDOWN and then closes: when the close
        // overtook it here, it is still an orderly stop.
        for (const Inbound& q : inbox_) {
          if (auto* s = std::get_if<net::Shutdown>(&q.msg)) {
            exit_code_ = 0;
            stop_reason_ = "shutdown: " + net::printable(s->reason);
          }
        }
        break;
      }
      in = std::move(inbox_.front());
      inbox_.pop_front();
    }
    try {
      handle(in);
    } catch (const std::exception& e) {
      uint64_t rid = 0;
      if (auto* f = std::get_if<net::Forward>(&in.msg)) rid = f->request_id;
      send_error(net::WireError::internal, rid, e.what());
    }
  }
  // A worker that registers again says so itself (run_worker).
  if (exit_code_ != 0 && (opt_.exit_with_coordinator || exit_code_ != 1)) {
    net::log(net::LogLevel::warn, opt_.name + ": stopping: " + stop_reason_);
  }
  if (next_ && tokens_sent_ > 0) {
    // What crossed the link to the next stage (bench/cluster_bench.py reads it).
    const net::LinkStats st = next_->stats();
    net::log(net::LogLevel::info, opt_.name + ": link to the next stage: " + std::to_string(tokens_sent_) +
                                      " tokens in " + std::to_string(st.frames_out) + " frames, " +
                                      std::to_string(st.bytes_out) + " bytes, " +
                                      std::to_string(st.bytes_out / tokens_sent_) + " bytes per token" +
                                      (nccl_bytes_ ? ", and " + std::to_string(nccl_bytes_) + " bytes over NCCL" : ""));
  }
  if (coord_) coord_->close_after_flush("worker stopping");
  if (next_) next_->close_after_flush("worker stopping");
}

void Worker::send_error(net::WireError code, uint64_t request_id, const std::string& text) {
  net::Error e;
  e.code = uint32_t(code);
  e.request_id = request_id;
  e.text = (opt_.name + ": " + text).substr(0, net::kMaxTextBytes);
  net::log(net::LogLevel::error, e.text);
  if (coord_) coord_->send(e);
}

void Worker::handle(Inbound& in) {
  if (in.next != Inbound::Next::none) return on_next_event(in);
  net::Message& m = in.msg;
  if (auto* a = std::get_if<net::Assign>(&m)) return on_assign(*a);
  if (auto* r = std::get_if<net::Route>(&m)) return on_route(*r);
  if (auto* f = std::get_if<net::Forward>(&m)) return on_forward(*f, in.from.get());
  if (auto* ls = std::get_if<net::LinkSetup>(&m)) {
    if (in.from) on_link_setup(*ls, *in.from);
    return;
  }
  if (auto* ack = std::get_if<net::LinkAck>(&m)) {
    if (in.next_gen == next_gen_) on_link_ack(*ack);
    return;
  }
  if (auto* fs = std::get_if<net::FreeSeq>(&m)) {
    if (stage_ && int(fs->seq) < stage_->config().n_seq) stage_->reset(int(fs->seq));
    samplers_.erase(fs->seq);
    if (assign_.tp_rank == 0) pass_to_group(*fs);
    // FREE_SEQ travels down the pipeline like FORWARD, on the same links,
    // so it can never overtake (or be overtaken by) the FORWARDs of the
    // sequence that reuses the slot next.
    if (next_) next_->send(*fs);
    return;
  }
  if (std::holds_alternative<net::Cancel>(m)) return;  // forwards are run in order; nothing is queued long
  if (auto* s = std::get_if<net::Shutdown>(&m)) return stop(0, "shutdown: " + net::printable(s->reason));
  if (auto* e = std::get_if<net::Error>(&m)) {
    return stop(1, "the coordinator sent an error: " + net::printable(e->text));
  }
}

void Worker::on_assign(const net::Assign& a) {
  if (stage_ && regroup(a)) return;
  if (stage_) return send_error(net::WireError::unexpected_message, 0, "already assigned a stage");
  const auto t0 = std::chrono::steady_clock::now();
  if (!file_) {
    if (a.model_path.empty()) return fail(net::WireError::load_failed, "no model: pass --model or a model_path");
    file_.emplace(GgufFile::open(a.model_path));
  }
  const net::ModelIdentity have = model_identity(*file_);
  const bool is_part = !have.parts.empty();
  if (is_part && (have.parts[0].layer_first != a.layer_first || have.parts[0].layer_last != a.layer_last ||
                  have.parts[0].has_embedding != a.has_embedding || have.parts[0].has_output != a.has_output)) {
    return fail(net::WireError::model_mismatch, "the split part holds another slice than the assigned stage");
  }
  if (a.model_hash != 0 && file_->tensor_table_hash() != a.model_hash && have.tensor_table_hash != a.model_hash) {
    return fail(net::WireError::model_mismatch, "the model file's tensor table does not match the assignment");
  }
  if (!check_group_file(a)) return;
  StageConfig sc;
  sc.first_layer = a.layer_first;
  sc.last_layer = a.layer_last;
  sc.embedding = a.has_embedding;
  sc.head = a.has_output;
  sc.n_ctx = a.n_ctx;
  sc.n_seq = int(a.n_seq);
  sc.max_batch = std::max<int64_t>({1, a.micro_batch, a.prefill_chunk});
  sc.n_threads = opt_.n_threads;
  sc.tp = a.tp_size > 1 ? &group_comm_ : nullptr;
  // LOAD_PROGRESS at most every 250 ms, and at the end.
  LoadOptions load;
  load.slot_bytes = opt_.staging_slot_bytes;
  auto last = std::chrono::steady_clock::now() - 1s;
  load.progress = [this, &last](const LoadProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.done < p.total && now - last < 250ms) return;
    last = now;
    coord_->send(net::LoadProgress{p.done, p.total});
  };
  // --mem-limit caps the memory the stage's plan lives in: the device's
  // lines for CUDA (host staging is not device memory), all of it on the CPU.
  const MemoryPlan plan = plan_stage_runner(opt_.backend, *file_, sc, load);
  if (std::string why = memory_limit_problem(opt_.backend, plan, opt_.mem_limit); !why.empty()) {
    return fail(net::WireError::out_of_memory, why);
  }
  stage_ = make_stage_runner(opt_.backend, *file_, sc, load);
  assign_ = a;
  if (!form_group(a)) return;
  connect_next(a.next_peer, a.next_link);
  const net::Ready r = ready_message(t0);
  // What the stage loaded and with which staging ring, at info level (run
  // keeps its workers to warnings unless -v; serve and worker show it).
  // Before READY, so that it is written when the coordinator says it is
  // ready. (Not "baton worker: ...", the prefix of the line a failing worker
  // dies with.)
  if (net::log_enabled(net::LogLevel::info)) {
    std::fprintf(stderr, "baton worker %s: stage %u, layers %s loaded in %.2f s (staging %d x %llu MiB)\n",
                 opt_.name.c_str(), unsigned(a.stage_index),
                 layer_range_text(int(a.layer_first), int(a.layer_last)).c_str(), r.load_seconds,
                 load.slots, static_cast<unsigned long long>(load.slot_bytes >> 20));
  }
  coord_->send(r);
}

net::Ready Worker::ready_message(std::chrono::steady_clock::time_point since) const {
  net::Ready r;
  const MemoryPlan& p = stage_->memory_plan();
  r.weights_bytes = p.bytes(PlanLine::Weights);
  r.kv_bytes = p.bytes(PlanLine::KvCache);
  r.workspace_bytes = p.bytes(PlanLine::Workspace);
  r.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  r.boundary_width = assign_.has_output ? 0 : uint32_t(stage_->arch().boundary_elems_per_token());
  return r;
}

void Worker::fail(net::WireError code, const std::string& text) {
  send_error(code, 0, text);
  stop(2, text);
}

void Worker::on_forward(const net::Forward& f, Upstream* from) {
  std::vector<float> rows;  // activations, copied out of the byte buffer for alignment
  bool rows_on_device = false;
  if (f.rows_on_link && !receive_rows(f, from, rows, &rows_on_device)) return;
  if (!stage_) return send_error(net::WireError::unexpected_message, f.request_id, "FORWARD before ASSIGN");
  if (opt_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt_.step_delay_ms));
  const int64_t in_width = stage_->arch().boundary_elems_per_token();
  if (assign_.has_embedding != !f.tokens.empty() ||
      (!assign_.has_embedding && int64_t(f.row_width) != in_width)) {
    return send_error(net::WireError::bad_request, f.request_id,
                      "FORWARD carries the wrong input for this stage (token ids vs activations, or row width)");
  }
  if (!assign_.has_embedding && !f.rows_on_link) {
    rows.resize(f.activations.size() / sizeof(float));
    std::memcpy(rows.data(), f.activations.data(), rows.size() * sizeof(float));
  }
  // The micro-batch runs as one batched forward (engine/runtime/batch.h): every
  // chunk continues its sequence, and a chunk that begins a sequence keeps
  // the slot's first start_pos positions (the prefix cache, v5) and drops
  // the rest.
  std::vector<BatchChunk> batch;
  batch.reserve(f.chunks.size());
  for (const net::SeqChunk& c : f.chunks) {
    const int seq = int(c.seq);
    if (seq >= stage_->config().n_seq) {
      return send_error(net::WireError::bad_request, f.request_id, "sequence " + std::to_string(seq) + " out of range");
    }
    if (c.begins || c.start_pos == 0) {
      if (int64_t(c.start_pos) <= stage_->position(seq)) {
        try {
          stage_->truncate(seq, c.start_pos);
        } catch (const std::exception& e) {
          return send_error(net::WireError::bad_request, f.request_id, e.what());
        }
      }
      samplers_.erase(c.seq);
    }
    if (stage_->position(seq) != int64_t(c.start_pos) || int64_t(c.start_pos) + c.n_tokens > stage_->n_ctx()) {
      return send_error(net::WireError::bad_request, f.request_id,
                        "sequence " + std::to_string(seq) + " is at position " +
                            std::to_string(stage_->position(seq)) + ", the chunk starts at " +
                            std::to_string(c.start_pos) + " with " + std::to_string(c.n_tokens) +
                            " tokens (context " + std::to_string(stage_->n_ctx()) + ")");
    }
    if (assign_.has_output && c.sample && !c.sampling.allowed.empty() &&
        c.sampling.allowed.size() != (size_t(stage_->n_vocab()) + 63) / 64) {
      return send_error(net::WireError::bad_request, f.request_id,
                        "the allowed-token mask of sequence " + std::to_string(seq) + " does not match the vocabulary");
    }
    batch.push_back({seq, int64_t(c.n_tokens), assign_.has_output && c.sample});
  }
  // The group's other ranks run the same rows, from the same message (the
  // coordinator keeps the links into a group on TCP: the rows are in it).
  if (assign_.tp_size > 1 && assign_.tp_rank == 0) {
    if (f.rows_on_link) {
      return send_error(net::WireError::bad_request, f.request_id,
                        "a tensor-parallel group takes its rows inside FORWARD (a TCP link), not over NCCL");
    }
    pass_to_group(f);
  }
  std::span<const float> y;
  try {
    if (assign_.has_embedding) {
      y = stage_->forward_batch(batch, f.tokens);
    } else if (rows_on_device) {
      y = stage_->forward_batch_device_input(batch);
    } else {
      y = stage_->forward_batch(batch, rows);
    }
  } catch (const std::invalid_argument& e) {
    return send_error(net::WireError::bad_request, f.request_id, e.what());
  } catch (const std::out_of_range& e) {
    return send_error(net::WireError::bad_request, f.request_id, e.what());
  }
  if (output_is_rank0s()) return;
  if (assign_.has_output) {
    const size_t width = size_t(stage_->n_vocab());
    size_t k = 0;
    for (const net::SeqChunk& c : f.chunks) {
      if (!c.sample) continue;
      coord_->send(sample(c, y.subspan(k * width, width), f.request_id));
      ++k;
    }
    if (k == 0) {
      net::Result ack;  // v4: the micro-batch left the pipeline, nothing sampled
      ack.request_id = f.request_id;
      ack.seq = f.chunks.front().seq;
      coord_->send(ack);
    }
    return;
  }
  net::Forward out;
  out.request_id = f.request_id;
  out.chunks = f.chunks;
  out.row_width = uint32_t(in_width);
  const auto* b = reinterpret_cast<const uint8_t*>(y.data());
  out.activations.assign(b, b + y.size_bytes());
  tokens_sent_ += out.total_tokens();
  if (next_ && next_nccl_ok_) send_rows_over_nccl(out);
  if (!next_ || !next_->send(out)) {
    // The next stage (or the way to it) failed, not this one: the code
    // lets the coordinator blame it (coordinator/cluster/failure_blame.h).
    send_error(net::WireError::next_link_closed, f.request_id,
               "the link to the next stage (" + assign_.next_peer + ") is closed");
  }
}

// One sampler per sequence, seeded when the sequence starts, so a sequence
// draws exactly the numbers a single-process run would.
net::Result Worker::sample(const net::SeqChunk& c, std::span<const float> logits, uint64_t request_id) {
  auto it = samplers_.find(c.seq);
  if (it == samplers_.end()) {
    SamplerParams p;
    p.temperature = c.sampling.temperature;
    p.top_k = c.sampling.top_k;
    p.top_p = c.sampling.top_p;
    p.min_p = c.sampling.min_p;
    p.seed = c.sampling.seed;
    p.repeat_penalty = c.sampling.repeat_penalty;
    p.repeat_last_n = c.sampling.repeat_last_n;
    p.presence_penalty = c.sampling.presence_penalty;
    p.frequency_penalty = c.sampling.frequency_penalty;
    p.min_tokens = c.sampling.min_tokens;
    it = samplers_.emplace(c.seq, Sampler(p, int32_t(logits.size()))).first;
    // The output so far is the sampler's own; the prompt and the end tokens come with this chunk (v7).
    it->second.set_prompt(c.sampling.prompt_tail);
    it->second.set_end_tokens(c.sampling.end_tokens);
  }
  std::span<const float> dist = logits;
  if (!c.sampling.logit_bias.empty() || !c.sampling.allowed.empty()) {
    biased_.assign(logits.begin(), logits.end());
    for (const net::LogitBias& b : c.sampling.logit_bias) {
      if (size_t(b.token) < biased_.size()) biased_[size_t(b.token)] += b.bias;
    }
    // Structured output: the coordinator's grammar mask (size checked with the FORWARD).
    if (!c.sampling.allowed.empty()) mask_logits(c.sampling.allowed, biased_);
    dist = biased_;
  }
  net::Result r;
  r.request_id = request_id;
  r.seq = c.seq;
  const int32_t id = it->second.sample(dist);
  r.tokens.push_back(id);
  if (c.sampling.want_logprobs) {
    r.logprobs.push_back(token_logprobs(dist, id, int(c.sampling.top_logprobs), &top_));
    auto& list = r.top.emplace_back();
    for (const TokenLogprobEntry& t : top_) {
      if (std::isfinite(t.logprob)) list.push_back({t.id, t.logprob});  // masked tokens are not alternatives
    }
  }
  return r;
}

}  // namespace worker_impl

int run_worker(const WorkerOptions& opt) {
  using namespace std::chrono_literals;
  if (opt.exit_with_coordinator) {
    worker_impl::Worker w(opt);
    return w.run();
  }
  // Each session is a fresh Worker: a stage that was loaded is freed before
  // the next registration, and the coordinator assigns one anew. SIGTERM and
  // SIGINT keep their default action (the process ends at once) in every
  // state, the backoff's sleep included.
  const std::string name = opt.name.empty() ? "worker-" + std::to_string(getpid()) : opt.name;
  WorkerOptions o = opt;
  o.name = name;
  constexpr std::chrono::milliseconds kFirst = 200ms, kMax = 5s, kLogEvery = 5s;
  std::chrono::milliseconds backoff = kFirst;
  auto last_log = std::chrono::steady_clock::time_point{};
  bool logged_waiting = false;
  for (;;) {
    try {
      worker_impl::Worker w(o);
      const int code = w.run();
      if (code != 0 && code != 1) return code;  // the stage could not be loaded: a configuration error
      net::log(net::LogLevel::warn, name + ": the coordinator at " + o.coordinator + " went away (" +
                                        w.stop_reason() + "): the stage is dropped; registering again");
      backoff = kFirst;
      logged_waiting = false;
    } catch (const worker_impl::DialFailed& e) {
      // A wrong secret or another protocol version is a configuration
      // mistake, not a coordinator that is not there yet.
      if (e.ec == net::Errc::auth_failed || e.ec == net::Errc::version_mismatch) throw;
      const auto now = std::chrono::steady_clock::now();
      if (!logged_waiting || now - last_log >= kLogEvery) {
        net::log(net::LogLevel::warn, name + ": waiting for the coordinator at " + o.coordinator + " (" + e.what() +
                                          "); dialling it again, at most 5 s apart");
        last_log = now;
        logged_waiting = true;
      }
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, kMax);
  }
}

}  // namespace baton
