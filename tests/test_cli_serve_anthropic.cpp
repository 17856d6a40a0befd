// `baton serve`'s Anthropic Messages API and CORS end to end: the built
// binary on an ephemeral loopback port, with raw HTTP over sockets
// (tests/serve_client.h) and the official @anthropic-ai/sdk client
// (tests/serve/anthropic_client.mjs). A message gives the text and token
// counts of the same conversation on /v1/chat/completions, its stream the
// same text in the SDK's event order, count_tokens the prompt's length;
// refusals have Anthropic's shape and status; x-api-key works on every
// route; CORS preflights and answers carry the headers only with --cors.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;
namespace fs = std::filesystem;

const std::string kKey = "sk-test-anthropic";

// A template that renders tools and tool turns (Qwen 3's), so that the
// stories model takes the whole Messages API.
// A response's whole prompt: Anthropic counts the tokens computed
// (input_tokens) apart from those the prefix cache reused.
int64_t prompt_tokens(const json& usage) {
  return usage.at("input_tokens").get<int64_t>() + usage.value("cache_read_input_tokens", int64_t(0));
}

std::string tool_template() { return test::shared_dir() + "/chat_templates/Qwen-Qwen3-0.6B.jinja"; }

// The server most tests share: a key, the tool template, one allowed origin.
class AnthropicServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string key_file = dir_->file("key");
    test::write_file(key_file, std::vector<uint8_t>(kKey.begin(), kKey.end()));
    fs::permissions(key_file, fs::perms::owner_read | fs::perms::owner_write);
    server_ = new ServeProcess({"-m", stories(), "--quiet", "--chat-template", tool_template(), "--api-key-file",
                                key_file, "--cors", "https://app.example.com"});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->stop(), 0) << server_->stderr_text();
    delete server_;
    delete dir_;
  }
  static int port() { return server_->port(); }
  static inline test::TempDir* dir_ = nullptr;
  static inline ServeProcess* server_ = nullptr;
};

const std::vector<std::string> kAuth = {"x-api-key: " + kKey, "anthropic-version: 2023-06-01"};

// {"type": "error", "error": {"type", "message"}} with the status.
void expect_anthropic_error(const Response& r, int status, const std::string& type,
                            const std::string& message_start = "") {
  EXPECT_EQ(r.status, status) << r.body;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  EXPECT_EQ(j.value("type", ""), "error") << r.body;
  EXPECT_EQ(j["error"].value("type", ""), type) << r.body;
  EXPECT_EQ(j["error"].value("message", "").rfind(message_start, 0), 0u) << r.body;
}

// The (event name, data) pairs of an Anthropic event stream.
std::vector<std::pair<std::string, json>> anthropic_events(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  for (size_t at = 0; at < body.size();) {
    const size_t end = body.find("\n\n", at);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated event: " << body.substr(at);
      break;
    }
    const std::string ev = body.substr(at, end - at);
    at = end + 2;
    const size_t nl = ev.find('\n');
    if (ev.rfind("event: ", 0) != 0 || nl == std::string::npos || ev.compare(nl + 1, 6, "data: ") != 0) {
      ADD_FAILURE() << "malformed event: " << ev;
      continue;
    }
    out.emplace_back(ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7)));
  }
  return out;
}

// A response is counted once its last byte is written, which may be just
// after the client read it: the metric's value once it reaches `want`, or
// after 2 s.
double metric_soon(int port, const std::string& series, double want) {
  double v = metric(port, series);
  for (int i = 0; i < 40 && v != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v = metric(port, series);
  }
  return v;
}

json conversation() {
  return {{"model", kModel},
          {"max_tokens", 40},
          {"temperature", 0},
          {"system", "You are a storyteller."},
          {"messages", json::array({{{"role", "user"}, {"content", "Tell me a story about a dog."}}})}};
}

TEST_F(AnthropicServe, MessagesMatchChatCompletionsAndStreamsAgree) {
  const json req = conversation();
  Response r = post(port(), "/v1/messages", req, kAuth);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  const json msg = r.j();
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["model"], kModel);
  EXPECT_EQ(msg["id"].get<std::string>().rfind("msg_", 0), 0u);
  ASSERT_EQ(msg["content"].size(), 1u) << r.body;
  EXPECT_EQ(msg["content"][0]["type"], "text");
  const std::string text = msg["content"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(msg["stop_sequence"].is_null());

  // The same conversation on the OpenAI route (thinking off, as a message
  // without `thinking` renders it) gives the same greedy text and counts.
  json chat = {{"model", kModel},
               {"max_tokens", 40},
               {"temperature", 0},
               {"chat_template_kwargs", {{"enable_thinking", false}, {"thinking", false}}},
               {"messages", json::array({{{"role", "system"}, {"content", "You are a storyteller."}},
                                         {{"role", "user"}, {"content", "Tell me a story about a dog."}}})}};
  Response c = post(port(), "/v1/chat/completions", chat, {"Authorization: Bearer " + kKey});
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.j();
  EXPECT_EQ(cj["choices"][0]["message"]["content"], text);
  EXPECT_EQ(msg["usage"]["input_tokens"], cj["usage"]["prompt_tokens"]);
  EXPECT_EQ(msg["usage"]["output_tokens"], cj["usage"]["completion_tokens"]);
  EXPECT_EQ(msg["stop_reason"], cj["choices"][0]["finish_reason"] == "length" ? "max_tokens" : "end_turn");

  // count_tokens: the prompt's length, without max_tokens.
  json count_req = req;
  count_req.erase("max_tokens");
  Response n = post(port(), "/v1/messages/count_tokens", count_req, kAuth);
  ASSERT_EQ(n.status, 200) << n.body;
  EXPECT_EQ(n.j(), json({{"input_tokens", msg["usage"]["input_tokens"]}}));

  // Streamed: the SDK's event order and the same text.
  json sreq = req;
  sreq["stream"] = true;
  Response s = post(port(), "/v1/messages", sreq, kAuth);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.headers["content-type"], "text/event-stream");
  EXPECT_TRUE(s.chunked && s.complete);
  const auto events = anthropic_events(s.body);
  ASSERT_GE(events.size(), 7u) << s.body;
  std::vector<std::string> names;
  std::string streamed;
  for (const auto& [name, data] : events) {
    EXPECT_EQ(data["type"], name);
    names.push_back(name);
    if (name == "content_block_delta") {
      EXPECT_EQ(data["index"], 0);
      EXPECT_EQ(data["delta"]["type"], "text_delta");
      streamed += data["delta"]["text"].get<std::string>();
    }
  }
  EXPECT_EQ(names[0], "message_start");
  EXPECT_EQ(names[1], "ping");
  EXPECT_EQ(names[2], "content_block_start");
  EXPECT_EQ(names[names.size() - 4], "content_block_delta");
  EXPECT_EQ(names[names.size() - 3], "content_block_stop");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(events[0].second["message"]["usage"]["input_tokens"], msg["usage"]["input_tokens"]);
  const json delta = events[events.size() - 2].second;
  EXPECT_EQ(delta["delta"]["stop_reason"], msg["stop_reason"]);
  EXPECT_EQ(delta["usage"]["output_tokens"], msg["usage"]["output_tokens"]);

  // A stop sequence taken from the text ends it there.
  const size_t space = text.find(' ', 3);
  ASSERT_NE(space, std::string::npos) << text;
  const std::string seq = text.substr(space, 4);
  json stop_req = req;
  stop_req["stop_sequences"] = {seq};
  Response st = post(port(), "/v1/messages", stop_req, kAuth);
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(st.j()["stop_reason"], "stop_sequence");
  EXPECT_EQ(st.j()["stop_sequence"], seq);
  EXPECT_EQ(st.j()["content"][0]["text"], text.substr(0, text.find(seq)));

  // max_tokens: 1 ends at max_tokens.
  json one = req;
  one["max_tokens"] = 1;
  Response o = post(port(), "/v1/messages", one, kAuth);
  ASSERT_EQ(o.status, 200) << o.body;
  EXPECT_EQ(o.j()["stop_reason"], "max_tokens");
  EXPECT_EQ(o.j()["usage"]["output_tokens"], 1);

  EXPECT_EQ(metric_soon(port(), "baton_http_responses_total{endpoint=\"messages\",code=\"200\"}", 4), 4);
  EXPECT_EQ(metric_soon(port(), "baton_http_responses_total{endpoint=\"count_tokens\",code=\"200\"}", 1), 1);
}

// A tool_use round trip's request: tools in the prompt, a tool_result turn accepted.
TEST_F(AnthropicServe, ToolsAndToolResultsReachTheTemplate) {
  json req = {{"model", kModel},
              {"max_tokens", 5},
              {"tools", json::array({{{"name", "get_weather"},
                                      {"description", "The weather now"},
                                      {"input_schema", {{"type", "object"}}}}})},
              {"tool_choice", {{"type", "any"}}},
              {"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}},
                                        {{"role", "assistant"},
                                         {"content", json::array({{{"type", "tool_use"},
                                                                   {"id", "toolu_1"},
                                                                   {"name", "get_weather"},
                                                                   {"input", {{"city", "Paris"}}}}})}},
                                        {{"role", "user"},
                                         {"content", json::array({{{"type", "tool_result"},
                                                                   {"tool_use_id", "toolu_1"},
                                                                   {"content", "21C"}}})}}})}};
  Response r = post(port(), "/v1/messages", req, kAuth);
  ASSERT_EQ(r.status, 200) << r.body;
  json count_req = req;
  count_req.erase("max_tokens");
  const int64_t with_tools = post(port(), "/v1/messages/count_tokens", count_req, kAuth).j()["input_tokens"];
  EXPECT_EQ(prompt_tokens(r.j()["usage"]), with_tools);
  count_req.erase("tools");
  count_req.erase("tool_choice");
  const Response without = post(port(), "/v1/messages/count_tokens", count_req, kAuth);
  ASSERT_EQ(without.status, 200) << without.body;
  EXPECT_GT(with_tools, without.j()["input_tokens"].get<int64_t>());
}

TEST_F(AnthropicServe, RefusalsKeysAndVersions) {
  const json req = conversation();
  // The key from x-api-key or a Bearer token, on every /v1/ route.
  expect_anthropic_error(post(port(), "/v1/messages", req), 401, "authentication_error", "Incorrect or missing");
  expect_anthropic_error(post(port(), "/v1/messages", req, {"x-api-key: wrong"}), 401, "authentication_error");
  EXPECT_EQ(post(port(), "/v1/messages", req, {"Authorization: Bearer " + kKey}).status, 200);
  EXPECT_EQ(post(port(), "/v1/messages", req, {"x-api-key: " + kKey}).status, 200);  // no anthropic-version
  EXPECT_EQ(http(port(), "GET", "/v1/models", "", {"x-api-key: " + kKey}).status, 200);
  expect_error(http(port(), "GET", "/v1/models", "", {"x-api-key: wrong"}), 401, "invalid_api_key");

  json no_max = req;
  no_max.erase("max_tokens");
  expect_anthropic_error(post(port(), "/v1/messages", no_max, kAuth), 400, "invalid_request_error",
                         "max_tokens: ");
  json bad_block = req;
  bad_block["messages"][0]["content"] = json::array({{{"type", "image"}}});
  expect_anthropic_error(post(port(), "/v1/messages", bad_block, kAuth), 400, "invalid_request_error",
                         "messages.0.content.0.type: ");
  json other = req;
  other["model"] = "claude-opus-4";
  expect_anthropic_error(post(port(), "/v1/messages", other, kAuth), 404, "not_found_error", "model: ");
  json too_long = req;
  too_long["max_tokens"] = 100000;
  expect_anthropic_error(post(port(), "/v1/messages", too_long, kAuth), 400, "invalid_request_error",
                         "max_tokens: ");
  expect_anthropic_error(http(port(), "POST", "/v1/messages", "{\"model\":", kAuth), 400, "invalid_request_error");
  expect_anthropic_error(http(port(), "GET", "/v1/messages", "", kAuth), 405, "invalid_request_error");
  expect_anthropic_error(post(port(), "/v1/messages/batches", req, kAuth), 404, "not_found_error");
  expect_anthropic_error(post(port(), "/v1/messages/count_tokens", json{{"model", kModel}}, kAuth), 400,
                         "invalid_request_error", "messages: ");
  // The OpenAI routes keep OpenAI's shape.
  expect_error(post(port(), "/v1/chat/completions", json{{"model", kModel}}, kAuth), 400,
               "missing_required_parameter", "messages");
}

Response options(int port, const std::vector<std::string>& headers) {
  return http(port, "OPTIONS", "/v1/messages", "", headers);
}

TEST_F(AnthropicServe, CorsPreflightAndAnswers) {
  // A preflight needs no key (browsers send none with it).
  Response pre = options(port(), {"Origin: https://app.example.com", "Access-Control-Request-Method: POST",
                                  "Access-Control-Request-Headers: x-api-key, anthropic-version, content-type, "
                                  "x-stainless-os"});
  EXPECT_EQ(pre.status, 204);
  EXPECT_TRUE(pre.body.empty());
  EXPECT_EQ(pre.headers.count("content-length"), 0u);
  EXPECT_EQ(pre.headers["access-control-allow-origin"], "https://app.example.com");
  EXPECT_EQ(pre.headers["access-control-allow-methods"], "GET, POST, OPTIONS");
  const std::string allowed = pre.headers["access-control-allow-headers"];
  for (const char* h : {"authorization", "x-api-key", "anthropic-version", "content-type", "x-stainless-os"}) {
    EXPECT_NE(allowed.find(h), std::string::npos) << h << " in " << allowed;
  }
  EXPECT_EQ(pre.headers["vary"], "Origin");

  // A real request from that origin carries it; another origin's does not.
  std::vector<std::string> h = kAuth;
  h.push_back("Origin: https://app.example.com");
  const json count_req = {{"model", kModel}, {"messages", conversation()["messages"]}};
  Response ok = post(port(), "/v1/messages/count_tokens", count_req, h);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.headers["access-control-allow-origin"], "https://app.example.com");
  h.back() = "Origin: https://evil.example.com";
  Response evil = post(port(), "/v1/messages/count_tokens", count_req, h);
  EXPECT_EQ(evil.status, 200);
  EXPECT_EQ(evil.headers.count("access-control-allow-origin"), 0u);
  // Refusals and streams carry it too.
  Response refused = post(port(), "/v1/messages", conversation(), {"Origin: https://app.example.com"});
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(refused.headers["access-control-allow-origin"], "https://app.example.com");
  json sreq = conversation();
  sreq["stream"] = true;
  sreq["max_tokens"] = 3;
  h.back() = "Origin: https://app.example.com";
  Response stream = post(port(), "/v1/messages", sreq, h);
  EXPECT_EQ(stream.status, 200);
  EXPECT_EQ(stream.headers["access-control-allow-origin"], "https://app.example.com");
}

// Without --cors: no CORS headers, and OPTIONS is a method the API does not take.
TEST(AnthropicServeNoCors, NoHeadersWithoutTheFlag) {
  ServeProcess server({"-m", stories(), "--quiet"});
  Response pre = options(server.port(), {"Origin: https://app.example.com", "Access-Control-Request-Method: POST"});
  expect_anthropic_error(pre, 405, "invalid_request_error");
  const json req = {{"model", kModel},
                    {"max_tokens", 3},
                    {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  Response r = post(server.port(), "/v1/messages", req, {"Origin: https://app.example.com"});
  EXPECT_EQ(r.status, 200) << r.body;  // no key file: any key, or none
  for (const auto& [name, value] : r.headers) EXPECT_EQ(name.rfind("access-control-", 0), std::string::npos) << name;
  EXPECT_EQ(pre.headers.count("access-control-allow-origin"), 0u);
  // The stories model has no template: its plain format renders text turns
  // only, and tools are refused by name.
  json tools = req;
  tools["tools"] = json::array({{{"name", "f"}, {"input_schema", {{"type", "object"}}}}});
  expect_anthropic_error(post(server.port(), "/v1/messages", tools), 400, "invalid_request_error", "tools: ");
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();

  // A malformed origin list is refused at start, by name.
  auto bad = test::run_command({test::baton_binary(), "serve", "-m", stories(), "--port", "0", "--cors", "ftp://x"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--cors takes '*' or origins"), std::string::npos) << bad.err;
}

// ---- the official @anthropic-ai/sdk client ----

TEST_F(AnthropicServe, OfficialAnthropicNodeClient) {
  if (test::run_command({"/usr/bin/env", "node", "--version"}).exit_code != 0) GTEST_SKIP() << "node is not installed";
  const fs::path scripts = test::source_path("tests/serve");
  ASSERT_TRUE(fs::exists(scripts / "node_modules" / "@anthropic-ai" / "sdk" / "package.json"))
      << "run 'npm ci' in " << scripts << " (scripts/test.sh does)";
  auto r = test::run_command({"/usr/bin/env", "node", (scripts / "anthropic_client.mjs").string(), "--base-url",
                              "http://127.0.0.1:" + std::to_string(port()), "--model", kModel, "--api-key", kKey,
                              "--max-tokens", "30"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json out = json::parse(r.out);

  // The OpenAI route's greedy text of the same conversation.
  json chat = {{"model", kModel},
               {"max_tokens", 30},
               {"temperature", 0},
               {"chat_template_kwargs", {{"enable_thinking", false}, {"thinking", false}}},
               {"messages", json::array({{{"role", "system"}, {"content", "You are a storyteller."}},
                                         {{"role", "user"}, {"content", "Tell me a story about a dog."}}})}};
  const json cj = post(port(), "/v1/chat/completions", chat, {"Authorization: Bearer " + kKey}).j();
  const std::string want = cj["choices"][0]["message"]["content"];
  EXPECT_EQ(out["create"]["text"], want);
  EXPECT_EQ(out["create"]["blocks"], json::array({"text"}));
  EXPECT_EQ(prompt_tokens(out["create"]["usage"]), cj["usage"]["prompt_tokens"]);
  EXPECT_EQ(out["create"]["usage"]["output_tokens"], cj["usage"]["completion_tokens"]);
  EXPECT_EQ(out["stream"]["text"], want);
  EXPECT_EQ(out["stream"]["final_text"], want);
  EXPECT_EQ(out["stream"]["stop_reason"], out["create"]["stop_reason"]);
  EXPECT_EQ(out["stream"]["usage"]["output_tokens"], out["create"]["usage"]["output_tokens"]);
  EXPECT_EQ(prompt_tokens(out["stream"]["usage"]), prompt_tokens(out["create"]["usage"]));
  const json events = out["stream"]["events"];
  EXPECT_EQ(events[0], "message_start");
  EXPECT_EQ(events[1], "content_block_start");  // the SDK hides ping
  EXPECT_EQ(events[events.size() - 3], "content_block_stop");
  EXPECT_EQ(events[events.size() - 2], "message_delta");
  EXPECT_EQ(out["count_tokens"], prompt_tokens(out["create"]["usage"]));
  ASSERT_TRUE(out.contains("stop")) << "the greedy text has fewer than two words: " << want;
  EXPECT_EQ(out["stop"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(out["stop"]["stop_sequence"], out["stop"]["sequence"]);
  EXPECT_EQ(out["stop"]["text"], want.substr(0, want.find(out["stop"]["sequence"].get<std::string>())));
  EXPECT_EQ(out["tools"]["input_tokens"], out["tools"]["count_with_tools"]);
  EXPECT_GT(out["tools"]["count_with_tools"].get<int>(), out["tools"]["count_without_tools"].get<int>());
  EXPECT_EQ(out["errors"]["bad_model"]["status"], 404);
  EXPECT_EQ(out["errors"]["bad_model"]["class"], "NotFoundError");
  EXPECT_EQ(out["errors"]["bad_model"]["type"], "not_found_error");
  EXPECT_EQ(out["errors"]["no_max_tokens"]["status"], 400);
  EXPECT_EQ(out["errors"]["no_max_tokens"]["class"], "BadRequestError");
  EXPECT_EQ(out["errors"]["no_max_tokens"]["message"].get<std::string>().rfind("max_tokens: ", 0), 0u);
  EXPECT_EQ(out["errors"]["bad_key"]["status"], 401);
  EXPECT_EQ(out["errors"]["bad_key"]["class"], "AuthenticationError");
}

}  // namespace
}  // namespace baton
