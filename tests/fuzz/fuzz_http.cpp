// libFuzzer target for the serving front door: arbitrary bytes through the
// HTTP request parser the server uses (Beast's request_parser with the
// server's default header and body limits, fed in pieces the way a socket
// delivers them), and every complete request through the API's routing, auth
// and JSON body handling (OpenAiApi::handle) against a fake generation
// service, so nothing loads. The model is a real vocabulary (phi-3, which
// also brings a chat template with special tokens).
//
// Bugs, besides crashes and sanitizer reports: a handler that answers twice
// or never, a status outside the API's set, a JSON response that is not
// valid JSON, an SSE chunk that is not "data: JSON" or "data: [DONE]", and a
// request the API validated and submitted that the service contract forbids
// (token ids outside the vocabulary, max_tokens < 1, prompt + max_tokens
// beyond the context).
//
// Input: byte 0 configures the run, the rest is what the client sent.
//   bits 0-1: piece size of each socket read (1, 7, 64 or 4096 bytes)
//   bit 2:    the server has an API key ("sk-fuzz")
//   bits 3-4: how the fake service ends a submitted request (stop, length,
//             error, cancelled)
//   bit 5:    the service refuses the submission (queue full)
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <utility>  // Boost 1.74's Asio needs it before Beast under C++20
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "coordinator/api/generation.h"
#include "coordinator/api/http_request_from_beast.h"
#include "coordinator/api/http_server.h"
#include "coordinator/api/metrics.h"
#include "coordinator/api/openai_api.h"
#include "chat/family.h"
#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"

namespace http = boost::beast::http;
using namespace baton;

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

bool known_status(int s) {
  for (int k : {200, 400, 401, 404, 405, 408, 413, 415, 429, 431, 500, 503}) {
    if (s == k) return true;
  }
  return false;
}

// Records the one response and checks its shape.
class FakeExchange : public HttpExchange {
 public:
  explicit FakeExchange(HttpRequest r) : req_(std::move(r)) {}
  const HttpRequest& request() const override { return req_; }
  void respond(int status, std::string content_type, std::string body, HttpHeaders) override {
    require(!answered_);
    answered_ = complete_ = true;
    require(known_status(status));
    if (content_type == "application/json") require(nlohmann::json::accept(body));
  }
  void begin_stream(int status, std::string content_type, HttpHeaders) override {
    require(!answered_);
    answered_ = streaming_ = true;
    require(status == 200 && content_type == "text/event-stream");
  }
  void write(std::string data) override {
    require(streaming_ && !complete_);
    constexpr std::string_view kPrefix = "data: ", kEnd = "\n\n";
    require(data.size() >= kPrefix.size() + kEnd.size() && data.starts_with(kPrefix) && data.ends_with(kEnd));
    const std::string_view payload(data.data() + kPrefix.size(), data.size() - kPrefix.size() - kEnd.size());
    require(payload == "[DONE]" || nlohmann::json::accept(payload));
  }
  void end() override {
    require(streaming_ && !complete_);
    complete_ = true;
  }
  void on_abort(std::function<void()>) override {}
  bool aborted() const override { return false; }

  bool answered() const { return answered_; }
  bool complete() const { return complete_; }

 private:
  HttpRequest req_;
  bool answered_ = false, streaming_ = false, complete_ = false;
};

// Holds the submitted request; the harness plays its events afterwards
// (the contract forbids calling the sink from inside submit).
class FakeService : public GenerationService {
 public:
  explicit FakeService(ModelInfo m) : model_(std::move(m)) {}
  const ModelInfo& model() const override { return model_; }
  uint64_t submit(GenerationRequest r, EventSink sink) override {
    if (refuse) throw QueueFullError("queue full", 1);
    require(r.max_tokens >= 1 && !r.prompt.empty());
    require(int64_t(r.prompt.size()) + r.max_tokens <= model_.n_ctx);
    for (int32_t id : r.prompt) require(id >= 0 && id < model_.n_vocab);
    for (const auto& [id, bias] : r.logit_bias) require(id >= 0 && id < model_.n_vocab && bias >= -100 && bias <= 100);
    require(r.top_logprobs >= -1 && r.top_logprobs <= kMaxTopLogprobs);
    request = std::move(r);
    this->sink = std::move(sink);
    return 1;
  }
  void cancel(uint64_t) override {}
  ServiceHealth health() const override {
    ServiceHealth h;
    h.status = "ok";
    StageHealth s;
    s.node = "local";
    s.state = "loaded";
    s.memory_planned = {{"weights", 1000}, {"kv cache", 200}};
    h.stages.push_back(s);
    h.slots_total = 1;
    return h;
  }

  bool refuse = false;
  std::optional<GenerationRequest> request;
  EventSink sink;

 private:
  ModelInfo model_;
};

std::shared_ptr<const Tokenizer> g_tokenizer;
ModelInfo g_model;

// The tokens the fake service "generates": a few ids from the input, with
// their pieces, through the same TextAssembler the real services use.
void play_events(FakeService& svc, const uint8_t* data, size_t size, int finish_mode) {
  const GenerationRequest& r = *svc.request;
  TextAssembler text(r.stop);
  int64_t n = 0;
  for (size_t i = 0; i < size && i < 8 && n < r.max_tokens; ++i, ++n) {
    GenerationEvent ev;
    GeneratedToken t;
    t.id = int32_t((data[i] * 131u + i) % uint32_t(g_model.n_vocab));
    t.piece = g_tokenizer->token_to_piece(t.id);
    t.logprob = -0.5f;
    if (r.top_logprobs > 0) t.top.push_back({t.id, -0.5f, t.piece});
    ev.text = text.push(t.piece);
    ev.tokens.push_back(std::move(t));
    svc.sink(std::move(ev));
    if (text.stopped()) break;
  }
  GenerationEvent last;
  last.text = text.flush();
  static constexpr FinishReason kFinish[] = {FinishReason::stop, FinishReason::length, FinishReason::error,
                                             FinishReason::cancelled};
  last.finish = kFinish[finish_mode];
  if (last.finish == FinishReason::error) last.error = "fake failure";
  last.usage.prompt_tokens = int64_t(r.prompt.size());
  last.usage.completion_tokens = n;
  svc.sink(std::move(last));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const GgufFile f = GgufFile::open(std::string(BATON_SHARED_DIR) + "/models/vocab/ggml-vocab-phi-3.gguf");
  std::shared_ptr<Tokenizer> tok = Tokenizer::from_gguf(f);
  g_model.id = "fuzz-model";
  g_model.arch = "phi3";
  g_model.n_ctx = 256;
  g_model.n_vocab = tok->n_vocab();
  g_model.chat_family = detect_chat_family(f);
  g_model.chat_stop_tokens = chat_stop_tokens(g_model.chat_family, *tok);
  if (g_model.chat_family == ChatFamily::Plain) g_model.chat_stop_strings = chat_stop_strings(g_model.chat_family);
  for (int32_t id = 0; id < tok->n_vocab(); ++id) {
    g_model.max_token_bytes = std::max<int64_t>(g_model.max_token_bytes, int64_t(tok->token_to_piece(id).size()));
  }
  g_model.tokenizer = tok;
  g_tokenizer = tok;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t cfg = data[0];
  static constexpr size_t kPiece[] = {1, 7, 64, 4096};
  const size_t piece = kPiece[cfg & 3];
  const HttpServerConfig limits;  // the server's defaults
  Metrics metrics;
  FakeService svc(g_model);
  svc.refuse = (cfg >> 5) & 1;
  ApiOptions options;
  options.api_key = (cfg & 4) ? "sk-fuzz" : "";
  options.prompt_threads = 0;  // answered before handle() returns, as the checks below expect
  OpenAiApi api(svc, metrics, options);

  // Several requests may share one connection (keep-alive, pipelining).
  const uint8_t* p = data + 1;
  const uint8_t* const end = data + size;
  for (int requests = 0; p < end && requests < 4; ++requests) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(limits.max_header_bytes);
    parser.body_limit(limits.max_body_bytes);
    parser.eager(true);
    boost::beast::error_code ec;
    size_t avail = std::min(piece, size_t(end - p));
    while (!parser.is_done()) {
      const size_t used = parser.put(boost::asio::buffer(p, avail), ec);
      p += used;
      avail -= used;
      if (ec && ec != http::error::need_more) break;
      // Like Beast's read loop: when the parser takes nothing (a partial
      // chunk header, say), the next socket read appends to what is there.
      if (ec == http::error::need_more || used == 0) {
        ec = {};
        if (p + avail >= end) break;  // the client stopped sending
        avail = std::min(avail + piece, size_t(end - p));
      }
    }
    if (!parser.is_done()) return 0;  // the server answers 4xx (or waits) and closes
    auto ex = std::make_shared<FakeExchange>(http_request_from(parser.release(), "127.0.0.1:1"));
    api.handle(ex);
    require(ex->answered() || svc.request.has_value());
    if (svc.request) {
      play_events(svc, p, size_t(end - p), (cfg >> 3) & 3);
      require(ex->complete());
      svc.request.reset();
      svc.sink = nullptr;
    }
    require(ex->complete());
  }
  return 0;
}
