// Tools on `baton serve`: stories260K served with a real template that
// renders tools (Qwen 2.5's, --chat-template) takes a request with tools and
// a tool-call history and answers normally (finish_reason stop, no calls),
// whole and streamed alike; output that begins like markup but is none comes
// back as content; and the official openai client parses the server's
// answers, and the chunks of a streamed answer with tool calls (built from a
// fixture output by the server's response code) into the calls.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "coordinator/api/openai_api.h"
#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"
#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;

std::string qwen_template() { return test::shared_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja"; }

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "The weather of a city.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");

const json kHistory = json::parse(R"([
  {"role": "user", "content": "What is the weather in Paris?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 19}"}])");

// Content, finish_reason and tool-call deltas of a chat stream.
struct Streamed {
  std::string content, finish;
  int tool_deltas = 0;
};
Streamed read_stream(const Response& r) {
  Streamed s;
  for (const std::string& e : sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    for (const json& c : j["choices"]) {
      if (c["delta"].contains("content")) s.content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls")) s.tool_deltas += int(c["delta"]["tool_calls"].size());
      if (!c["finish_reason"].is_null()) s.finish = c["finish_reason"];
    }
  }
  return s;
}

TEST(ServeTools, RequestsWithToolsAnswerNormally) {
  ServeProcess server({"-m", stories(), "--quiet", "--chat-template", qwen_template()});
  const int port = server.port();
  json req = {{"model", kModel}, {"messages", kHistory}, {"tools", kTools}, {"max_tokens", 60},
              {"temperature", 0}, {"stop", "."}};
  const Response whole = post(port, "/v1/chat/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json j = whole.j();
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  ASSERT_TRUE(msg["content"].is_string());
  EXPECT_FALSE(msg["content"].get<std::string>().empty());
  EXPECT_FALSE(msg.contains("tool_calls"));
  EXPECT_FALSE(msg.contains("reasoning_content"));

  req["stream"] = true;
  const Streamed s = read_stream(post(port, "/v1/chat/completions", req));
  EXPECT_EQ(s.content, msg["content"]);
  EXPECT_EQ(s.finish, "stop");
  EXPECT_EQ(s.tool_deltas, 0);

  // The tools change the prompt: without them (or with tool_choice none) the
  // same greedy request sees another prompt.
  req["stream"] = false;
  req["tool_choice"] = "none";
  const json none = post(port, "/v1/chat/completions", req).j();
  req.erase("tools");
  req.erase("tool_choice");
  const json bare = post(port, "/v1/chat/completions", req).j();
  EXPECT_EQ(none["usage"]["prompt_tokens"], bare["usage"]["prompt_tokens"]);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), bare["usage"]["prompt_tokens"].get<int>() + 20);

  // An answer made of "<" again and again (logit_bias) keeps looking like the
  // start of <tool_call> and never is one: it is content, whole and streamed.
  const auto tok = Tokenizer::from_gguf(GgufFile::open(stories()));
  const std::vector<int32_t> lt = tok->encode("<", false, false);
  ASSERT_FALSE(lt.empty());
  json forced = {{"model", kModel}, {"messages", kHistory}, {"tools", kTools}, {"max_tokens", 6},
                 {"temperature", 0}, {"logit_bias", {{std::to_string(lt.back()), 100}}}};
  const Response fw = post(port, "/v1/chat/completions", forced);
  ASSERT_EQ(fw.status, 200) << fw.body;
  const json f = fw.j();
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
  const std::string text = f["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_NE(text.find("<<"), std::string::npos) << text;
  forced["stream"] = true;
  EXPECT_EQ(read_stream(post(port, "/v1/chat/completions", forced)).content, text);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(ServeTools, OfficialOpenAiNodeClientTools) {
  if (!have_node()) GTEST_SKIP() << "node is not installed";
  ASSERT_TRUE(std::filesystem::exists(serve_scripts() / "node_modules" / "openai" / "package.json"))
      << "run 'npm ci' in " << serve_scripts() << " (scripts/test.sh does)";
  const std::string script = (serve_scripts() / "openai_tools.mjs").string();
  {
    ServeProcess server({"-m", stories(), "--quiet", "--chat-template", qwen_template()});
    auto r = test::run_command({"/usr/bin/env", "node", script, "--base-url",
                                "http://127.0.0.1:" + std::to_string(server.port()) + "/v1", "--model", kModel});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["whole"]["finish_reason"], "stop");
    EXPECT_TRUE(out["whole"]["tool_calls"].is_null());
    EXPECT_EQ(out["stream"]["content"], out["whole"]["content"]);
    EXPECT_EQ(out["stream"]["tool_call_deltas"], 0);
    EXPECT_EQ(out["helper"]["content"], out["whole"]["content"]);
    EXPECT_EQ(out["helper"]["finish_reason"], "stop");
    EXPECT_EQ(server.stop(), 0) << server.stderr_text();
  }

  // A streamed answer with reasoning and two tool calls, as the server's
  // response code writes it, byte by byte of model output.
  ApiRequest req;
  req.endpoint = ApiEndpoint::chat;
  req.stream = true;
  req.output.tools = ToolCallFormat::hermes;
  req.output.reasoning_start = "<think>";
  req.output.reasoning_end = "</think>";
  ResponseBuilder b(req, kModel, "chatcmpl-x", 1);
  const std::string model_output =
      "<think>Two calls.</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>";
  test::TempDir tmp;
  std::ofstream lines(tmp.file("chunks.jsonl"));
  for (size_t i = 0; i <= model_output.size(); ++i) {
    GenerationEvent ev;
    if (i < model_output.size()) {
      // Whole characters only, as the server releases text.
      size_t n = 1;
      while (i + n < model_output.size() && (static_cast<unsigned char>(model_output[i + n]) & 0xC0) == 0x80) ++n;
      ev.text = model_output.substr(i, n);
      i += n - 1;
    } else {
      ev.finish = FinishReason::stop;
    }
    for (const std::string& c : b.stream_chunks(ev)) {
      if (c != "data: [DONE]\n\n") lines << c.substr(6, c.size() - 8) << "\n";
    }
  }
  lines.close();
  auto r = test::run_command({"/usr/bin/env", "node", script, "--chunks", tmp.file("chunks.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json choice = json::parse(r.out);
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const json& calls = choice["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u) << r.out;
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(json::parse(calls[1]["function"]["arguments"].get<std::string>()), json({{"city", "Zürich"}}));
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
}

}  // namespace
}  // namespace baton
