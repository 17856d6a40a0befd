// The Anthropic Messages API's pure pieces, driven directly (no server):
// request parsing (content blocks mapped to the chat template's messages,
// the same prompt as the OpenAI route, refusals naming the field in
// Anthropic's error shape), count_tokens, the stop reason, content blocks
// and the event stream from fixture parser deltas, and the CORS policy.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/api/anthropic_api.h"
#include "coordinator/api/anthropic_request.h"
#include "coordinator/api/anthropic_response.h"
#include "coordinator/api/cors.h"
#include "coordinator/api/openai_request.h"
#include "chat/jinja_prompt.h"
#include "chat/family.h"
#include "engine/sampling/grammar.h"
#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"
#include "tests/deepseek_v4_0731_text.h"
#include "tests/test_model_info.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;

ModelInfo stories_info() { return test::stories_model_info(2048); }

// A template that writes out every field the mapping fills.
const char* kShowAll =
    "{% if tools %}[tools]{{ tools | tojson }}{% endif %}"
    "{% for m in messages %}[{{ m.role }}"
    "{% if m.name %}:{{ m.name }}{% endif %}{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}]"
    "{% if m.reasoning_content %}<r>{{ m.reasoning_content }}</r>{% endif %}"
    "{% if m.content is none %}(null){% else %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<call {{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}>"
    "{% endfor %}{% endfor %}[assistant]{% if enable_thinking %}<think>{% endif %}";

ApiError refusal(const std::string& body, const ModelInfo& m, const JinjaTemplate* t) {
  try {
    parse_messages_request(body, m, t);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted " << body;
  return ApiError(0, "", "", "", "", "");
}

TEST(AnthropicRequest, BlocksMapToTheTemplatesMessages) {
  ModelInfo m = stories_info();
  const JinjaTemplate tmpl = JinjaTemplate::parse(kShowAll);
  MessagesRequest r = parse_messages_request(R"({
      "model": "stories260K", "max_tokens": 1100, "system": [{"type": "text", "text": "Be brief."},
                                                         {"type": "text", "text": "Be kind."}],
      "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "Use the tool.", "signature": "abc"},
          {"type": "redacted_thinking", "data": "opaque"},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"z": 1, "city": "Paris"}}]},
        {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
          {"type": "tool_result", "tool_use_id": "toolu_9", "content": "down", "is_error": true},
          {"type": "text", "text": "Thanks."}, {"type": "text", "text": "And Rome?"}]}],
      "tools": [{"name": "get_weather", "description": "Weather now",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
      "stop_sequences": ["END", ""], "temperature": 0.5, "top_p": 0.9, "top_k": 7, "stream": true,
      "metadata": {"user_id": "u1"}})",
                                             m, &tmpl);
  const std::string want =
      R"([tools][{"type": "function", "function": {"name": "get_weather", "description": "Weather now", )"
      R"("parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])"
      "[system]Be brief.\nBe kind.[user]Weather in Paris?"
      R"([assistant]<r>Use the tool.</r><call toolu_1 get_weather {"z": 1, "city": "Paris"}>)"
      "[tool:get_weather#toolu_1]21C[tool#toolu_9]Error: down[user]Thanks.\nAnd Rome?[assistant]<think>";
  EXPECT_EQ(r.gen.prompt, m.tokenizer->encode(want, false, true));
  EXPECT_EQ(r.gen.max_tokens, 1100);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r.gen.sampling.top_k, 7);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.stop_sequences, std::vector<std::string>{"END"});
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"END"});  // a template's turns end on tokens, not text
  EXPECT_EQ(r.gen.stop_tokens, m.chat_stop_tokens);
  EXPECT_EQ(r.conversation.tools.choice.mode, ToolChoice::Mode::required);
  ASSERT_EQ(r.conversation.tools.tools.size(), 1u);
  EXPECT_EQ(r.conversation.tools.tools[0].name, "get_weather");
  EXPECT_EQ(r.conversation.tools.tools[0].description, "Weather now");
  EXPECT_EQ(r.conversation.tools.tools[0].parameters.dump(),
            R"({"type":"object","properties":{"city":{"type":"string"}}})");
  EXPECT_TRUE(r.conversation.tools.parallel);
  EXPECT_TRUE(r.conversation.thinking);
  EXPECT_EQ(r.conversation.thinking_budget, 1024);

  // tool_choice none hides the tools; a named tool is carried for a grammar.
  MessagesRequest none = parse_messages_request(
      R"({"model":"stories260K","max_tokens":5,"messages":[{"role":"user","content":"Hi"}],
          "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"none"}})",
      m, &tmpl);
  EXPECT_EQ(none.gen.prompt, m.tokenizer->encode("[user]Hi[assistant]", false, true));
  MessagesRequest named = parse_messages_request(
      R"({"model":"stories260K","max_tokens":5,"messages":[{"role":"user","content":"Hi"}],
          "tools":[{"name":"f","input_schema":{"type":"object"}}],
          "tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true}})",
      m, &tmpl);
  EXPECT_EQ(named.conversation.tools.choice.mode, ToolChoice::Mode::named);
  EXPECT_EQ(named.conversation.tools.choice.name, "f");
  EXPECT_FALSE(named.conversation.tools.parallel);
  EXPECT_EQ(none.conversation.tools.choice.mode, ToolChoice::Mode::none);
  EXPECT_FALSE(none.conversation.tools.active());
  // Anthropic's defaults: temperature 1, no thinking (the variable says so).
  EXPECT_EQ(none.gen.sampling.temperature, 1.f);
  EXPECT_FALSE(none.stream);
  EXPECT_FALSE(none.conversation.thinking);
}

// The same conversation through /v1/chat/completions gives the same prompt:
// one renderer for both APIs.
TEST(AnthropicRequest, SamePromptAsTheOpenAiRoute) {
  ModelInfo m = stories_info();
  const JinjaTemplate tmpl = JinjaTemplate::parse(kShowAll);
  const std::string anthropic = R"({"model":"stories260K","max_tokens":9,"system":"S",
      "messages":[{"role":"user","content":"Hi"},
                  {"role":"assistant","content":[{"type":"text","text":"Hello"},
                      {"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
                  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}]})";
  const std::string openai = R"({"model":"stories260K","max_tokens":9,
      "messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"},
                  {"role":"assistant","content":"Hello",
                   "tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":{"a":1}}}]},
                  {"role":"tool","tool_call_id":"t1","name":"f","content":"ok"}]})";
  const auto a = parse_messages_request(anthropic, m, &tmpl).gen.prompt;
  // The OpenAI route does not take tools yet: compare without them.
  const auto b = parse_chat_request(openai, m, &tmpl).gen.prompt;
  const std::string show_all = kShowAll;
  const JinjaTemplate no_tools = JinjaTemplate::parse(show_all.substr(show_all.find("{% for")));
  EXPECT_EQ(parse_messages_request(anthropic, m, &no_tools).gen.prompt,
            parse_chat_request(openai, m, &no_tools).gen.prompt);
  EXPECT_NE(a, b);  // the tools are in the Anthropic prompt

  // Without a template both render with the family format (stories260K: plain).
  const std::string plain_a = R"({"model":"stories260K","max_tokens":9,"system":"S",
      "messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"},{"role":"user","content":"Go"}]})";
  const std::string plain_o = R"({"model":"stories260K","max_tokens":9,"messages":[{"role":"system","content":"S"},
      {"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"},{"role":"user","content":"Go"}]})";
  MessagesRequest pa = parse_messages_request(plain_a, m);
  ApiRequest po = parse_chat_request(plain_o, m);
  EXPECT_EQ(pa.gen.prompt, po.gen.prompt);
  EXPECT_EQ(pa.gen.stop, po.gen.stop);  // the plain format's end-of-turn text
  EXPECT_EQ(count_message_tokens(plain_a, m), int64_t(pa.gen.prompt.size()));
}

// serve --temp and the other sampling defaults: a body without the field
// gets the server's, one with it keeps its own; min_p and seed, which
// Anthropic's API lacks, come from the server when it sets them.
// Anthropic's thinking with the deepseek-v4-0731 built-in: enabled turns
// thinking on, and its budget picks the reasoning effort (< 8192 low,
// < 24576 high, else max); disabled leaves it off.
TEST(AnthropicRequest, ThinkingBudgetPicksDeepSeekV40731Effort) {
  const ModelInfo m = test::stories_model_info(65536);
  const auto tmpl = load_chat_template("deepseek-v4-0731").tmpl;
  auto prompt_of = [&](const std::string& thinking) {
    const std::string body = R"({"model":"stories260K","max_tokens":40000,"messages":[{"role":"user","content":"Hi"}])" +
                             (thinking.empty() ? std::string() : ",\"thinking\":" + thinking) + "}";
    return parse_messages_request(body, m, tmpl.get()).gen.prompt;
  };
  auto tokens = [&](const std::string& text) { return m.tokenizer->encode(text, false, true); };
  const std::string& bos = test::kDs4Bos;
  const std::string turn = "<｜User｜>Hi<｜Assistant｜>";
  const std::string& high = test::kDs4EffortHigh;
  const std::string& max = test::kDs4EffortMax;
  EXPECT_EQ(prompt_of(""), tokens(bos + turn + "</think>"));
  EXPECT_EQ(prompt_of(R"({"type":"disabled"})"), tokens(bos + turn + "</think>"));
  EXPECT_EQ(prompt_of(R"({"type":"adaptive"})"), tokens(bos + turn + "<think>"));
  EXPECT_EQ(prompt_of(R"({"type":"enabled","budget_tokens":4000})"), tokens(bos + turn + "<think>"));
  EXPECT_EQ(prompt_of(R"({"type":"enabled","budget_tokens":10000})"), tokens(bos + high + turn + "<think>"));
  EXPECT_EQ(prompt_of(R"({"type":"enabled","budget_tokens":31999})"), tokens(bos + max + turn + "<think>"));
}

TEST(AnthropicRequest, ServerSamplingDefaultsFillWhatARequestLeavesOut) {
  ModelInfo m = stories_info();
  SamplingDefaults d;
  d.temperature = 0.0;
  d.top_p = 0.5;
  d.top_k = 7;
  d.min_p = 0.125;
  d.seed = 99;
  auto parse = [&](const std::string& extra, const SamplingDefaults& defaults) {
    return parse_messages_request(
               R"({"model":"stories260K","max_tokens":8,"messages":[{"role":"user","content":"Hi"}])" + extra + "}",
               m, nullptr, {}, defaults)
        .gen.sampling;
  };
  const SamplerParams without = parse("", d);
  EXPECT_EQ(without.temperature, 0.0f);
  EXPECT_EQ(without.top_p, 0.5f);
  EXPECT_EQ(without.top_k, 7);
  EXPECT_EQ(without.min_p, 0.125f);
  EXPECT_EQ(without.seed, 99u);
  const SamplerParams own = parse(R"(,"temperature":0.75,"top_p":0.9,"top_k":3)", d);
  EXPECT_EQ(own.temperature, 0.75f);
  EXPECT_EQ(own.top_p, 0.9f);
  EXPECT_EQ(own.top_k, 3);
  const SamplerParams plain = parse("", {});
  EXPECT_EQ(plain.temperature, 1.0f);
  EXPECT_EQ(plain.top_p, 1.0f);
  EXPECT_EQ(plain.top_k, 0);
}

TEST(AnthropicRequest, CountTokensIsThePromptsLength) {
  ModelInfo m = stories_info();
  const JinjaTemplate tmpl = JinjaTemplate::parse(kShowAll);
  const std::string body = R"({"model":"stories260K","system":"You tell stories.",
      "messages":[{"role":"user","content":"Once upon a time"}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}]})";
  const int64_t n = count_message_tokens(body, m, &tmpl);  // no max_tokens needed
  EXPECT_EQ(n, int64_t(parse_messages_request(body.substr(0, body.size() - 1) + R"(,"max_tokens":5})", m, &tmpl)
                           .gen.prompt.size()));
  EXPECT_GT(n, count_message_tokens(R"({"model":"stories260K","system":"You tell stories.",
      "messages":[{"role":"user","content":"Once upon a time"}]})",
                                    m, &tmpl));
  EXPECT_THROW(count_message_tokens(R"({"model":"stories260K"})", m), ApiError);
}

// Every refusal names its field, in Anthropic's shape.
TEST(AnthropicRequest, BadInputsAreRefusedNamingTheField) {
  ModelInfo m = stories_info();
  const JinjaTemplate tmpl = JinjaTemplate::parse(kShowAll);
  const std::string user = R"("messages":[{"role":"user","content":"Hi"}])";
  const std::string head = R"({"model":"stories260K","max_tokens":10,)";
  const std::string tool = R"("tools":[{"name":"f","input_schema":{"type":"object"}}])";
  struct Case {
    std::string body, param;
  };
  const std::vector<Case> cases = {
      {R"({"model":"stories260K",)" + user + "}", "max_tokens"},
      {R"({"model":"stories260K","max_tokens":0,)" + user + "}", "max_tokens"},
      {R"({"model":"stories260K","max_tokens":"5",)" + user + "}", "max_tokens"},
      {R"({"model":"stories260K","max_tokens":5000,)" + user + "}", "max_tokens"},  // past the context
      {R"({"max_tokens":5,)" + user + "}", "model"},
      {head + R"("messages":[]})", "messages"},
      {head + R"("messages":"Hi"})", "messages"},
      {head + R"("system":5,)" + user + "}", "system"},
      {head + R"("system":[{"type":"image"}],)" + user + "}", "system.0.type"},
      {head + R"("messages":[{"role":"system","content":"Hi"}]})", "messages.0.role"},
      {head + R"("messages":[{"content":"Hi"}]})", "messages.0.role"},
      {head + R"("messages":[{"role":"user"}]})", "messages.0.content"},
      {head + R"("messages":[{"role":"user","content":7}]})", "messages.0.content"},
      {head + R"("messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
       "messages.0.content.0.type"},
      {head + R"("messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages.0.content.0.text"},
      {head + R"("messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]})",
       "messages.0.content.0.type"},
      {head + R"("messages":[{"role":"user","content":"a"},
           {"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":[]}]},
           {"role":"user","content":"b"}]})",
       "messages.1.content.0.input"},
      {head + R"("messages":[{"role":"user","content":"a"},
           {"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]},
           {"role":"user","content":"b"}]})",
       "messages.1.content.0.type"},
      {head + R"("messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]})",
       "messages.0.content.0.tool_use_id"},
      {head + R"("messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","is_error":"yes"}]}]})",
       "messages.0.content.0.is_error"},
      {head + R"("messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Once"}]})",
       "messages.1.role"},  // prefill
      {head + user + R"(,"tools":{}})", "tools"},
      {head + user + R"(,"tools":[{"name":"f"}]})", "tools.0.input_schema"},
      {head + user + R"(,"tools":[{"name":"a b","input_schema":{}}]})", "tools.0.name"},
      {head + user + R"(,"tools":[{"name":"f","input_schema":{}},{"name":"f","input_schema":{}}]})", "tools.1.name"},
      {head + user + R"(,"tools":[{"type":"web_search_20250305","name":"web_search"}]})", "tools.0.type"},
      {head + user + "," + tool + R"(,"tool_choice":"auto"})", "tool_choice"},
      {head + user + "," + tool + R"(,"tool_choice":{"type":"maybe"}})", "tool_choice.type"},
      {head + user + "," + tool + R"(,"tool_choice":{"type":"tool","name":"g"}})", "tool_choice.name"},
      {head + user + R"(,"tool_choice":{"type":"any"}})", "tool_choice.type"},
      {head + user + R"(,"thinking":{"type":"enabled"}})", "thinking.budget_tokens"},
      {head + user + R"(,"thinking":{"type":"enabled","budget_tokens":100}})", "thinking.budget_tokens"},
      {head + user + R"(,"thinking":{"type":"on"}})", "thinking.type"},
      {R"({"model":"stories260K","max_tokens":1500,"thinking":{"type":"enabled","budget_tokens":1500},)" + user + "}",
       "thinking.budget_tokens"},
      {head + user + R"(,"temperature":1.5})", "temperature"},
      {head + user + R"(,"top_p":-0.1})", "top_p"},
      {head + user + R"(,"top_k":-1})", "top_k"},
      {head + user + R"(,"stop_sequences":"END"})", "stop_sequences"},
      {head + user + R"(,"stop_sequences":[1]})", "stop_sequences"},
      {head + user + R"(,"stream":"yes"})", "stream"},
      {head + user + R"(,"metadata":"u"})", "metadata"},
      {head + user + R"(,"metadata":{"user_id":5}})", "metadata.user_id"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = refusal(c.body, m, &tmpl);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, c.param);
    const json body = json::parse(anthropic_error_body(e));
    EXPECT_EQ(body["type"], "error");
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["message"].get<std::string>().rfind(c.param + ": ", 0), 0u) << body.dump();
    EXPECT_EQ(body.size(), 2u);
  }
  // Another model is 404 not_found_error; broken JSON a 400 without a field.
  const ApiError other = refusal(R"({"model":"gpt-4","max_tokens":5,)" + user + "}", m, &tmpl);
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(json::parse(anthropic_error_body(other))["error"]["type"], "not_found_error");
  const ApiError broken = refusal("{\"model\":", m, &tmpl);
  EXPECT_EQ(broken.status, 400);
  EXPECT_NE(json::parse(anthropic_error_body(broken))["error"]["message"].get<std::string>().find("could not parse"),
            std::string::npos);

  // The family formats have no tool turns: tools and tool blocks need a template.
  EXPECT_EQ(refusal(head + user + "," + tool + "}", m, nullptr).param, "tools");
  EXPECT_EQ(refusal(head + R"("messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a"}]}]})", m,
                    nullptr)
                .param,
            "messages.0.content.0");
}

TEST(AnthropicResponse, ErrorTypesAndStopReasons) {
  EXPECT_STREQ(anthropic_error_type(400), "invalid_request_error");
  EXPECT_STREQ(anthropic_error_type(401), "authentication_error");
  EXPECT_STREQ(anthropic_error_type(404), "not_found_error");
  EXPECT_STREQ(anthropic_error_type(405), "invalid_request_error");
  EXPECT_STREQ(anthropic_error_type(413), "request_too_large");
  EXPECT_STREQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_STREQ(anthropic_error_type(500), "api_error");
  EXPECT_STREQ(anthropic_error_type(503), "overloaded_error");

  const std::vector<std::string> seqs = {"END", "STOP"};
  auto reason = [&](FinishReason f, const std::string& s, bool tool) {
    StopReason r = anthropic_stop_reason(f, s, seqs, tool);
    return r.reason + "|" + r.sequence;
  };
  EXPECT_EQ(reason(FinishReason::stop, "", false), "end_turn|");
  EXPECT_EQ(reason(FinishReason::stop, "STOP", false), "stop_sequence|STOP");
  EXPECT_EQ(reason(FinishReason::stop, "STOP", true), "stop_sequence|STOP");
  EXPECT_EQ(reason(FinishReason::stop, "\nUser:", false), "end_turn|");  // the chat format's, not the client's
  EXPECT_EQ(reason(FinishReason::stop, "", true), "tool_use|");
  EXPECT_EQ(reason(FinishReason::length, "", true), "max_tokens|");
}

ChatOutputDelta reasoning(const std::string& s) {
  ChatOutputDelta d;
  d.reasoning = s;
  return d;
}
ChatOutputDelta content(const std::string& s) {
  ChatOutputDelta d;
  d.content = s;
  return d;
}
ChatOutputDelta call(int index, const std::string& name, const std::string& args) {
  ChatOutputDelta d;
  d.tool_calls.push_back({index, name.empty() ? "" : "call_" + name, name, args});
  return d;
}

// "type[index]:detail" per event, for comparing sequences.
std::vector<std::string> summary(const std::vector<json>& events) {
  std::vector<std::string> out;
  for (const json& e : events) {
    std::string s = e["type"].get<std::string>();
    if (e.contains("index")) s += "[" + std::to_string(e["index"].get<int>()) + "]";
    if (e.contains("content_block")) s += ":" + e["content_block"]["type"].get<std::string>();
    if (e.contains("delta")) {
      const json& d = e["delta"];
      s += ":" + d["type"].get<std::string>();
      for (const char* k : {"text", "thinking", "partial_json"})
        if (d.contains(k)) s += "=" + d[k].get<std::string>();
    }
    out.push_back(s);
  }
  return out;
}

// The seam between the output parser and Anthropic's blocks, fed fixture
// deltas: reasoning, text and two tool calls whose arguments arrive in pieces.
TEST(AnthropicResponse, ParserDeltasBecomeContentBlocks) {
  ContentBlocks blocks;
  std::vector<json> events;
  auto feed = [&](const ChatOutputDelta& d) {
    for (auto& e : blocks.push(d)) events.push_back(e);
  };
  feed(reasoning("Think"));
  feed(reasoning(" more."));
  ChatOutputDelta both = content("It is");
  both.reasoning = " Done.";
  feed(both);  // reasoning first, then the text
  feed(content(" sunny."));
  feed(call(0, "get_weather", "{\"city\""));
  feed(call(0, "", ": \"Paris\"}"));
  ChatOutputDelta two = call(1, "get_time", "");
  two.tool_calls.push_back({1, "", "", "{}"});
  feed(two);
  feed(ChatOutputDelta{});  // nothing: no events
  for (auto& e : blocks.close()) events.push_back(e);
  EXPECT_TRUE(blocks.close().empty());  // closing twice adds nothing

  const std::vector<std::string> want = {
      "content_block_start[0]:thinking",
      "content_block_delta[0]:thinking_delta=Think",
      "content_block_delta[0]:thinking_delta= more.",
      "content_block_delta[0]:thinking_delta= Done.",
      "content_block_delta[0]:signature_delta",
      "content_block_stop[0]",
      "content_block_start[1]:text",
      "content_block_delta[1]:text_delta=It is",
      "content_block_delta[1]:text_delta= sunny.",
      "content_block_stop[1]",
      "content_block_start[2]:tool_use",
      "content_block_delta[2]:input_json_delta={\"city\"",
      "content_block_delta[2]:input_json_delta=: \"Paris\"}",
      "content_block_stop[2]",
      "content_block_start[3]:tool_use",
      "content_block_delta[3]:input_json_delta={}",
      "content_block_stop[3]",
  };
  EXPECT_EQ(summary(events), want);
  const std::string sig = ContentBlocks::signature("Think more. Done.");
  EXPECT_EQ(events[4]["delta"]["signature"], sig);
  const json& start = events[10]["content_block"];
  EXPECT_EQ(start["name"], "get_weather");
  EXPECT_EQ(start["input"], json::object());
  const std::string id = start["id"];
  EXPECT_EQ(id.rfind("toolu_", 0), 0u);
  EXPECT_NE(events[14]["content_block"]["id"], id);

  const json c = blocks.content();
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0], json({{"type", "thinking"}, {"thinking", "Think more. Done."}, {"signature", sig}}));
  EXPECT_EQ(c[1], json({{"type", "text"}, {"text", "It is sunny."}}));
  EXPECT_EQ(c[2], json({{"type", "tool_use"}, {"id", id}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}));
  EXPECT_EQ(c[3]["name"], "get_time");
  EXPECT_EQ(c[3]["input"], json::object());
  EXPECT_TRUE(blocks.has_tool_use());
  EXPECT_NE(ContentBlocks::signature("a"), ContentBlocks::signature("b"));
}

// The SSE events of one payload: (event name, data).
std::vector<std::pair<std::string, json>> parse_sse(const std::vector<std::string>& chunks) {
  std::vector<std::pair<std::string, json>> out;
  std::string all;
  for (const auto& c : chunks) all += c;
  size_t pos = 0;
  while (pos < all.size()) {
    const size_t end = all.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string ev = all.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    out.emplace_back(ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7)));
  }
  return out;
}

GenerationEvent text_event(const std::string& text) {
  GenerationEvent ev;
  ev.text = text;
  return ev;
}
GenerationEvent final_event(FinishReason f, const std::string& stop = "") {
  GenerationEvent ev;
  ev.finish = f;
  ev.stop_string = stop;
  ev.usage.prompt_tokens = 12;
  ev.usage.completion_tokens = 3;
  return ev;
}

// The whole stream of a response with today's default output format (all
// text is content), and the same message whole.
TEST(AnthropicResponse, StreamEventsAndTheWholeMessageAgree) {
  for (bool stop_seq : {false, true}) {
    MessagesResponse stream("msg_1", "stories260K", 12, {}, {"END"});
    MessagesResponse whole("msg_1", "stories260K", 12, {}, {"END"});
    std::vector<std::string> chunks;
    for (const GenerationEvent& ev : {text_event("Once"), text_event(""), text_event(" upon"),
                                      final_event(FinishReason::stop, stop_seq ? "END" : "")}) {
      for (auto& c : stream.stream_chunks(ev)) chunks.push_back(c);
      whole.add(ev);
    }
    const auto events = parse_sse(chunks);
    std::vector<std::string> names;
    for (const auto& [name, data] : events) {
      names.push_back(name);
      EXPECT_EQ(data["type"], name);  // the event line names the data's type
    }
    EXPECT_EQ(names, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                               "content_block_delta", "content_block_stop", "message_delta",
                                               "message_stop"}));
    const json start = events[0].second["message"];
    EXPECT_EQ(start["id"], "msg_1");
    EXPECT_EQ(start["type"], "message");
    EXPECT_EQ(start["role"], "assistant");
    EXPECT_EQ(start["content"], json::array());
    EXPECT_TRUE(start["stop_reason"].is_null());
    EXPECT_EQ(start["usage"]["input_tokens"], 12);
    const json delta = events[6].second;
    EXPECT_EQ(delta["delta"]["stop_reason"], stop_seq ? "stop_sequence" : "end_turn");
    EXPECT_EQ(delta["delta"]["stop_sequence"], stop_seq ? json("END") : json());
    EXPECT_EQ(delta["usage"]["output_tokens"], 3);

    const json msg = json::parse(whole.body());
    EXPECT_EQ(msg["content"], json::array({{{"type", "text"}, {"text", "Once upon"}}}));
    EXPECT_EQ(msg["stop_reason"], delta["delta"]["stop_reason"]);
    EXPECT_EQ(msg["stop_sequence"], delta["delta"]["stop_sequence"]);
    EXPECT_EQ(msg["model"], "stories260K");
    EXPECT_EQ(msg["usage"], json({{"input_tokens", 12},
                                  {"output_tokens", 3},
                                  {"cache_creation_input_tokens", 0},
                                  {"cache_read_input_tokens", 0}}));
  }

  // max_tokens; and an empty answer has no blocks.
  MessagesResponse empty("msg_2", "m", 4, {}, {});
  empty.add(final_event(FinishReason::length));
  EXPECT_EQ(json::parse(empty.body())["content"], json::array());
  EXPECT_EQ(json::parse(empty.body())["stop_reason"], "max_tokens");

  // A failure mid-stream ends with an error event (and no message_stop).
  MessagesResponse failing("msg_3", "m", 4, {}, {});
  std::vector<std::string> chunks = failing.stream_chunks(text_event("a"));
  GenerationEvent err = final_event(FinishReason::error);
  err.error = "worker-1 died";
  for (auto& c : failing.stream_chunks(err)) chunks.push_back(c);
  const auto events = parse_sse(chunks);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "error");
  EXPECT_EQ(events.back().second["error"]["type"], "api_error");
  EXPECT_NE(events.back().second["error"]["message"].get<std::string>().find("worker-1 died"), std::string::npos);
  EXPECT_EQ(json::parse(failing.error_body(503, "stopping"))["error"]["type"], "overloaded_error");
}

// tool_choice any / tool force a call by the grammar the OpenAI route uses
// ("required" / a named function): once it was plain text with Qwen 2.5's
// template. auto leaves the model free.
TEST(AnthropicRequest, ToolChoiceAnyAndToolForceACall) {
  ModelInfo m = stories_info();
  const auto qwen = load_chat_template_file(test::shared_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  auto body = [](const std::string& choice) {
    return R"({"model":"stories260K","max_tokens":64,"messages":[{"role":"user","content":"Weather?"}],
        "tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},
                  "required":["city"]}},{"name":"now","input_schema":{"type":"object"}}],
        "tool_choice":)" + choice + "}";
  };
  const std::string weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  auto accepts = [](const std::shared_ptr<const Grammar>& g, const std::string& text) {
    GrammarMatcher mt(g);
    return mt.advance(text) && mt.finished();
  };
  const MessagesRequest any = parse_messages_request(body(R"({"type":"any"})"), m, qwen.get());
  ASSERT_NE(any.gen.grammar, nullptr);
  EXPECT_TRUE(accepts(any.gen.grammar, weather));
  EXPECT_TRUE(accepts(any.gen.grammar, now));
  EXPECT_FALSE(accepts(any.gen.grammar, "Plain text."));
  const MessagesRequest named = parse_messages_request(body(R"({"type":"tool","name":"now"})"), m, qwen.get());
  ASSERT_NE(named.gen.grammar, nullptr);
  EXPECT_TRUE(accepts(named.gen.grammar, now));
  EXPECT_FALSE(accepts(named.gen.grammar, weather));
  EXPECT_EQ(parse_messages_request(body(R"({"type":"auto"})"), m, qwen.get()).gen.grammar, nullptr);
  // disable_parallel_tool_use: the forced call is one call, nothing after it;
  // without a grammar the output stops at the first call.
  const MessagesRequest one =
      parse_messages_request(body(R"({"type":"any","disable_parallel_tool_use":true})"), m, qwen.get());
  EXPECT_TRUE(one.output_format.single_tool_call);
  EXPECT_TRUE(accepts(one.gen.grammar, weather));
  GrammarMatcher two(one.gen.grammar);
  EXPECT_FALSE(two.advance(weather + "\n" + now));
  EXPECT_TRUE(parse_messages_request(body(R"({"type":"auto","disable_parallel_tool_use":true})"), m, qwen.get())
                  .output_format.single_tool_call);
  EXPECT_FALSE(any.output_format.single_tool_call);
}

// With a real template the request picks the model's output format (Qwen 3:
// Hermes tool calls, <think> reasoning), and the response reads the model's
// text through it: reasoning, text and a tool call become thinking, text and
// tool_use blocks, and the stop reason is tool_use.
TEST(AnthropicResponse, RealTemplateOutputBecomesBlocks) {
  ModelInfo m = stories_info();
  const auto qwen3 = load_chat_template_file(test::shared_dir() + "/chat_templates/Qwen-Qwen3-0.6B.jinja");
  const std::string body = R"({"model":"stories260K","max_tokens":1100,"stream":true,
      "thinking":{"type":"enabled","budget_tokens":1024},
      "messages":[{"role":"user","content":"Weather in Paris?"}],
      "tools":[{"name":"get_weather","input_schema":{"type":"object"}}]})";
  MessagesRequest r = parse_messages_request(body, m, qwen3.get());
  EXPECT_EQ(r.output_format.tools, ToolCallFormat::hermes);
  EXPECT_FALSE(r.output_format.reasoning_start.empty());
  // tool_choice none: the same model's output is read without tool calls.
  std::string none = body;
  none.insert(none.size() - 1, R"(,"tool_choice":{"type":"none"})");
  EXPECT_EQ(parse_messages_request(none, m, qwen3.get()).output_format.tools, ToolCallFormat::none);

  const std::string output =
      "<think>\nThe user wants weather.\n</think>\n\nLet me check."
      "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  // Whole, and streamed in pieces of 3 bytes (the parser holds back markup).
  MessagesResponse whole("msg_q", "stories260K", 9, r.output_format, {});
  MessagesResponse stream("msg_q", "stories260K", 9, r.output_format, {});
  std::vector<std::string> chunks;
  for (size_t i = 0; i < output.size(); i += 3) {
    const GenerationEvent ev = text_event(output.substr(i, 3));
    whole.add(ev);
    for (auto& c : stream.stream_chunks(ev)) chunks.push_back(c);
  }
  whole.add(final_event(FinishReason::stop));
  for (auto& c : stream.stream_chunks(final_event(FinishReason::stop))) chunks.push_back(c);

  const json msg = json::parse(whole.body());
  ASSERT_EQ(msg["content"].size(), 3u) << msg.dump();
  EXPECT_EQ(msg["content"][0]["type"], "thinking");
  EXPECT_NE(msg["content"][0]["thinking"].get<std::string>().find("The user wants weather."), std::string::npos);
  EXPECT_EQ(msg["content"][1]["type"], "text");
  EXPECT_NE(msg["content"][1]["text"].get<std::string>().find("Let me check."), std::string::npos);
  EXPECT_EQ(msg["content"][2]["type"], "tool_use");
  EXPECT_EQ(msg["content"][2]["name"], "get_weather");
  EXPECT_EQ(msg["content"][2]["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(msg["stop_reason"], "tool_use");

  // The stream's blocks add up to the same content.
  json blocks = json::array();
  std::string stop_reason;
  for (const auto& [name, data] : parse_sse(chunks)) {
    if (name == "content_block_start") blocks.push_back(data["content_block"]);
    if (name == "content_block_delta") {
      json& b = blocks[data["index"].get<size_t>()];
      const json& d = data["delta"];
      if (d["type"] == "thinking_delta") {
        b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      }
      if (d["type"] == "signature_delta") b["signature"] = d["signature"];
      if (d["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") b["json"] = b.value("json", "") + d["partial_json"].get<std::string>();
    }
    if (name == "message_delta") stop_reason = data["delta"]["stop_reason"];
  }
  ASSERT_EQ(blocks.size(), 3u);
  blocks[2]["input"] = json::parse(blocks[2]["json"].get<std::string>());
  blocks[2].erase("json");
  EXPECT_EQ(blocks[0], msg["content"][0]);
  EXPECT_EQ(blocks[1], msg["content"][1]);
  EXPECT_EQ(blocks[2]["input"], msg["content"][2]["input"]);
  EXPECT_EQ(blocks[2]["name"], "get_weather");
  EXPECT_EQ(stop_reason, "tool_use");
}

// ---- CORS ----

TEST(Cors, OriginListsAndHeaders) {
  const CorsPolicy any = parse_cors_origins("*");
  EXPECT_TRUE(any.any);
  const CorsPolicy list = parse_cors_origins(" https://App.example.com/ ,http://localhost:3000");
  EXPECT_EQ(list.origins, (std::vector<std::string>{"https://app.example.com", "http://localhost:3000"}));
  for (const char* bad : {"", ",", "app.example.com", "ftp://x", "https://", "https://a.com/path", "https://a b"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_cors_origins(bad), std::invalid_argument);
  }

  auto get = [](const HttpHeaders& h, const std::string& name) -> std::string {
    for (const auto& [k, v] : h)
      if (k == name) return v;
    return "(none)";
  };
  HttpHeaders h = cors_headers(any, std::nullopt, false);
  EXPECT_EQ(get(h, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(get(h, "Vary"), "(none)");
  h = cors_headers(list, "http://localhost:3000", false);
  EXPECT_EQ(get(h, "Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_EQ(get(h, "Vary"), "Origin");
  h = cors_headers(list, "https://evil.example", true);
  EXPECT_EQ(get(h, "Access-Control-Allow-Origin"), "(none)");
  EXPECT_EQ(get(h, "Access-Control-Allow-Methods"), "(none)");
  EXPECT_EQ(get(h, "Vary"), "Origin");

  h = cors_headers(list, "https://app.example.com", true,
                   "Content-Type, X-Stainless-OS, x-api-key, bad header, anthropic-dangerous-direct-browser-access");
  EXPECT_EQ(get(h, "Access-Control-Allow-Origin"), "https://app.example.com");
  EXPECT_EQ(get(h, "Access-Control-Allow-Methods"), "GET, POST, OPTIONS");
  EXPECT_EQ(get(h, "Access-Control-Allow-Headers"),
            std::string(kCorsAllowedHeaders) + ", x-stainless-os, anthropic-dangerous-direct-browser-access");
  EXPECT_EQ(cors_headers(CorsPolicy{}, "https://app.example.com", true).size(), 0u);
}

// An exchange that records what the handler answered.
class RecordingExchange : public HttpExchange {
 public:
  explicit RecordingExchange(HttpRequest r) : req(std::move(r)) {}
  const HttpRequest& request() const override { return req; }
  void respond(int s, std::string, std::string, HttpHeaders h) override {
    status = s;
    headers = std::move(h);
  }
  void begin_stream(int s, std::string, HttpHeaders h) override { respond(s, "", "", std::move(h)); }
  void write(std::string) override {}
  void end() override {}
  void on_abort(std::function<void()>) override {}
  bool aborted() const override { return false; }
  HttpRequest req;
  int status = 0;
  HttpHeaders headers;
};

TEST(Cors, PreflightIsAnsweredAndAnswersCarryTheOrigin) {
  int calls = 0;
  HttpHandler handler = with_cors(parse_cors_origins("https://app.example.com"), [&](std::shared_ptr<HttpExchange> ex) {
    ++calls;
    ex->respond(200, "application/json", "{}", {{"Retry-After", "1"}});
  });
  HttpRequest pre;
  pre.method = "OPTIONS";
  pre.path = "/v1/messages";
  pre.headers = {{"origin", "https://app.example.com"}, {"access-control-request-method", "POST"}};
  auto ex = std::make_shared<RecordingExchange>(pre);
  handler(ex);
  EXPECT_EQ(calls, 0);  // answered before the API (and its key check)
  EXPECT_EQ(ex->status, 204);
  EXPECT_NE(std::find(ex->headers.begin(), ex->headers.end(),
                      std::pair<std::string, std::string>{"Access-Control-Allow-Origin", "https://app.example.com"}),
            ex->headers.end());

  HttpRequest post = pre;
  post.method = "POST";
  auto ex2 = std::make_shared<RecordingExchange>(post);
  handler(ex2);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ex2->status, 200);
  EXPECT_EQ(ex2->headers.front(), (std::pair<std::string, std::string>{"Retry-After", "1"}));
  EXPECT_NE(std::find(ex2->headers.begin(), ex2->headers.end(),
                      std::pair<std::string, std::string>{"Access-Control-Allow-Origin", "https://app.example.com"}),
            ex2->headers.end());
}

}  // namespace
}  // namespace baton
