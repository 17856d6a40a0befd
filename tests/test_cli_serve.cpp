// `baton serve` end to end: the built binary on an ephemeral loopback port,
// driven with raw HTTP over sockets (tests/serve_client.h). Greedy output
// equals `baton run`'s, streams are well formed, every bad input gets its
// OpenAI-style 4xx, API keys, the bounded queue (429), cancellation on
// disconnect, the official `openai` npm client (tests/serve/), and a short
// load test whose counts must match /metrics. The same server over worker
// processes is test_cli_serve_cluster.cpp; the pure pieces are test_coord_api.cpp.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;
using namespace std::chrono_literals;

// ---- end to end ----

TEST(Serve, GreedyCompletionEqualsBatonRunAndStreamsAgree) {
  ServeProcess server({"-m", stories()});
  const int port = server.port();
  for (const std::string prompt : {"Once upon a time", "Tom and his dog"}) {
    SCOPED_TRACE(prompt);
    json run = run_json(prompt, 48);
    const std::string want = run["text"];
    json req = {{"model", kModel}, {"prompt", prompt}, {"max_tokens", 48}, {"temperature", 0}};
    Response r = post(port, "/v1/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.j();
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["model"], kModel);
    EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(j["choices"][0]["text"], want);
    EXPECT_EQ(j["choices"][0]["finish_reason"], run["stop"] == "length" ? "length" : "stop");
    EXPECT_EQ(j["usage"]["prompt_tokens"], run["n_prompt"]);
    EXPECT_EQ(j["usage"]["completion_tokens"], run["n_gen"]);
    EXPECT_EQ(j["usage"]["total_tokens"], run["n_prompt"].get<int>() + run["n_gen"].get<int>());

    // The same request streamed: chunks of the same text, then [DONE].
    req["stream"] = true;
    req["stream_options"] = {{"include_usage", true}};
    Response s = post(port, "/v1/completions", req);
    ASSERT_EQ(s.status, 200);
    EXPECT_TRUE(s.chunked && s.complete);
    EXPECT_EQ(s.headers["content-type"], "text/event-stream");
    auto events = sse_events(s.body);
    ASSERT_GE(events.size(), 3u);
    EXPECT_EQ(events.back(), "[DONE]");
    std::string text, finish;
    json usage;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      json c = json::parse(events[i]);
      EXPECT_EQ(c["id"].get<std::string>().rfind("cmpl-", 0), 0u);
      EXPECT_EQ(c["object"], "text_completion");
      EXPECT_EQ(c["model"], kModel);
      ASSERT_TRUE(c.contains("usage"));
      if (c["choices"].empty()) {
        usage = c["usage"];
        EXPECT_EQ(i + 2, events.size()) << "usage comes last";
        continue;
      }
      EXPECT_TRUE(c["usage"].is_null());
      text += c["choices"][0]["text"].get<std::string>();
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, want);
    EXPECT_EQ(finish, j["choices"][0]["finish_reason"]);
    for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) EXPECT_EQ(usage[k], j["usage"][k]) << k;
    // The same prompt again: the prefix cache held all of it but the last
    // token (computed for its logits); the first time it held none.
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], run["n_prompt"].get<int>() - 1);
  }

  // Logprobs: greedy picks the most likely token, so each chosen logprob is
  // the first alternative's.
  Response lp = post(port, "/v1/completions",
                     {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0},
                      {"logprobs", 3}});
  ASSERT_EQ(lp.status, 200) << lp.body;
  json l = lp.j()["choices"][0]["logprobs"];
  ASSERT_EQ(l["tokens"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(l["top_logprobs"][i].size(), 3u);
    double best = -1e9;
    for (auto& [k, v] : l["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(l["token_logprobs"][i].get<double>(), best, 1e-5);
    EXPECT_LE(l["token_logprobs"][i].get<double>(), 0.0);
  }
  std::string joined;
  for (auto& t : l["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, lp.j()["choices"][0]["text"]);
}

TEST(Serve, ChatStreamsTheSameAsNonStreamingAndSeedsRepeat) {
  ServeProcess server({"-m", stories()});
  const int port = server.port();
  json req = {{"model", kModel},
              {"messages", {{{"role", "system"}, {"content", "You tell stories."}},
                            {{"role", "user"}, {"content", "Tell me about a cat."}}}},
              {"max_tokens", 40},
              {"temperature", 0.9},
              {"seed", 1234},
              {"logprobs", true},
              {"top_logprobs", 2}};
  Response a = post(port, "/v1/chat/completions", req);
  ASSERT_EQ(a.status, 200) << a.body;
  json ja = a.j();
  EXPECT_EQ(ja["object"], "chat.completion");
  EXPECT_EQ(ja["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(ja["choices"][0]["message"]["role"], "assistant");
  const std::string text = ja["choices"][0]["message"]["content"];
  EXPECT_FALSE(text.empty());
  const json& content = ja["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(int(content.size()), ja["usage"]["completion_tokens"].get<int>());
  for (const json& t : content) {
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_TRUE(t["bytes"].is_array());
  }
  // The same seed gives the same text; another seed other text.
  Response again = post(port, "/v1/chat/completions", req);
  EXPECT_EQ(again.j()["choices"][0]["message"]["content"], text);
  json other = req;
  other["seed"] = 999;
  EXPECT_NE(post(port, "/v1/chat/completions", other).j()["choices"][0]["message"]["content"], text);

  req["stream"] = true;
  Response s = post(port, "/v1/chat/completions", req);
  ASSERT_EQ(s.status, 200);
  auto events = sse_events(s.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  size_t n_logprobs = 0;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]) << "one id per stream";
    const json& ch = c["choices"][0];
    if (ch["delta"].contains("content")) streamed += ch["delta"]["content"].get<std::string>();
    if (!ch["logprobs"].is_null()) n_logprobs += ch["logprobs"]["content"].size();
    if (!ch["finish_reason"].is_null()) {
      finish = ch["finish_reason"];
      EXPECT_EQ(i + 2, events.size());
    }
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(n_logprobs, content.size());
  EXPECT_EQ(finish, ja["choices"][0]["finish_reason"]);

  Response models = http(port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.j()["data"][0]["id"], kModel);
  EXPECT_EQ(http(port, "GET", "/v1/models/" + kModel).j()["id"], kModel);
  expect_error(http(port, "GET", "/v1/models/gpt-4"), 404, "model_not_found");
}

TEST(Serve, IgnoreEosRunsToMaxTokens) {
  ServeProcess server({"-m", stories(), "--quiet"});
  check_ignore_eos(server.port());
}

TEST(Serve, HealthAndMetricsDescribeTheRoute) {
  ServeProcess server({"-m", stories(), "--parallel", "3", "--queue", "5", "--ctx", "256"});
  const int port = server.port();
  Response h = http(port, "GET", "/health");
  ASSERT_EQ(h.status, 200);
  json j = h.j();
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["model"], kModel);
  EXPECT_EQ(j["n_ctx"], 256);
  EXPECT_EQ(j["slots"]["total"], 3);
  EXPECT_EQ(j["queue"]["capacity"], 5);
  ASSERT_EQ(j["stages"].size(), 1u);
  const json& st = j["stages"][0];
  EXPECT_EQ(st["state"], "loaded");
  EXPECT_EQ(st["layers"], "0:4");
  EXPECT_EQ(st["progress"], 1.0);
  EXPECT_TRUE(st["embedding"].get<bool>() && st["head"].get<bool>());
  EXPECT_GT(st["memory"]["planned"]["weights"].get<uint64_t>(), 1000000u);
  EXPECT_GT(st["memory"]["planned"]["kv cache"].get<uint64_t>(), 0u);
  EXPECT_EQ(st["memory"]["used"], st["memory"]["planned_total"]);
  EXPECT_GT(st["memory"]["rss"].get<uint64_t>(), 0u);

  Response done = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 5}});
  ASSERT_EQ(done.status, 200);
  const json usage = done.j()["usage"];
  Response m = http(port, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.headers["content-type"].rfind("text/plain", 0), 0u);
  for (const char* series : {"baton_http_responses_total{endpoint=\"completions\",code=\"200\"} 1",
                             "baton_slots_total 3", "baton_queue_capacity 5",
                             "baton_time_to_first_token_seconds_count 1", "baton_up 1",
                             "baton_stage_forward_seconds_count{stage=\"0\",phase=\"prefill\"} 1",
                             "baton_memory_bytes{node=\"local\",layers=\"0:4\",kind=\"planned\"}"}) {
    EXPECT_NE(m.body.find(series), std::string::npos) << series << "\n" << m.body;
  }
  EXPECT_EQ(metric(port, "baton_prompt_tokens_total"), usage["prompt_tokens"].get<double>());
  EXPECT_EQ(metric(port, "baton_completion_tokens_total"), usage["completion_tokens"].get<double>());
  EXPECT_GT(usage["completion_tokens"].get<int>(), 0);
  EXPECT_GT(metric(port, "baton_decode_tokens_per_second"), 0);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, BadInputGetsOpenAiErrorsAndNeverCrashes) {
  ServeProcess server({"-m", stories(), "--ctx", "64", "--max-body", "65536", "--request-timeout", "1"});
  const int port = server.port();
  const std::string chat = "/v1/chat/completions", comp = "/v1/completions";
  const json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  auto with = [&](json base, const std::string& key, json value) {
    base[key] = std::move(value);
    return base;
  };
  const json good_chat = {{"model", kModel}, {"messages", msgs}, {"max_tokens", 4}};
  const json good_comp = {{"model", kModel}, {"prompt", "Once"}, {"max_tokens", 4}};
  ASSERT_EQ(post(port, chat, good_chat).status, 200);
  ASSERT_EQ(post(port, comp, good_comp).status, 200);

  // Malformed bodies.
  expect_error(http(port, "POST", chat, "{\"model\": "), 400, "invalid_json");
  expect_error(http(port, "POST", comp, "[1, 2, 3]"), 400, "invalid_json");
  expect_error(http(port, "POST", comp, ""), 400, "invalid_json");
  expect_error(http(port, "POST", comp, "{\"model\":\"stories260K\",\"prompt\":\"\xff\xfe\"}"), 400, "invalid_json");
  // Wrong types and values.
  expect_error(post(port, chat, with(good_chat, "temperature", "hot")), 400, "invalid_type", "temperature");
  expect_error(post(port, chat, with(good_chat, "temperature", 3.5)), 400, "invalid_value", "temperature");
  expect_error(post(port, comp, with(good_comp, "max_tokens", "5")), 400, "invalid_type", "max_tokens");
  expect_error(post(port, comp, with(good_comp, "max_tokens", 0)), 400, "invalid_value", "max_tokens");
  expect_error(post(port, comp, with(good_comp, "max_tokens", 2.5)), 400, "invalid_type", "max_tokens");
  expect_error(post(port, comp, with(good_comp, "top_p", -0.1)), 400, "invalid_value", "top_p");
  expect_error(post(port, comp, with(good_comp, "top_k", true)), 400, "invalid_type", "top_k");
  expect_error(post(port, comp, with(good_comp, "stream", "yes")), 400, "invalid_type", "stream");
  expect_error(post(port, comp, with(good_comp, "stop", 5)), 400, "invalid_type", "stop");
  expect_error(post(port, comp, with(good_comp, "seed", "x")), 400, "invalid_type", "seed");
  expect_error(post(port, comp, with(good_comp, "logprobs", 9)), 400, "invalid_value", "logprobs");
  expect_error(post(port, chat, with(good_chat, "logprobs", 3)), 400, "invalid_type", "logprobs");
  expect_error(post(port, chat, with(good_chat, "top_logprobs", 2)), 400, "", "top_logprobs");
  expect_error(post(port, comp, with(good_comp, "logit_bias", {{"abc", 1}})), 400, "", "logit_bias");
  expect_error(post(port, comp, with(good_comp, "logit_bias", {{"99999", 1}})), 400, "", "logit_bias");
  expect_error(post(port, comp, with(good_comp, "n", 2)), 400, "unsupported_parameter", "n");
  expect_error(post(port, comp, with(good_comp, "mirostat", 2)), 400, "unsupported_parameter", "mirostat");
  expect_error(post(port, comp, with(good_comp, "presence_penalty", 2.5)), 400, "invalid_value", "presence_penalty");
  // Tools: a malformed one is named; a good one is refused by a model without
  // a Jinja template (stories260K renders with the plain format), and by completions.
  expect_error(post(port, chat, with(good_chat, "tools", json::array({{{"type", "function"}}}))), 400,
               "missing_required_parameter", "tools.[0].function");
  const json tool = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  expect_error(post(port, chat, with(good_chat, "tools", json::array({tool}))), 400, "unsupported_parameter", "tools");
  expect_error(post(port, comp, with(good_comp, "tools", json::array({tool}))), 400, "unsupported_parameter", "tools");
  expect_error(post(port, chat, with(good_chat, "tool_choice", "required")), 400, "invalid_value", "tool_choice");
  expect_error(post(port, comp, with(good_comp, "prompt", json::array({1, 99999}))), 400, "", "prompt");
  expect_error(post(port, comp, with(good_comp, "prompt", json::array({"a", "b"}))), 400, "", "prompt");
  expect_error(post(port, comp, with(good_comp, "prompt", 42)), 400, "invalid_type", "prompt");
  // Messages.
  expect_error(post(port, chat, with(good_chat, "messages", "hi")), 400, "invalid_type", "messages");
  expect_error(post(port, chat, with(good_chat, "messages", json::array())), 400, "", "messages");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"role", "tool"}, {"content", "x"}}}))), 400,
               "unsupported_parameter");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"content", "x"}}}))), 400, "");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"role", "user"}, {"content", 7}}}))), 400,
               "invalid_type");
  json no_messages = good_chat;
  no_messages.erase("messages");
  expect_error(post(port, chat, no_messages), 400, "missing_required_parameter", "messages");
  // The model.
  json no_model = good_comp;
  no_model.erase("model");
  expect_error(post(port, comp, no_model), 400, "missing_required_parameter", "model");
  expect_error(post(port, comp, with(good_comp, "model", "gpt-4o")), 404, "model_not_found", "model");
  expect_error(post(port, chat, with(good_chat, "model", 12)), 400, "invalid_type", "model");
  // The context (64 tokens): a long prompt, and max_tokens beyond what is left.
  std::string long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt += "once upon a time ";
  expect_error(post(port, comp, with(good_comp, "prompt", long_prompt)), 400, "context_length_exceeded");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"role", "user"}, {"content", long_prompt}}}))),
               400, "context_length_exceeded");
  expect_error(post(port, comp, with(good_comp, "max_tokens", 64)), 400, "context_length_exceeded", "max_tokens");
  // A text that cannot fit whatever its tokens is refused without tokenizing
  // it (tokenizing costs time that grows faster than the text).
  {
    auto t0 = std::chrono::steady_clock::now();
    expect_error(post(port, comp, with(good_comp, "prompt", std::string(60000, 'x'))), 400, "context_length_exceeded",
                 "prompt");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
  expect_error(post(port, chat, with(good_chat, "max_completion_tokens", 1000)), 400, "context_length_exceeded",
               "max_completion_tokens");
  // Routes and methods.
  expect_error(http(port, "GET", comp), 405, "method_not_allowed");
  expect_error(http(port, "DELETE", "/v1/models"), 405, "method_not_allowed");
  expect_error(http(port, "GET", "/v1/embeddings"), 404, "unknown_url");
  expect_error(http(port, "GET", "/"), 404, "unknown_url");

  // Oversized bodies: refused from the Content-Length alone, and when sent.
  {
    int fd = connect_to(port);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: 100000000\r\n\r\n");
    expect_error(parse_response(read_all(fd)), 413, "too_large");
    close(fd);
  }
  expect_error(post(port, comp, with(good_comp, "prompt", std::string(70000, 'a'))), 413, "too_large");
  // A header block over the limit.
  expect_error(http(port, "GET", "/health", "", {"X-Big: " + std::string(20000, 'x')}), 431, "header_too_large");
  // Not HTTP at all.
  {
    int fd = connect_to(port);
    send_all(fd, "HELLO THERE\r\n\r\n");
    expect_error(parse_response(read_all(fd)), 400, "bad_http");
    close(fd);
  }
  // Slow loris: half a request, then silence past the 1 s deadline: 408 and
  // the connection is closed by the server.
  {
    int fd = connect_to(port, 10s);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n");
    auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(300ms);
    send_all(fd, "X-Drip: 1\r\n");  // dripping bytes does not extend the deadline
    Response r = parse_response(read_all(fd));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    expect_error(r, 408, "timeout");
    EXPECT_LT(waited, 5.0);
    close(fd);
  }
  // A connection that sends nothing is closed after the deadline.
  {
    int fd = connect_to(port, 10s);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(read_all(fd), "");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    close(fd);
  }

  // Still serving, and the refusals were counted.
  ASSERT_EQ(post(port, comp, good_comp).status, 200);
  EXPECT_GE(metric(port, "baton_errors_total{kind=\"bad_request\"}"), 25);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"model_not_found\"}"), 1);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"context_length\"}"), 5);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"too_large\"}"), 2);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"timeout\"}"), 1);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, ApiKeyIsRequiredComparedAndNeverLogged) {
  test::TempDir dir;
  const std::string key = "sk-baton-test-5f3c9a";
  const std::string file = dir.file("key.txt");
  test::write_file(file, std::vector<uint8_t>(key.begin(), key.end()));
  {
    std::string with_nl = key + "\n";
    test::write_file(file, std::vector<uint8_t>(with_nl.begin(), with_nl.end()));
  }
  ServeProcess server({"-m", stories(), "--api-key-file", file});
  const int port = server.port();
  const json req = {{"model", kModel}, {"prompt", "Once"}, {"max_tokens", 3}};
  Response none = post(port, "/v1/completions", req);
  expect_error(none, 401, "invalid_api_key");
  EXPECT_EQ(none.headers["www-authenticate"], "Bearer");
  expect_error(post(port, "/v1/completions", req, {"Authorization: Bearer sk-wrong"}), 401, "invalid_api_key");
  expect_error(post(port, "/v1/completions", req, {"Authorization: Bearer " + key + "x"}), 401, "invalid_api_key");
  expect_error(post(port, "/v1/completions", req, {"Authorization: " + key}), 401, "invalid_api_key");
  expect_error(http(port, "GET", "/v1/models"), 401, "invalid_api_key");
  EXPECT_EQ(post(port, "/v1/completions", req, {"Authorization: Bearer " + key}).status, 200);
  EXPECT_EQ(http(port, "GET", "/v1/models", "", {"authorization: bearer " + key}).status, 200);
  EXPECT_EQ(http(port, "GET", "/health").status, 200);  // probes need no key
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"unauthorized\"}"), 5);
  EXPECT_EQ(server.stop(), 0);
  EXPECT_EQ(server.stderr_text().find(key), std::string::npos) << server.stderr_text();

  // An empty key file is refused at start.
  test::write_file(dir.file("empty.txt"), {'\n'});
  auto r = test::run_command({test::baton_binary(), "serve", "-m", stories(), "--api-key-file", dir.file("empty.txt"),
                              "--port", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;
}

TEST(Serve, FullQueueAnswers429AndDisconnectsFreeTheSlots) {
  ServeProcess server({"-m", stories(), "--parallel", "1", "--queue", "1", "--ctx", "2048"});
  const int port = server.port();
  // A holds the only slot; B waits in the only queue place; C is refused.
  int a = start_long_stream(port, 2000);
  int b = connect_to(port);
  send_all(b, request_text("POST", "/v1/completions",
                           json{{"model", kModel}, {"prompt", "Hello"}, {"max_tokens", 1000}, {"logit_bias", {{"2", -100}}}}
                               .dump()));
  // B is queued once /health says so.
  bool queued = false;
  for (int i = 0; i < 200 && !queued; ++i) {
    queued = health(port)["queue"]["depth"] == 1;
    if (!queued) std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(queued);
  Response c = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  expect_error(c, 429, "rate_limit_exceeded");
  EXPECT_EQ(c.headers["retry-after"], "1");
  EXPECT_EQ(c.j()["error"]["type"], "rate_limit_error");
  json h = health(port);
  EXPECT_EQ(h["slots"]["busy"], 1);
  EXPECT_EQ(h["queue"]["depth"], 1);

  // A streaming client goes away: its sequence is cancelled and B takes the slot.
  close(a);
  bool b_running = false;
  for (int i = 0; i < 400 && !b_running; ++i) {
    json hh = health(port);
    b_running = hh["queue"]["depth"] == 0 && hh["slots"]["busy"] == 1;
    if (!b_running) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(b_running);
  // A non-streaming client goes away while its answer is being generated.
  close(b);
  EXPECT_TRUE(wait_idle(port, 10s));
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"cancelled\"}"), 2);
  EXPECT_EQ(metric(port, "baton_slots_busy"), 0);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"queue_full\"}"), 1);
  EXPECT_EQ(metric(port, "baton_streams_open"), 0);
  // The freed slot serves the next request.
  EXPECT_EQ(post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}}).status, 200);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, CommandLineRefusals) {
  auto serve = [](std::vector<std::string> args) {
    args.insert(args.begin(), {test::baton_binary(), "serve"});
    return test::run_command(args);
  };
  auto workers = serve({"-m", stories(), "--workers", "0"});
  EXPECT_EQ(workers.exit_code, 1);
  EXPECT_NE(workers.err.find("--workers must be in 1..64"), std::string::npos) << workers.err;
  auto too_many = serve({"-m", stories(), "--workers", "6", "--port", "0"});
  EXPECT_EQ(too_many.exit_code, 1);
  EXPECT_NE(too_many.err.find("6 workers for 5 layers"), std::string::npos) << too_many.err;
  auto config = serve({"--config", "/nonexistent/cluster.toml"});
  EXPECT_EQ(config.exit_code, 1);
  EXPECT_NE(config.err.find("cannot read the config file /nonexistent/cluster.toml"), std::string::npos) << config.err;
  // Without a model serve takes run's default (test_cli_serve_flags); a
  // remote config still names one.
  test::TempDir dir;
  const std::string remote = "[cluster]\nworkers = 1\nlocal = false\nlisten = \"127.0.0.1:0\"\nsecret_file = \"" +
                             dir.file("s") + "\"\n";
  test::write_file(dir.file("remote.toml"), std::vector<uint8_t>(remote.begin(), remote.end()));
  auto none = serve({"--config", dir.file("remote.toml"), "--port", "0"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("[model] needs path"), std::string::npos) << none.err;
  auto missing = serve({"-m", "/nonexistent/model.gguf", "--port", "0"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("model.gguf"), std::string::npos) << missing.err;
  auto help = serve({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* s : {"--model", "--config", "--workers", "--host", "--port", "--api-key-file", "--ctx",
                        "--parallel", "--queue", "--threads", "--max-body", "--request-timeout", "/v1/chat/completions",
                        "/health", "/metrics", "429", "listening on", "--chat-template"}) {
    EXPECT_NE(help.out.find(s), std::string::npos) << s;
  }
}

// --chat-template FILE renders chat prompts with that Jinja template: a chat
// whose template writes BOS and the user's text is the plain completion of
// that text, token for token; the template's raise_exception is a 400; a
// template the engine cannot run stops the server at start, naming the construct.
TEST(Serve, ChatTemplateFileRendersChatPrompts) {
  test::TempDir tmp;
  const std::string tmpl = tmp.file("chat.jinja");
  const std::string text =
      "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}\n"
      "{% if messages[-1].role == 'tool' %}{{ raise_exception('a tool result cannot come last') }}{% endif %}\n";
  test::write_file(tmpl, std::vector<uint8_t>(text.begin(), text.end()));
  ServeProcess server({"-m", stories(), "--chat-template", tmpl});
  const int port = server.port();
  json chat = {{"model", kModel}, {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
               {"max_tokens", 12}, {"temperature", 0}};
  Response c = post(port, "/v1/chat/completions", chat);
  ASSERT_EQ(c.status, 200) << c.body;
  Response p = post(port, "/v1/completions",
                    {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(c.j()["usage"]["prompt_tokens"], p.j()["usage"]["prompt_tokens"]);
  EXPECT_EQ(c.j()["choices"][0]["message"]["content"], p.j()["choices"][0]["text"]);
  EXPECT_EQ(http(port, "GET", "/v1/models").j()["data"][0]["meta"]["chat_template"], "jinja");
  chat["messages"].push_back({{"role", "tool"}, {"content", "42"}});
  Response refused = post(port, "/v1/chat/completions", chat);
  expect_error(refused, 400, "invalid_value");
  EXPECT_NE(refused.body.find("a tool result cannot come last"), std::string::npos) << refused.body;
  server.stop();

  const std::string bad = tmp.file("bad.jinja");
  const std::string bad_text = "{{ messages | shuffle }}";
  test::write_file(bad, std::vector<uint8_t>(bad_text.begin(), bad_text.end()));
  auto r = test::run_command({test::baton_binary(), "serve", "-m", stories(), "--port", "0", "--chat-template", bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unsupported filter 'shuffle' at line 1"), std::string::npos) << r.err;
}

// ---- the official openai npm client ----

TEST(Serve, OfficialOpenAiNodeClient) { check_official_client({}); }

// ---- load ----

TEST(Serve, LoadStreamsAllFinishAndMetricsMatch) {
  run_load_test({}, env_int("BATON_SERVE_LOAD_CLIENTS", 16), env_int("BATON_SERVE_LOAD_SECONDS", 10));
}

}  // namespace
}  // namespace baton
