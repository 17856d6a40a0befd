#include "coordinator/api/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>
#include <optional>

#include "coordinator/api/anthropic_response.h"
#include "coordinator/api/generation_link.h"
#include "coordinator/api/metrics.h"
#include "coordinator/api/tokenize_api.h"
#include "chat/family.h"
#include "engine/text/tokenizer.h"
#include "engine/model/layer_range_text.h"

namespace baton {

using json = nlohmann::json;

// ---- responses ----

ResponseBuilder::ResponseBuilder(const ApiRequest& request, std::string model_id, std::string id, int64_t created)
    : endpoint_(request.endpoint),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      model_id_(std::move(model_id)),
      id_(std::move(id)),
      created_(created),
      parser_(request.output) {}

const char* ResponseBuilder::finish_name(FinishReason r) const {
  if (endpoint_ == ApiEndpoint::chat && r == FinishReason::stop && !parser_.output().tool_calls.empty()) {
    return "tool_calls";
  }
  return finish_reason_name(r);
}

void ResponseBuilder::add_timings(json& j, const Usage& u) {
  json t = json::object();
  add_draft_counts(t, u);
  if (!t.empty()) j["timings"] = std::move(t);
}

std::string ResponseBuilder::sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json ResponseBuilder::chunk_base() const {
  json j = {{"id", id_},
            {"object", endpoint_ == ApiEndpoint::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_id_},
            {"system_fingerprint", "baton"}};
  return j;
}

json ResponseBuilder::usage_json(const Usage& u) const {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  add_draft_counts(j, u);
  return j;
}

void add_draft_counts(json& j, const Usage& u) {
  // llama-server's names; only for a request that drafted (docs/DSPARK.md).
  if (u.draft_n == 0) return;
  j["draft_n"] = u.draft_n;
  j["draft_n_accepted"] = u.draft_n_accepted;
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// b after a, tool-call pieces of one call joined.
void append_delta(ChatOutputDelta& a, ChatOutputDelta&& b) {
  a.content += b.content;
  a.reasoning += b.reasoning;
  for (auto& t : b.tool_calls) {
    if (!a.tool_calls.empty() && a.tool_calls.back().index == t.index && t.id.empty()) {
      a.tool_calls.back().arguments += t.arguments;
    } else {
      a.tool_calls.push_back(std::move(t));
    }
  }
}

// A chat stream's delta: a tool call's first piece carries its id, type and
// name (and the arguments so far); later pieces carry argument text only.
json delta_json(const ChatOutputDelta& d) {
  json j = json::object();
  if (!d.reasoning.empty()) j["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) j["content"] = d.content;
  if (!d.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& t : d.tool_calls) {
      json c = {{"index", t.index}};
      if (!t.id.empty()) {
        c["id"] = t.id;
        c["type"] = "function";
        c["function"] = {{"name", t.name}, {"arguments", t.arguments}};
      } else {
        c["function"] = {{"arguments", t.arguments}};
      }
      calls.push_back(std::move(c));
    }
    j["tool_calls"] = std::move(calls);
  }
  return j;
}

}  // namespace

json ResponseBuilder::logprobs_json(const std::vector<GeneratedToken>& tokens, size_t text_offset) const {
  if (endpoint_ == ApiEndpoint::chat) {
    json content = json::array();
    for (const auto& t : tokens) {
      json top = json::array();
      for (const auto& alt : t.top) {
        top.push_back({{"token", sanitize_utf8(alt.piece)}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt.piece)}});
      }
      content.push_back({{"token", sanitize_utf8(t.piece)},
                         {"logprob", t.logprob},
                         {"bytes", bytes_of(t.piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  size_t offset = text_offset;
  for (const auto& t : tokens) {
    out["tokens"].push_back(sanitize_utf8(t.piece));
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& alt : t.top) top[sanitize_utf8(alt.piece)] = alt.logprob;
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(offset);
    offset += t.piece.size();
  }
  return out;
}

std::vector<std::string> ResponseBuilder::stream_chunks(const GenerationEvent& ev) {
  std::vector<std::string> out;
  const bool chat = endpoint_ == ApiEndpoint::chat;
  auto choice_chunk = [&](json choice) {
    json j = chunk_base();
    choice["index"] = 0;
    j["choices"] = json::array({choice});
    if (include_usage_) j["usage"] = nullptr;
    return j;
  };
  if (chat && !role_sent_) {
    role_sent_ = true;
    out.push_back(sse(choice_chunk(
        {{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}})));
  }
  const bool has_logprobs = logprobs_ && !ev.tokens.empty();
  const bool normal_end = ev.finish && *ev.finish != FinishReason::error && *ev.finish != FinishReason::cancelled;
  if (chat) {
    ChatOutputDelta d = parser_.push(ev.text);
    if (normal_end) append_delta(d, parser_.finish());
    json delta = delta_json(d);
    if (!delta.empty() || has_logprobs) {
      json lp = has_logprobs ? logprobs_json(ev.tokens, offset_) : json();
      if (delta.empty()) delta["content"] = "";
      out.push_back(sse(choice_chunk({{"delta", delta}, {"logprobs", lp}, {"finish_reason", nullptr}})));
    }
    for (const auto& t : ev.tokens) offset_ += t.piece.size();
  } else if (!ev.text.empty() || has_logprobs) {
    json lp = has_logprobs ? logprobs_json(ev.tokens, offset_) : json();
    for (const auto& t : ev.tokens) offset_ += t.piece.size();
    out.push_back(sse(choice_chunk({{"text", ev.text}, {"logprobs", lp}, {"finish_reason", nullptr}})));
  } else {
    for (const auto& t : ev.tokens) offset_ += t.piece.size();
  }
  if (!ev.finish) return out;
  if (*ev.finish == FinishReason::error || *ev.finish == FinishReason::cancelled) {
    const std::string msg = *ev.finish == FinishReason::error ? "generation failed: " + ev.error
                                                              : "the request was cancelled (the server is stopping)";
    out.push_back("data: " + error_body(msg, "server_error", "", "") + "\n\n");
  } else {
    const char* reason = finish_name(*ev.finish);
    json last = chat ? choice_chunk({{"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", reason}})
                     : choice_chunk({{"text", ""}, {"logprobs", nullptr}, {"finish_reason", reason}});
    add_timings(last, ev.usage);
    out.push_back(sse(last));
    if (include_usage_) {
      json j = chunk_base();
      j["choices"] = json::array();
      j["usage"] = usage_json(ev.usage);
      out.push_back(sse(j));
    }
  }
  out.push_back("data: [DONE]\n\n");
  return out;
}

void ResponseBuilder::add(const GenerationEvent& ev) {
  if (endpoint_ == ApiEndpoint::chat) {
    parser_.push(ev.text);
    if (ev.finish) parser_.finish();
  } else {
    text_ += ev.text;
  }
  if (logprobs_) tokens_.insert(tokens_.end(), ev.tokens.begin(), ev.tokens.end());
  if (ev.finish) {
    finish_ = finish_name(*ev.finish);
    usage_ = ev.usage;
  }
}

std::string ResponseBuilder::body() const {
  json choice = {{"index", 0}, {"finish_reason", finish_}};
  choice["logprobs"] = logprobs_ ? logprobs_json(tokens_, 0) : json();
  json j;
  if (endpoint_ == ApiEndpoint::chat) {
    const ChatOutput& out = parser_.output();
    json message = {{"role", "assistant"}};
    // OpenAI's shape: content null when the answer is only tool calls.
    message["content"] = out.content.empty() && !out.tool_calls.empty() ? json() : json(out.content);
    if (!out.reasoning.empty()) message["reasoning_content"] = out.reasoning;
    if (!out.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCall& c : out.tool_calls) {
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    message["refusal"] = nullptr;
    choice["message"] = std::move(message);
    j = {{"id", id_}, {"object", "chat.completion"}};
  } else {
    choice["text"] = text_;
    j = {{"id", id_}, {"object", "text_completion"}};
  }
  j["created"] = created_;
  j["model"] = model_id_;
  j["system_fingerprint"] = "baton";
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage_);
  add_timings(j, usage_);
  return dump_json(j);
}

// ---- the HTTP side ----

bool constant_time_equal(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char ca = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char cb = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= unsigned(ca ^ cb);
  }
  return diff == 0;
}

OpenAiApi::OpenAiApi(GenerationService& service, Metrics& metrics, ApiOptions options)
    : service_(service),
      metrics_(metrics),
      options_(std::move(options)),
      anthropic_(service, metrics, options_.chat_template, options_.sampling),
      prompts_(options_.prompt_threads, options_.prompt_queue) {}

void OpenAiApi::stop() { prompts_.stop(); }

// The key from `x-api-key` (Anthropic's header) or `Authorization: Bearer`
// (OpenAI's): either may carry it.
bool OpenAiApi::authorized(const HttpRequest& req) const {
  if (options_.api_key.empty()) return true;
  if (auto key = req.header("x-api-key"); key && constant_time_equal(*key, options_.api_key)) return true;
  auto h = req.header("authorization");
  if (!h) return false;
  std::string_view v = *h;
  constexpr std::string_view kScheme = "bearer ";
  if (v.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(v[i])) != kScheme[i]) return false;
  }
  v.remove_prefix(kScheme.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return constant_time_equal(v, options_.api_key);
}

void OpenAiApi::send_error(const std::shared_ptr<HttpExchange>& ex, const ApiError& e) {
  metrics_.error(e.kind);
  HttpHeaders headers = e.headers;
  if (e.status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  const bool anthropic = is_anthropic_route(ex->request().path);
  ex->respond(e.status, "application/json", anthropic ? anthropic_error_body(e) : error_body(e), headers);
}

std::pair<int, std::string> OpenAiApi::health_body() const {
  const ServiceHealth h = service_.health();
  const ModelInfo& m = service_.model();
  json stages = json::array();
  for (const StageHealth& s : h.stages) {
    json planned = json::object();
    uint64_t planned_total = 0;
    for (const auto& [name, bytes] : s.memory_planned) {
      planned[name] = bytes;
      planned_total += bytes;
    }
    stages.push_back({{"node", s.node},
                      {"address", s.address},
                      {"stage", s.stage},
                      {"tp", {{"rank", s.rank}, {"size", s.tp}}},
                      {"layers", layer_range_text(s.first_layer, s.last_layer)},
                      {"embedding", s.embedding},
                      {"head", s.head},
                      {"state", s.state},
                      {"progress", s.progress},
                      {"bytes_loaded", s.bytes_loaded},
                      {"bytes_total", s.bytes_total},
                      {"memory", {{"planned", planned},
                                  {"planned_total", planned_total},
                                  {"used", s.memory_used},
                                  {"rss", s.rss_bytes}}},
                      {"error", s.error.empty() ? json() : json(s.error)},
                      {"link", s.link.empty() ? json() : json({{"kind", s.link}, {"reason", s.link_reason}})}});
  }
  json j = {{"status", h.status},
            {"model", m.id},
            {"n_ctx", m.n_ctx},
            {"slots", {{"total", h.slots_total}, {"busy", h.slots_busy}}},
            {"queue", {{"depth", h.queue_depth}, {"capacity", h.queue_capacity}}},
            {"stages", stages}};
  return {h.status == "ok" ? 200 : 503, dump_json(j)};
}

namespace {

// "jinja" when a Jinja template renders chat prompts, else the family's name.
// meta.sampling_defaults: the server's sampling defaults that are set (serve
// --temp...), by their request field names, so that a client can see what a
// request without them gets.
json model_object(const ModelInfo& m, bool template_override, const SamplingDefaults& d) {
  json sampling = json::object();
  if (d.temperature) sampling["temperature"] = *d.temperature;
  if (d.top_p) sampling["top_p"] = *d.top_p;
  if (d.top_k) sampling["top_k"] = *d.top_k;
  if (d.min_p) sampling["min_p"] = *d.min_p;
  if (d.seed) sampling["seed"] = *d.seed;
  if (d.repeat_penalty) sampling["repeat_penalty"] = *d.repeat_penalty;
  if (d.repeat_last_n) sampling["repeat_last_n"] = *d.repeat_last_n;
  if (d.presence_penalty) sampling["presence_penalty"] = *d.presence_penalty;
  if (d.frequency_penalty) sampling["frequency_penalty"] = *d.frequency_penalty;
  return {{"id", m.id},
          {"object", "model"},
          {"created", m.created},
          {"owned_by", "baton"},
          {"meta", {{"n_ctx", m.n_ctx},
                    {"n_vocab", m.n_vocab},
                    {"arch", m.arch},
                    {"chat_template", template_override || m.chat_template ? "jinja" : chat_family_name(m.chat_family)},
                    {"sampling_defaults", sampling}}}};
}

ApiError method_not_allowed(const HttpRequest& req, const char* allowed) {
  ApiError e(405, fmt::format("Method {} is not allowed on {}; use {}.", sanitize_utf8(req.method.substr(0, 20)),
                              sanitize_utf8(req.path.substr(0, 200)), allowed),
             "invalid_request_error", "", "method_not_allowed", "method_not_allowed");
  e.headers.emplace_back("Allow", allowed);
  return e;
}

ApiError not_found(const HttpRequest& req) {
  return ApiError(404, fmt::format("Unknown request URL: {} {}.", sanitize_utf8(req.method.substr(0, 20)),
                                   sanitize_utf8(req.path.substr(0, 200))),
                  "invalid_request_error", "", "unknown_url", "not_found");
}

// The OpenAI shapes of a generation's events (ResponseBuilder) for run_generation.
class OpenAiShaper final : public ResponseShaper {
 public:
  OpenAiShaper(const ApiRequest& r, std::string model_id, std::string id)
      : builder_(r, std::move(model_id), std::move(id), int64_t(std::time(nullptr))) {}
  std::vector<std::string> stream_chunks(const GenerationEvent& ev) override { return builder_.stream_chunks(ev); }
  void add(const GenerationEvent& ev) override { builder_.add(ev); }
  std::string body() const override { return builder_.body(); }
  std::string error_body(int, const std::string& message) const override {
    return baton::error_body(message, "server_error", "", "");
  }

 private:
  ResponseBuilder builder_;
};

}  // namespace

void OpenAiApi::generate(const std::shared_ptr<HttpExchange>& ex, ApiEndpoint endpoint, const RenderBudget& budget) {
  const ModelInfo& model = service_.model();
  const std::string& body = ex->request().body;
  ApiRequest r = endpoint == ApiEndpoint::chat ? parse_chat_request(body, model, options_.chat_template.get(), budget, options_.sampling)
                                               : parse_completion_request(body, model, options_.sampling);
  std::string id = make_request_id(endpoint == ApiEndpoint::chat ? "chatcmpl-" : "cmpl-");
  r.gen.id = id;
  auto shaper = std::make_unique<OpenAiShaper>(r, model.id, id);
  run_generation(service_, metrics_, ex, std::move(r.gen), std::move(shaper), r.stream);
}

void OpenAiApi::on_prompt_thread(const std::shared_ptr<HttpExchange>& ex,
                                 std::function<void(const RenderBudget&)> work) {
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  // Replaced by the generation's own abort once it is submitted.
  ex->on_abort([cancel] { *cancel = true; });
  const auto timeout = options_.template_timeout;
  auto job = [this, ex, timeout, work = std::move(work)](const std::atomic<bool>& cancelled) {
    answer_errors(ex, [&] {
      if (cancelled) throw ApiError(503, "The server is stopping.", "server_error", "", "", "stopping");
      RenderBudget budget;
      budget.deadline = std::chrono::steady_clock::now() + timeout;
      budget.cancel = &cancelled;
      work(budget);
    });
  };
  if (!prompts_.submit(std::move(job), cancel)) {
    if (prompts_.stopping()) throw ApiError(503, "The server is stopping.", "server_error", "", "", "stopping");
    ApiError e(503, "The server is busy preparing other prompts; retry shortly.", "server_error", "", "",
               "prompt_queue_full");
    e.headers.emplace_back("Retry-After", "1");
    throw e;
  }
}

void OpenAiApi::answer_errors(const std::shared_ptr<HttpExchange>& ex, const std::function<void()>& route) {
  const HttpRequest& req = ex->request();
  try {
    route();
  } catch (const ApiError& e) {
    send_error(ex, e);
  } catch (const std::exception& e) {
    metrics_.error("internal");
    const std::string msg = std::string("internal error: ") + e.what();
    const bool anthropic = is_anthropic_route(req.path);
    ex->respond(500, "application/json",
                anthropic ? anthropic_error_body(500, msg) : error_body(msg, "server_error", "", ""));
  }
}

void OpenAiApi::handle(const std::shared_ptr<HttpExchange>& ex) {
  answer_errors(ex, [&] { route(ex); });
}

void OpenAiApi::route(const std::shared_ptr<HttpExchange>& ex) {
  const HttpRequest& req = ex->request();
  const bool get = req.method == "GET", post = req.method == "POST";
  {
    if (req.path == "/health") {
      if (!get) throw method_not_allowed(req, "GET");
      auto [status, body] = health_body();
      ex->respond(status, "application/json", body);
      return;
    }
    if (req.path == "/metrics") {
      if (!get) throw method_not_allowed(req, "GET");
      ex->respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(service_.health()));
      return;
    }
    const bool tokenize = req.path == "/tokenize" || req.path == "/detokenize";
    if (req.path.rfind("/v1/", 0) != 0 && !tokenize) throw not_found(req);
    if (!authorized(req)) {
      throw ApiError(401, "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.",
                     "invalid_request_error", "", "invalid_api_key", "unauthorized");
    }
    if (tokenize) {
      if (!post) throw method_not_allowed(req, "POST");
      on_prompt_thread(ex, [this, ex](const RenderBudget& b) {
        const std::string& body = ex->request().body;
        ex->respond(200, "application/json",
                    ex->request().path == "/tokenize"
                        ? tokenize_response(body, service_.model(), options_.chat_template.get(), b)
                        : detokenize_response(body, service_.model()));
      });
      return;
    }
    if (req.path == "/v1/chat/completions" || req.path == "/v1/completions") {
      if (!post) throw method_not_allowed(req, "POST");
      const ApiEndpoint endpoint = req.path == "/v1/completions" ? ApiEndpoint::completions : ApiEndpoint::chat;
      on_prompt_thread(ex, [this, ex, endpoint](const RenderBudget& b) { generate(ex, endpoint, b); });
      return;
    }
    if (req.path == "/v1/messages" || req.path == "/v1/messages/count_tokens") {
      if (!post) throw method_not_allowed(req, "POST");
      if (req.path == "/v1/messages") {
        on_prompt_thread(ex, [this, ex](const RenderBudget& b) { anthropic_.messages(ex, b); });
      } else {
        on_prompt_thread(ex, [this, ex](const RenderBudget& b) { anthropic_.count_tokens(ex, b); });
      }
      return;
    }
    if (req.path == "/v1/models") {
      if (!get) throw method_not_allowed(req, "GET");
      ex->respond(200, "application/json",
                  dump_json(json{{"object", "list"}, {"data", json::array({model_object(service_.model(), options_.chat_template != nullptr, options_.sampling)})}}));
      return;
    }
    if (req.path.rfind("/v1/models/", 0) == 0) {
      if (!get) throw method_not_allowed(req, "GET");
      const std::string name = req.path.substr(std::string_view("/v1/models/").size());
      if (name != service_.model().id) {
        throw ApiError(404, fmt::format("The model '{}' does not exist.", sanitize_utf8(name.substr(0, 200))),
                       "invalid_request_error", "model", "model_not_found", "model_not_found");
      }
      ex->respond(200, "application/json", dump_json(model_object(service_.model(), options_.chat_template != nullptr, options_.sampling)));
      return;
    }
    throw not_found(req);
  }
}

}  // namespace baton
