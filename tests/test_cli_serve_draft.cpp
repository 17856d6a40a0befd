// Speculative decoding inside `baton serve` (docs/DSPARK.md, "Drafting in
// baton serve").
//
// Through HTTP: a synthetic deepseek4-micro with a DSpark drafter in its file,
// served on the CPU with the drafter on (the default) and with --no-draft.
// Greedy output is the same token for token through both OpenAI routes,
// streamed or not, with max_tokens, a stop string or a grammar; two clients
// at once decode plain batched steps and stay correct; /metrics and usage
// count the guesses; a cancelled stream frees its slot.
//
// The random drafter's guesses are almost never right, so the engine is also
// driven directly with scripted guesses (LocalEngineConfig::draft_source),
// right for whole blocks or up to a set depth: max_tokens, a stop string, a
// stop token and a disconnect inside an accepted block emit nothing beyond
// it, a grammar cuts the guesses it forbids, and the prefix cache reuses a
// drafted sequence's KV.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/cluster/local_engine.h"
#include "engine/runtime/backend.h"
#include "engine/sampling/json_schema.h"
#include "engine/text/tokenizer.h"
#include "gguf_split/synth.h"
#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;

// One model file and two servers for the whole suite: loading is most of
// a server's start, and every test compares the two.
class ServeDraft : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    SynthOptions o;
    o.arch = "deepseek4";
    o.shape = "deepseek4-micro";
    o.seed = 11;
    o.dspark = true;
    write_synth_model(dir_->file("m.gguf"), o);
    const std::vector<std::string> common = {"-m", dir_->file("m.gguf"), "--model-id", "m", "--backend", "cpu",
                                             "--parallel", "2", "--ctx", "256", "--quiet"};
    std::vector<std::string> plain = common, drafted = common;
    plain.push_back("--no-draft");
    // Every lone step drafts: these tests count guesses, which pacing would
    // make depend on the machine's timings (draft_pacer.h).
    drafted.push_back("--draft-always");
    drafted_ = new ServeProcess(drafted);
    plain_ = new ServeProcess(plain);
  }
  static void TearDownTestSuite() {
    delete drafted_;
    delete plain_;
    delete dir_;
  }

  static test::TempDir* dir_;
  static ServeProcess* drafted_;
  static ServeProcess* plain_;
};

test::TempDir* ServeDraft::dir_ = nullptr;
ServeProcess* ServeDraft::drafted_ = nullptr;
ServeProcess* ServeDraft::plain_ = nullptr;

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 103, 107, 61, 78, 114, 61, 103, 78},
    {1, 40, 41, 42, 43},
    {1, 200, 17, 17, 300, 5, 99, 150, 151, 152, 9, 8},
};

json completion(const std::vector<int32_t>& prompt, int max_tokens) {
  return {{"model", "m"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

json chat(const std::string& content, int max_tokens) {
  return {{"model", "m"},
          {"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

json ok(int port, const std::string& path, const json& body) {
  const Response r = post(port, path, body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.j() : json::object();
}

std::string text_of(const json& j) {
  const json& c = j["choices"][0];
  return c.contains("message") ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
}

// A streamed request: its text and the usage of its last chunk.
struct Streamed {
  std::string text;
  json usage;
  int content_chunks = 0;
};

Streamed stream(int port, const std::string& path, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Response r = post(port, path, body);
  EXPECT_EQ(r.status, 200) << r.body;
  Streamed s;
  for (const std::string& e : sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    const std::string piece = c.contains("delta") ? c["delta"].value("content", "") : c.value("text", "");
    if (!piece.empty()) ++s.content_chunks;
    s.text += piece;
  }
  return s;
}

// Where two printable ASCII characters that occur nowhere earlier start in
// `text` (the random model's text is not all valid UTF-8): stop strings.
std::vector<size_t> stop_string_starts(const std::string& text) {
  std::vector<size_t> out;
  auto printable = [](char c) { return c > ' ' && c < 0x7f; };
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (printable(text[i]) && printable(text[i + 1]) && text.find(text.substr(i, 2)) == i) out.push_back(i);
  }
  return out;
}

int64_t draft_n(const json& usage) { return usage.value("draft_n", int64_t(0)); }

TEST_F(ServeDraft, GreedyOutputEqualsPlainThroughBothRoutes) {
  const double proposed0 = metric(drafted_->port(), "baton_draft_tokens_total");
  const double accepted0 = metric(drafted_->port(), "baton_draft_accepted_total");
  int64_t proposed = 0, accepted = 0;
  for (const auto& prompt : {kPrompts[0], kPrompts[2]}) {
    SCOPED_TRACE(prompt.size());
    const json body = completion(prompt, 16);
    const json want = ok(plain_->port(), "/v1/completions", body);
    const json got = ok(drafted_->port(), "/v1/completions", body);
    EXPECT_EQ(text_of(got), text_of(want));
    EXPECT_EQ(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"]);
    EXPECT_FALSE(want["usage"].contains("draft_n"));  // --no-draft: none reported
    // The counts, as llama-server names them, in usage and in timings.
    ASSERT_GT(draft_n(got["usage"]), 0) << got.dump();
    EXPECT_LE(got["usage"]["draft_n_accepted"].get<int64_t>(), draft_n(got["usage"]));
    EXPECT_EQ(got["timings"]["draft_n"], got["usage"]["draft_n"]);
    EXPECT_EQ(got["timings"]["draft_n_accepted"], got["usage"]["draft_n_accepted"]);
    proposed += draft_n(got["usage"]);
    accepted += got["usage"]["draft_n_accepted"].get<int64_t>();

    // Streamed: every kept token arrives; the text and the counts are the same.
    const Streamed s = stream(drafted_->port(), "/v1/completions", body);
    EXPECT_EQ(s.text, text_of(want));
    EXPECT_EQ(s.usage["completion_tokens"], want["usage"]["completion_tokens"]);
    EXPECT_EQ(s.usage["draft_n"], got["usage"]["draft_n"]);
    proposed += draft_n(s.usage);
    accepted += s.usage.value("draft_n_accepted", int64_t(0));
  }
  {
    const json body = chat("Tell me a story.", 16);
    const json want = ok(plain_->port(), "/v1/chat/completions", body);
    const json got = ok(drafted_->port(), "/v1/chat/completions", body);
    EXPECT_EQ(text_of(got), text_of(want));
    EXPECT_EQ(got["choices"][0]["finish_reason"], want["choices"][0]["finish_reason"]);
    proposed += draft_n(got["usage"]);
    accepted += got["usage"].value("draft_n_accepted", int64_t(0));
    const Streamed s = stream(drafted_->port(), "/v1/chat/completions", body);
    EXPECT_EQ(s.text, text_of(want));
    proposed += draft_n(s.usage);
    accepted += s.usage.value("draft_n_accepted", int64_t(0));
  }
  // /metrics counts what the responses reported.
  EXPECT_EQ(metric(drafted_->port(), "baton_draft_tokens_total") - proposed0, double(proposed));
  EXPECT_EQ(metric(drafted_->port(), "baton_draft_accepted_total") - accepted0, double(accepted));
  EXPECT_GT(proposed, 0);
  EXPECT_LE(accepted, proposed);
  std::printf("[ drafts   ] %lld of %lld guesses kept\n", (long long)accepted, (long long)proposed);
  EXPECT_EQ(metric(plain_->port(), "baton_draft_tokens_total"), 0);
  // --draft-always: drafting never paused (the series is there, at 0).
  EXPECT_EQ(metric(drafted_->port(), "baton_draft_pauses_total"), 0);
}

// Anthropic's Messages API reports the same counts in its usage, whole and
// in the stream's final message_delta, and its text is the plain one.
TEST_F(ServeDraft, MessagesApiReportsTheDraftCounts) {
  const json body = {{"model", "m"},
                     {"max_tokens", 16},
                     {"temperature", 0},
                     {"messages", json::array({{{"role", "user"}, {"content", "Tell me a story."}}})}};
  const json want = ok(plain_->port(), "/v1/messages", body);
  const json got = ok(drafted_->port(), "/v1/messages", body);
  EXPECT_EQ(got["content"], want["content"]);
  EXPECT_EQ(got["usage"]["output_tokens"], want["usage"]["output_tokens"]);
  EXPECT_FALSE(want["usage"].contains("draft_n"));
  ASSERT_GT(draft_n(got["usage"]), 0) << got.dump();
  EXPECT_LE(got["usage"]["draft_n_accepted"].get<int64_t>(), draft_n(got["usage"]));
  json streamed = body;
  streamed["stream"] = true;
  const Response r = post(drafted_->port(), "/v1/messages", streamed);
  ASSERT_EQ(r.status, 200) << r.body;
  json last_usage;  // Anthropic's events are "event: NAME" then "data: {...}" lines
  std::istringstream lines(r.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: ", 0) != 0) continue;
    const json j = json::parse(line.substr(6));
    if (j.value("type", "") == "message_delta") last_usage = j["usage"];
  }
  EXPECT_EQ(last_usage["draft_n"], got["usage"]["draft_n"]) << r.body;
  EXPECT_EQ(last_usage["draft_n_accepted"], got["usage"]["draft_n_accepted"]) << r.body;
}

// max_tokens may end the output inside what one verify could decide: no
// token beyond it is emitted, for every limit from 1 up.
TEST_F(ServeDraft, MaxTokensCutsInsideABlock) {
  const json full = ok(plain_->port(), "/v1/completions", completion(kPrompts[0], 12));
  for (int n = 1; n <= 9; ++n) {
    SCOPED_TRACE(n);
    const json body = completion(kPrompts[0], n);
    const json want = ok(plain_->port(), "/v1/completions", body);
    const json got = ok(drafted_->port(), "/v1/completions", body);
    EXPECT_EQ(text_of(got), text_of(want));
    EXPECT_EQ(got["usage"]["completion_tokens"], n);
    EXPECT_EQ(got["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(text_of(full).rfind(text_of(got), 0), 0u);  // a prefix of the longer output
  }
}

// A stop string inside the output: the text ends before it, as without drafts.
TEST_F(ServeDraft, StopStringCutsInsideABlock) {
  const json full = ok(plain_->port(), "/v1/completions", completion(kPrompts[2], 24));
  const std::string text = text_of(full);
  ASSERT_GE(text.size(), 12u) << text;
  const std::vector<size_t> starts = stop_string_starts(text);
  ASSERT_GE(starts.size(), 3u) << text;
  for (size_t at : {starts.front(), starts[starts.size() / 2], starts.back()}) {
    json body = completion(kPrompts[2], 24);
    const std::string stop = text.substr(at, 2);
    body["stop"] = {stop};
    SCOPED_TRACE(stop);
    const json want = ok(plain_->port(), "/v1/completions", body);
    const json got = ok(drafted_->port(), "/v1/completions", body);
    EXPECT_EQ(text_of(got), text_of(want));
    EXPECT_EQ(text_of(got), text.substr(0, text.find(stop)));
    EXPECT_EQ(got["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"]);
    const Streamed s = stream(drafted_->port(), "/v1/completions", body);
    EXPECT_EQ(s.text, text_of(want));
  }
}

// A grammar (a JSON schema): guesses it forbids end the draft, and every
// emitted token is sampled through it; the output is the plain one.
TEST_F(ServeDraft, GrammarConstrainedOutputEqualsPlain) {
  const json schema = json::parse(R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 8},
      "n": {"type": "integer"}}, "required": ["a", "n"]})");
  json body = chat("Give me JSON.", 60);
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}};
  const json want = ok(plain_->port(), "/v1/chat/completions", body);
  const json got = ok(drafted_->port(), "/v1/chat/completions", body);
  EXPECT_EQ(text_of(got), text_of(want));
  EXPECT_EQ(got["choices"][0]["finish_reason"], want["choices"][0]["finish_reason"]);
  body["temperature"] = 0.9;
  body["seed"] = 5;
  // Sampled with a seed: each row is sampled as a plain step would, with the
  // same random draws, so the text is the plain one here too.
  EXPECT_EQ(text_of(ok(drafted_->port(), "/v1/chat/completions", body)),
            text_of(ok(plain_->port(), "/v1/chat/completions", body)));
}

// Two clients at once: the engine decodes them in plain batched steps while
// both run (EngineDraft.NoGuessesWhileAnotherSequenceRuns shows that part)
// and both get the plain text.
TEST_F(ServeDraft, TwoConcurrentClientsStayCorrect) {
  const json a = completion(kPrompts[0], 64), b = completion(kPrompts[2], 64);
  const json want_a = ok(plain_->port(), "/v1/completions", a);
  const json want_b = ok(plain_->port(), "/v1/completions", b);
  json got_a, got_b;
  std::thread ta([&] { got_a = ok(drafted_->port(), "/v1/completions", a); });
  std::thread tb([&] { got_b = ok(drafted_->port(), "/v1/completions", b); });
  ta.join();
  tb.join();
  EXPECT_EQ(text_of(got_a), text_of(want_a));
  EXPECT_EQ(text_of(got_b), text_of(want_b));
}

// A stream cancelled mid-generation (the client disconnects) frees its slot.
TEST_F(ServeDraft, CancelledStreamFreesItsSlot) {
  const std::vector<int32_t>& p = kPrompts[1];
  const double cancelled0 = metric(drafted_->port(), "baton_generations_total{finish=\"cancelled\"}");
  json body = completion(p, 250);
  body["stream"] = true;
  const int fd = connect_to(drafted_->port());
  ASSERT_TRUE(send_all(fd, request_text("POST", "/v1/completions", body.dump())));
  char buf[512];
  ASSERT_GT(recv(fd, buf, sizeof buf, 0), 0);  // generation has begun
  ::close(fd);
  EXPECT_TRUE(wait_idle(drafted_->port(), std::chrono::seconds(30)));
  EXPECT_GT(metric(drafted_->port(), "baton_generations_total{finish=\"cancelled\"}"), cancelled0);
  // The server goes on as before.
  const json again = ok(drafted_->port(), "/v1/completions", completion(kPrompts[0], 8));
  EXPECT_EQ(text_of(again), text_of(ok(plain_->port(), "/v1/completions", completion(kPrompts[0], 8))));
}

// ---- the engine with scripted guesses ----

// What the scripted sources guess from: the tokens a plain greedy run puts
// after the prompt (`script` holds the prompt, then them). A guess at depth
// `wrong_at` of each block is off by one, and `forbidden` (when >= 0) is put
// at depth 1 instead: the tests set these between requests.
struct Script {
  std::vector<int32_t> tokens;
  int wrong_at = -1;
  int32_t forbidden = -1;
  int32_t n_vocab = 0;
};

class ScriptedDraft final : public DraftSource {
 public:
  explicit ScriptedDraft(std::shared_ptr<const Script> s) : s_(std::move(s)) {}
  Draft propose(int32_t bonus, int64_t position, int max_tokens) override {
    Draft d;
    const std::vector<int32_t>& t = s_->tokens;
    if (position >= int64_t(t.size()) || t[size_t(position)] != bonus) return d;
    for (int i = 0; i < max_tokens && position + 1 + i < int64_t(t.size()); ++i) {
      int32_t g = t[size_t(position + 1 + i)];
      if (i == s_->wrong_at) g = (g + 1) % s_->n_vocab;
      if (i == 1 && s_->forbidden >= 0) g = s_->forbidden;
      d.tokens.push_back(g);
    }
    return d;
  }
  void committed(std::span<const int32_t>, int64_t, std::span<const float>) override {}

 private:
  std::shared_ptr<const Script> s_;
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<FinishReason> finish;
  Usage usage;
  int token_events = 0;
};

// Submits one request; the future gives its outcome once it ended. With
// disconnect_after > 0 the sink throws (the client went away) once that many
// tokens arrived.
std::future<Outcome> start(LocalEngine& e, GenerationRequest r, int disconnect_after = 0) {
  struct Run {
    Outcome o;
    std::promise<Outcome> done;
  };
  auto run = std::make_shared<Run>();
  std::future<Outcome> f = run->done.get_future();
  e.submit(std::move(r), [run, disconnect_after](GenerationEvent&& ev) {
    Outcome& o = run->o;
    for (const GeneratedToken& t : ev.tokens) o.tokens.push_back(t.id);
    if (!ev.tokens.empty()) ++o.token_events;
    o.text += ev.text;
    if (ev.finish) {
      o.finish = ev.finish;
      o.usage = ev.usage;
      run->done.set_value(std::move(o));
    } else if (disconnect_after > 0 && int(o.tokens.size()) >= disconnect_after) {
      throw std::runtime_error("the client went away");
    }
  });
  return f;
}

Outcome generate(LocalEngine& e, GenerationRequest r, int disconnect_after = 0) {
  return start(e, std::move(r), disconnect_after).get();
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> concat(std::vector<int32_t> a, std::span<const int32_t> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// One slot each, so that the prefix cache's choice is known.
class EngineDraft : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    SynthOptions o;
    o.arch = "deepseek4";
    o.shape = "deepseek4-micro";
    o.seed = 7;
    write_synth_model(dir_->file("m.gguf"), o);
    LocalEngineConfig c;
    c.model_path = dir_->file("m.gguf");
    c.stage.n_ctx = 256;
    c.stage.n_seq = 1;
    c.stage.n_threads = 2;
    plain_ = new LocalEngine(c, nullptr);
    script_ = std::make_shared<Script>();
    c.draft_source = [s = std::shared_ptr<const Script>(script_)] { return std::make_unique<ScriptedDraft>(s); };
    c.draft.always = true;  // the counts below are the script's, not the pacer's (draft_pacer.h)
    drafted_ = new LocalEngine(c, nullptr);
    // Two slots, each step slowed so that two requests submitted together
    // surely run side by side.
    c.stage.n_seq = 2;
    c.step_delay_ms = 20;
    pair_ = new LocalEngine(c, nullptr);
    plain_->wait_loaded();
    drafted_->wait_loaded();
    pair_->wait_loaded();
    script_->n_vocab = int32_t(plain_->model().n_vocab);
  }
  static void TearDownTestSuite() {
    delete plain_;
    delete drafted_;
    delete pair_;
    delete dir_;
  }
  // The plain output of `r`, which the scripted guesses then follow.
  static Outcome reference(const GenerationRequest& r, int wrong_at = -1) {
    Outcome o = generate(*plain_, r);
    script_->tokens = concat(r.prompt, o.tokens);
    script_->wrong_at = wrong_at;
    script_->forbidden = -1;
    return o;
  }

  static test::TempDir* dir_;
  static LocalEngine* plain_;
  static LocalEngine* drafted_;
  static LocalEngine* pair_;
  static std::shared_ptr<Script> script_;
};

test::TempDir* EngineDraft::dir_ = nullptr;
LocalEngine* EngineDraft::plain_ = nullptr;
LocalEngine* EngineDraft::drafted_ = nullptr;
LocalEngine* EngineDraft::pair_ = nullptr;
std::shared_ptr<Script> EngineDraft::script_;

TEST_F(EngineDraft, ScriptedGuessesKeepThePlainOutput) {
  const GenerationRequest r = greedy(kPrompts[0], 30);
  for (int wrong_at : {-1, 0, 2}) {
    SCOPED_TRACE(wrong_at);
    const Outcome want = reference(r, wrong_at);
    const Outcome got = generate(*drafted_, r);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.finish, FinishReason::length);
    // Every kept token is its own event (a stream sends each).
    EXPECT_EQ(got.token_events, int(got.tokens.size()));
    EXPECT_GT(got.usage.draft_n, 0);
    if (wrong_at == -1) {
      EXPECT_EQ(got.usage.draft_n_accepted, got.usage.draft_n);
    } else if (wrong_at == 0) {
      EXPECT_EQ(got.usage.draft_n_accepted, 0);
    } else {
      EXPECT_GT(got.usage.draft_n_accepted, 0);
      EXPECT_LT(got.usage.draft_n_accepted, got.usage.draft_n);
    }
  }
}

// Blocks of six tokens, all confirmed: every limit below falls inside one.
TEST_F(EngineDraft, MaxTokensStopStringAndStopTokenInsideABlock) {
  const Outcome full = reference(greedy(kPrompts[2], 24));
  for (int n = 2; n <= 9; ++n) {
    SCOPED_TRACE(n);
    const Outcome got = generate(*drafted_, greedy(kPrompts[2], n));
    EXPECT_EQ(got.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + n));
    EXPECT_EQ(got.finish, FinishReason::length);
    // The first token comes from the prompt; each verify of up to 5 guesses
    // decides one more than it guessed, and no guess beyond the limit is
    // made. The usage counts the last verify's too.
    const int verifies = (n - 1 + 5) / 6;
    EXPECT_EQ(got.usage.draft_n, n - 1 - verifies);
    EXPECT_EQ(got.usage.draft_n_accepted, got.usage.draft_n);
  }
  // A stop token: the first occurrence of the 9th token ends the output before it.
  GenerationRequest r = greedy(kPrompts[2], 24);
  const int32_t stop_token = full.tokens[8];
  r.stop_tokens = {stop_token};
  const size_t first = size_t(std::find(full.tokens.begin(), full.tokens.end(), stop_token) - full.tokens.begin());
  Outcome got = generate(*drafted_, r);
  EXPECT_EQ(got.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + std::ptrdiff_t(first)));
  EXPECT_EQ(got.finish, FinishReason::stop);
  // A stop string from the middle of the text: it ends before it, and no
  // token after the one that completes it is emitted.
  r = greedy(kPrompts[2], 24);
  const std::vector<size_t> starts = stop_string_starts(full.text);
  ASSERT_FALSE(starts.empty()) << full.text;
  const std::string stop = full.text.substr(starts[starts.size() / 2], 2);
  r.stop = {stop};
  const Outcome want = generate(*plain_, r);
  got = generate(*drafted_, r);
  EXPECT_EQ(got.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_LT(got.tokens.size(), full.tokens.size());
  EXPECT_EQ(got.finish, FinishReason::stop);
}

// A client that goes away inside an accepted block gets nothing more, and
// the slot serves the next request.
TEST_F(EngineDraft, DisconnectInsideABlockFreesTheSlot) {
  const Outcome full = reference(greedy(kPrompts[0], 20));
  const Outcome got = generate(*drafted_, greedy(kPrompts[0], 20), 4);
  EXPECT_EQ(got.finish, FinishReason::cancelled);
  EXPECT_EQ(got.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 4));
  EXPECT_EQ(generate(*drafted_, greedy(kPrompts[0], 20)).tokens, full.tokens);
  // The slot is freed just after the final event.
  for (int i = 0; i < 500 && drafted_->health().slots_busy > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(drafted_->health().slots_busy, 0);
}

// A grammar (JSON integers): the guess it forbids, at depth 1 of every
// block, is cut before the verify, so every guess sent is kept; each token
// is still sampled through the grammar.
TEST_F(EngineDraft, GrammarCutsTheGuessesItForbids) {
  GenerationRequest r = greedy(kPrompts[1], 16);
  r.grammar = json_schema_grammar(nlohmann::ordered_json::parse(R"({"type": "integer"})"));
  const Outcome want = reference(r);
  const std::vector<int32_t> letter = plain_->model().tokenizer->encode("x", false, false);
  ASSERT_EQ(letter.size(), 1u);
  script_->forbidden = letter[0];
  const Outcome got = generate(*drafted_, r);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.text, want.text);
  EXPECT_GT(got.usage.draft_n, 0);
  EXPECT_EQ(got.usage.draft_n_accepted, got.usage.draft_n);
}

// Under batch pressure no sequence drafts: two requests that run side by
// side from their first decode step to their last get no guesses although
// every guess would be right, and their output is the plain one. Alone,
// the same request drafts.
TEST_F(EngineDraft, NoGuessesWhileAnotherSequenceRuns) {
  const GenerationRequest r = greedy(kPrompts[0], 12);
  const Outcome want = reference(r);
  // Both are queued before the first step (a prompt's, slowed) ends.
  std::future<Outcome> a = start(*pair_, r), b = start(*pair_, r);
  for (const Outcome& got : {a.get(), b.get()}) {
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.usage.draft_n, 0);
  }
  EXPECT_GT(generate(*pair_, r).usage.draft_n, 0);
}

// The KV a drafted request leaves is exactly that of its kept tokens: a
// prompt that extends them reuses the slot whole and gets the plain text.
TEST_F(EngineDraft, PrefixCacheReusesADraftedSequence) {
  const GenerationRequest a = greedy(kPrompts[1], 12);
  const Outcome first = reference(a);
  EXPECT_EQ(generate(*drafted_, a).tokens, first.tokens);
  // The slot holds the prompt and every output token but the last (never fed).
  const GenerationRequest b =
      greedy(concat(kPrompts[1], std::span<const int32_t>(first.tokens)), 12);
  const Outcome want = reference(b);
  const Outcome got = generate(*drafted_, b);
  EXPECT_EQ(got.usage.cached_tokens, int64_t(kPrompts[1].size() + first.tokens.size() - 1));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.usage.draft_n_accepted, 0);
}

// `serve --backend cuda --gpu-drafter`: the drafter's network on the GPU
// beside the target. A lone request drafts (threshold 0: whole blocks) and
// its greedy text is the plain server's; two requests at once run the plain
// batch (their slots' drafters lose step, as the CUDA batch does not
// capture) and stay correct, and a later lone request drafts again. Needs a
// GPU.
TEST(ServeDraftCuda, GpuDrafterKeepsThePlainText) {
  if (!backend_unavailable(Backend::Cuda).empty()) GTEST_SKIP() << backend_unavailable(Backend::Cuda);
  test::TempDir dir;
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-micro";
  o.seed = 11;
  o.dspark = true;
  write_synth_model(dir.file("m.gguf"), o);
  const std::vector<std::string> common = {"-m", dir.file("m.gguf"), "--model-id", "m", "--backend", "cuda",
                                           "--parallel", "2", "--ctx", "256", "--batch", "8", "--quiet"};
  std::vector<std::string> plain_args = common, gpu_args = common;
  plain_args.push_back("--no-draft");
  gpu_args.insert(gpu_args.end(), {"--gpu-drafter", "--draft-threshold", "0", "--draft-always"});
  ServeProcess plain(plain_args), gpu(gpu_args);
  for (const auto& prompt : kPrompts) {
    const json want = ok(plain.port(), "/v1/completions", completion(prompt, 40));
    const json got = ok(gpu.port(), "/v1/completions", completion(prompt, 40));
    EXPECT_EQ(text_of(got), text_of(want));
    EXPECT_GT(draft_n(got["usage"]), 0) << got.dump();
  }
  const json a = completion(kPrompts[0], 48), b = completion(kPrompts[2], 48);
  const json want_a = ok(plain.port(), "/v1/completions", a), want_b = ok(plain.port(), "/v1/completions", b);
  json got_a, got_b;
  std::thread ta([&] { got_a = ok(gpu.port(), "/v1/completions", a); });
  std::thread tb([&] { got_b = ok(gpu.port(), "/v1/completions", b); });
  ta.join();
  tb.join();
  EXPECT_EQ(text_of(got_a), text_of(want_a));
  EXPECT_EQ(text_of(got_b), text_of(want_b));
  const json again = ok(gpu.port(), "/v1/completions", completion(kPrompts[1], 24));
  EXPECT_EQ(text_of(again), text_of(ok(plain.port(), "/v1/completions", completion(kPrompts[1], 24))));
}

}  // namespace
}  // namespace baton
