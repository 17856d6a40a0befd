// Speculative decoding inside `baton serve` (docs/DSPARK.md, "Drafting in
// baton serve"): a synthetic deepseek4-tiny with a DSpark drafter in its file,
// served on the CPU with the drafter on (the default) and with --no-draft.
// Greedy output is the same token for token through both OpenAI routes,
// streamed or not; stop strings, max_tokens and a grammar cut inside a
// verified block as plain decoding would; two clients at once decode plain
// batched steps and stay correct; /metrics and usage count the guesses; a
// cancelled stream frees its slot; the prefix cache reuses a drafted
// sequence's KV.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

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
    o.shape = "deepseek4-tiny";
    o.seed = 11;
    o.dspark = true;
    write_synth_model(dir_->file("m.gguf"), o);
    const std::vector<std::string> common = {"-m", dir_->file("m.gguf"), "--model-id", "m", "--backend", "cpu",
                                             "--parallel", "2", "--ctx", "256", "--quiet"};
    std::vector<std::string> drafted = common, plain = common;
    drafted.insert(drafted.end(), {"--draft-threshold", "0"});  // every verify carries guesses
    plain.push_back("--no-draft");
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

int64_t draft_n(const json& usage) { return usage.value("draft_n", int64_t(0)); }

TEST_F(ServeDraft, GreedyOutputEqualsPlainThroughBothRoutes) {
  const double proposed0 = metric(drafted_->port(), "baton_draft_tokens_total");
  const double accepted0 = metric(drafted_->port(), "baton_draft_accepted_total");
  int64_t proposed = 0, accepted = 0;
  for (const auto& prompt : kPrompts) {
    SCOPED_TRACE(prompt.size());
    const json body = completion(prompt, 24);
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
  for (const char* q : {"Tell me a story.", "What is two and two?"}) {
    SCOPED_TRACE(q);
    const json body = chat(q, 20);
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
  for (size_t at : {size_t(3), text.size() / 2, text.size() - 4}) {
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

// Two clients at once: the engine decodes them in plain batched steps
// (no guesses while another request runs) and both get the plain text.
TEST_F(ServeDraft, TwoConcurrentClientsStayCorrect) {
  const json a = completion(kPrompts[0], 40), b = completion(kPrompts[2], 40);
  const json want_a = ok(plain_->port(), "/v1/completions", a);
  const json want_b = ok(plain_->port(), "/v1/completions", b);
  json got_a, got_b;
  std::thread ta([&] { got_a = ok(drafted_->port(), "/v1/completions", a); });
  std::thread tb([&] { got_b = ok(drafted_->port(), "/v1/completions", b); });
  ta.join();
  tb.join();
  EXPECT_EQ(text_of(got_a), text_of(want_a));
  EXPECT_EQ(text_of(got_b), text_of(want_b));
  // Together the two ran alone for at most part of their steps: fewer
  // guesses than the same two requests one after the other.
  const int64_t together = draft_n(got_a["usage"]) + draft_n(got_b["usage"]);
  const int64_t apart = draft_n(ok(drafted_->port(), "/v1/completions", a)["usage"]) +
                        draft_n(ok(drafted_->port(), "/v1/completions", b)["usage"]);
  EXPECT_LT(together, apart);
}

// The KV a drafted request leaves is exactly its kept tokens': a prompt that
// extends it reuses the slot whole and gets the plain server's text. A
// stream cancelled mid-generation frees its slot.
TEST_F(ServeDraft, PrefixCacheAndCancellation) {
  const std::vector<int32_t>& p = kPrompts[1];
  const json first = ok(drafted_->port(), "/v1/completions", completion(p, 10));
  std::vector<int32_t> longer = p;
  for (const json& t : ok(drafted_->port(), "/tokenize", {{"content", text_of(first)}})["tokens"]) {
    longer.push_back(t.get<int32_t>());
  }
  const json want = ok(plain_->port(), "/v1/completions", completion(longer, 12));
  const json got = ok(drafted_->port(), "/v1/completions", completion(longer, 12));
  EXPECT_EQ(text_of(got), text_of(want));
  EXPECT_GT(got["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0) << got.dump();

  const double cancelled0 = metric(drafted_->port(), "baton_generations_total{finish=\"cancelled\"}");
  json body = completion(p, 200);
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

}  // namespace
}  // namespace baton
