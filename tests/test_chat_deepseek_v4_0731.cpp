// The deepseek-v4-0731 built-in: DeepSeek V4 Flash 0731's encoder
// (encode_messages of the checkpoint's encoding/encoding_dsv4.py) in Jinja.
// Every expected prompt below was written by hand from that encoder's
// source: its markers, its effort prompts, its tools section, and its steps
// (tool messages merged into user turns, results ordered as the calls,
// earlier reasoning dropped in thinking mode). Which files get the
// built-in without --chat-template is checked on written GGUF headers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/template.h"
#include "chat/jinja_prompt.h"
#include "chat/templates/builtin.h"
#include "engine/gguf/file.h"
#include "tests/deepseek_v4_0731_text.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using ojson = nlohmann::ordered_json;

const std::string& kBos = test::kDs4Bos;
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kUser = "<｜User｜>";
const std::string kAsst = "<｜Assistant｜>";

// REASONING_EFFORT_PROMPTS of the 0731 encoder: "low" is empty.
const std::string& kHigh = test::kDs4EffortHigh;
const std::string& kMax = test::kDs4EffortMax;

// TOOLS_TEMPLATE with the DSML and thinking tokens filled in, around the
// schemas (json.dumps of each tool's "function", one a line).
const std::string kToolsHead =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke "
    "name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified "
    "as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in "
    "JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output "
    "your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output "
    "directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
const std::string kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

const ojson kWeatherTool = ojson::parse(
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");
const std::string kWeatherSchema =
    R"({"name": "get_weather", "description": "Weather of a city.", "parameters": {"type": "object", )"
    R"("properties": {"city": {"type": "string"}}, "required": ["city"]}})";

const JinjaTemplate& tmpl() {
  static const ChatTemplateSource loaded = load_chat_template("deepseek-v4-0731");
  return *loaded.tmpl;
}

ojson msg(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }
ojson answer(const std::string& content, const std::string& reasoning) {
  return {{"role", "assistant"}, {"content", content}, {"reasoning_content", reasoning}};
}

std::string render(const ojson& messages, const ojson& kwargs = ojson::object(), const ojson& tools = nullptr) {
  ChatTemplateInput in;
  in.messages = messages;
  in.tools = tools;
  in.kwargs = kwargs;
  in.bos_token = kBos;
  in.eos_token = kEos;
  return render_chat(tmpl(), in);
}

const ojson kOneTurn = ojson::array({msg("system", "You are terse."), msg("user", "Hi!")});

TEST(DeepseekV40731, IsABuiltin) {
  const BuiltinChatTemplate* b = find_builtin_chat_template("deepseek-v4-0731");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->source, "deepseek-ai/DeepSeek-V4-Flash-0731");
  EXPECT_EQ(load_chat_template("deepseek-v4-0731").description,
            "the built-in template deepseek-v4-0731 (deepseek-ai/DeepSeek-V4-Flash-0731)");
  EXPECT_NE(builtin_chat_template_names().find("deepseek-v4, deepseek-v4-0731"), std::string::npos);
}

// Chat mode: BOS, the system text where it stands, the user turn, and the
// assistant's opening closed at once. No effort prompt, whatever the effort.
TEST(DeepseekV40731, PlainChat) {
  const std::string want = kBos + "You are terse." + kUser + "Hi!" + kAsst + "</think>";
  EXPECT_EQ(render(kOneTurn), want);
  EXPECT_EQ(render(kOneTurn, {{"thinking", false}, {"reasoning_effort", "max"}}), want);
  EXPECT_EQ(render(ojson::array({msg("user", "Hi!")})), kBos + kUser + "Hi!" + kAsst + "</think>");
  // Earlier turns read </think>answer in chat mode, their reasoning dropped.
  const ojson two = ojson::array(
      {msg("system", "You are terse."), msg("user", "Hi!"), answer("Hello.", "Greet back."), msg("user", "2+2?")});
  EXPECT_EQ(render(two), kBos + "You are terse." + kUser + "Hi!" + kAsst + "</think>Hello." + kEos + kUser + "2+2?" +
                             kAsst + "</think>");
  // add_generation_prompt false: no opening after the last user turn.
  ChatTemplateInput in;
  in.messages = kOneTurn;
  in.add_generation_prompt = false;
  EXPECT_EQ(render_chat(tmpl(), in), kBos + "You are terse." + kUser + "Hi!");
}

// Thinking mode with each effort: the prompt goes right after BOS, before
// the system text; low (the default) has none.
TEST(DeepseekV40731, ThinkingWithEachEffort) {
  const std::string body = "You are terse." + kUser + "Hi!" + kAsst + "<think>";
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}}), kBos + body);
  EXPECT_EQ(render(kOneTurn, {{"enable_thinking", true}}), kBos + body);
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"reasoning_effort", "low"}}), kBos + body);
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"reasoning_effort", "high"}}), kBos + kHigh + body);
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"reasoning_effort", "max"}}), kBos + kMax + body);
  // Without a system message the prompt precedes the first user turn.
  EXPECT_EQ(render(ojson::array({msg("user", "Hi!")}), {{"thinking", true}, {"reasoning_effort", "max"}}),
            kBos + kMax + kUser + "Hi!" + kAsst + "<think>");
  // OpenAI's other names map to the nearest of the three.
  for (const char* e : {"none", "minimal"}) EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"reasoning_effort", e}}), kBos + body) << e;
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"reasoning_effort", "medium"}}), kBos + kHigh + body);
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"reasoning_effort", "xhigh"}}), kBos + kMax + body);
  // Anthropic's budget, when no effort is named: < 8192 low, < 24576 high, else max.
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"thinking_budget", 4000}}), kBos + body);
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"thinking_budget", 10000}}), kBos + kHigh + body);
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"thinking_budget", 31999}}), kBos + kMax + body);
  EXPECT_EQ(render(kOneTurn, {{"thinking", true}, {"thinking_budget", 31999}, {"reasoning_effort", "low"}}),
            kBos + body);
  // The encoder refuses any other effort (its assertion), in either mode.
  EXPECT_THROW(render(kOneTurn, {{"thinking", true}, {"reasoning_effort", "extreme"}}), jinja::RenderError);
  EXPECT_THROW(render(kOneTurn, {{"reasoning_effort", 3}}), jinja::RenderError);
}

// A history in thinking mode: turns before the last user turn lose their
// reasoning (</think>answer), the turn after it keeps it (reasoning</think>
// answer); drop_thinking false keeps every turn's.
TEST(DeepseekV40731, EarlierReasoningIsDropped) {
  const ojson history = ojson::array({msg("system", "You are terse."), msg("user", "Hi!"),
                                      answer("Hello.", "They greet me."), msg("user", "2+2?")});
  EXPECT_EQ(render(history, {{"thinking", true}, {"reasoning_effort", "high"}}),
            kBos + kHigh + "You are terse." + kUser + "Hi!" + kAsst + "</think>Hello." + kEos + kUser + "2+2?" +
                kAsst + "<think>");
  ojson answered = history;
  answered.push_back(answer("4.", "Two and two."));
  EXPECT_EQ(render(answered, {{"thinking", true}}),
            kBos + "You are terse." + kUser + "Hi!" + kAsst + "</think>Hello." + kEos + kUser + "2+2?" + kAsst +
                "<think>Two and two.</think>4." + kEos);
  EXPECT_EQ(render(history, {{"thinking", true}, {"drop_thinking", false}}),
            kBos + "You are terse." + kUser + "Hi!" + kAsst + "<think>They greet me.</think>Hello." + kEos + kUser +
                "2+2?" + kAsst + "<think>");
  // A developer message before the last user turn is dropped in thinking
  // mode; a later one renders as a user turn.
  const ojson dev = ojson::array({msg("developer", "Use metric."), msg("user", "Hi!"), answer("Hello.", "r"),
                                  msg("user", "Cold?")});
  EXPECT_EQ(render(dev, {{"thinking", true}}),
            kBos + kUser + "Hi!" + kAsst + "</think>Hello." + kEos + kUser + "Cold?" + kAsst + "<think>");
  EXPECT_EQ(render(dev), kBos + kUser + "Use metric." + kUser + "Hi!" + kAsst + "</think>Hello." + kEos + kUser +
                             "Cold?" + kAsst + "</think>");
}

// A tool call and its results with the request's tools: the tools section
// follows the system text, reasoning is kept in every turn (tools turn
// dropping off), the call is DSML, the results are one user turn in the
// order of the calls, then the user's text.
TEST(DeepseekV40731, ToolCallAndResults) {
  const ojson calls = ojson::parse(R"([
      {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
      {"id": "call_b", "type": "function", "function": {"name": "get_weather",
                                                        "arguments": {"city": "Zürich", "days": 2}}}])");
  ojson conv = ojson::array({msg("system", "Be brief."), msg("user", "Weather?"),
                             {{"role", "assistant"}, {"content", ""}, {"reasoning_content", "Two cities."},
                              {"tool_calls", calls}},
                             {{"role", "tool"}, {"tool_call_id", "call_b"}, {"content", "rain"}},
                             {{"role", "tool"}, {"tool_call_id", "call_a"}, {"content", "sun"}},
                             msg("user", "Thanks. Umbrella?")});
  const std::string call_block =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Zürich</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const std::string results = "<tool_result>sun</tool_result>\n\n<tool_result>rain</tool_result>\n\nThanks. Umbrella?";
  const ojson tools = ojson::array({kWeatherTool});
  EXPECT_EQ(render(conv, {{"thinking", true}, {"reasoning_effort", "max"}}, tools),
            kBos + kMax + "Be brief.\n\n" + kToolsHead + kWeatherSchema + kToolsTail + kUser + "Weather?" + kAsst +
                "<think>Two cities.</think>" + call_block + kEos + kUser + results + kAsst + "<think>");
  // Chat mode: no reasoning anywhere.
  EXPECT_EQ(render(conv, ojson::object(), tools),
            kBos + "Be brief.\n\n" + kToolsHead + kWeatherSchema + kToolsTail + kUser + "Weather?" + kAsst +
                "</think>" + call_block + kEos + kUser + results + kAsst + "</think>");
  // Without a system message the tools go to an empty one at the front.
  conv.erase(conv.begin());
  EXPECT_EQ(render(conv, ojson::object(), tools),
            kBos + "\n\n" + kToolsHead + kWeatherSchema + kToolsTail + kUser + "Weather?" + kAsst + "</think>" +
                call_block + kEos + kUser + results + kAsst + "</think>");
  // Without the request's tools, thinking drops the call's reasoning: the
  // results turn is the last user turn.
  EXPECT_EQ(render(conv, {{"thinking", true}}),
            kBos + kUser + "Weather?" + kAsst + "</think>" + call_block + kEos + kUser + results + kAsst + "<think>");
  // A zero-argument call, and results with ids no call has keep their order.
  const ojson ping = ojson::array(
      {msg("user", "Ping"),
       {{"role", "assistant"}, {"content", "On it."},
        {"tool_calls", ojson::parse(R"([{"type": "function", "function": {"name": "ping", "arguments": {}}}])")}},
       {{"role", "tool"}, {"tool_call_id", "x"}, {"content", "one"}},
       {{"role", "tool"}, {"tool_call_id", "y"}, {"content", "two"}}});
  EXPECT_EQ(render(ping), kBos + kUser + "Ping" + kAsst + "</think>On it.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
                                                          "name=\"ping\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
                              kEos + kUser + "<tool_result>one</tool_result>\n\n<tool_result>two</tool_result>" + kAsst +
                              "</think>");
}

TEST(DeepseekV40731, UnknownRoleIsRefused) {
  EXPECT_THROW(render(ojson::array({msg("narrator", "Once."), msg("user", "Hi!")})), jinja::RenderError);
}

// Baton's engine renders the built-in as Jinja2 does (transformers'
// settings, tests/chat/render_oracle.py), on every case above and more.
TEST(DeepseekV40731, RendersAsJinja2Does) {
  const ojson calls = ojson::parse(R"([
      {"id": "b", "type": "function", "function": {"name": "f", "arguments": {"x": [1, "é"], "y": null}}},
      {"id": "a", "type": "function", "function": {"name": "g", "arguments": "raw text"}}])");
  const ojson convs = ojson::array(
      {kOneTurn,
       ojson::array({msg("system", "S"), msg("user", "u1"), answer("a1", "r1"), msg("user", "u2"), answer("a2", "r2")}),
       ojson::array({msg("developer", "D"), msg("user", "u"), msg("user", "v"),
                     {{"role", "assistant"}, {"content", "c"}, {"reasoning_content", "r"}, {"tool_calls", calls}},
                     {{"role", "tool"}, {"tool_call_id", "a"}, {"content", "A"}},
                     {{"role", "tool"}, {"tool_call_id", "b"}, {"content", "B"}},
                     {{"role", "tool"}, {"tool_call_id", "zz"}, {"content", "Z"}}, msg("user", "w")})});
  const ojson kwargs = ojson::array({ojson::object(),
                                     {{"thinking", true}},
                                     {{"thinking", true}, {"reasoning_effort", "max"}},
                                     {{"enable_thinking", true}, {"thinking_budget", 20000}},
                                     {{"thinking", true}, {"drop_thinking", false}},
                                     {{"thinking", true}, {"response_format", {{"type", "json_object"}}}}});
  ojson cases = ojson::array();
  std::vector<std::string> baton;
  for (size_t c = 0; c < convs.size(); ++c) {
    for (size_t k = 0; k < kwargs.size(); ++k) {
      for (bool tools : {false, true}) {
        ojson context = {{"messages", convs[c]},
                         {"tools", tools ? ojson::array({kWeatherTool}) : ojson()},
                         {"add_generation_prompt", true},
                         {"bos_token", kBos},
                         {"eos_token", kEos}};
        for (const auto& [key, value] : kwargs[k].items()) context[key] = value;
        cases.push_back({{"name", std::to_string(cases.size())}, {"context", context}});
        baton.push_back(render(convs[c], kwargs[k], tools ? ojson::array({kWeatherTool}) : ojson()));
      }
    }
  }
  test::TempDir tmp;
  std::filesystem::create_directories(tmp.path() / "templates");
  std::ofstream(tmp.path() / "templates" / "deepseek-v4-0731.jinja", std::ios::binary)
      << deepseek_v4_0731_template_text();
  std::ofstream(tmp.file("spec.json")) << ojson({{"now", 0}, {"cases", cases}}).dump();
  const auto run = test::run_command({"/usr/bin/env", "python3", test::source_path("tests/chat/render_oracle.py"),
                                      (tmp.path() / "templates").string(), tmp.file("spec.json"), tmp.file("out.json")});
  ASSERT_EQ(run.exit_code, 0) << "python3 with jinja2 is required (Debian python3-jinja2): " << run.err;
  std::ifstream in(tmp.file("out.json"));
  const ojson oracle = ojson::parse(in)["deepseek-v4-0731.jinja"];
  for (size_t i = 0; i < baton.size(); ++i) {
    SCOPED_TRACE(cases[i]["context"].dump());
    ASSERT_TRUE(oracle[std::to_string(i)].contains("output")) << oracle[std::to_string(i)].dump();
    EXPECT_EQ(baton[i], oracle[std::to_string(i)]["output"].get<std::string>());
  }
}

// A GGUF header with the given string keys (no tensors).
GgufFile header(const test::TempDir& dir, const std::vector<std::pair<std::string, std::string>>& keys) {
  static int n = 0;
  GgufWriter w;
  for (const auto& [k, v] : keys) w.set(k, GgufValue::of_str(v));
  const std::string path = dir.file("m" + std::to_string(n++) + ".gguf");
  w.write(path);
  return GgufFile::open(path);
}

// A deepseek4 file that names 0731 (in its name, its sources or its imatrix
// file) gets the built-in; the preview, other architectures, and a file with
// its own template do not.
TEST(DeepseekV40731, SelectedByTheFilesMetadata) {
  test::TempDir dir;
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"general.name", "DeepSeek-V4-Flash-0731"},
           {"general.basename", "DeepSeek-V4-Flash-0731"},
           {"general.source.huggingface.repository", "deepseek-ai/DeepSeek-V4-Flash-0731"},
           {"quantize.imatrix.file", "gguf/DeepSeek-V4-Flash-0731-chat-v2-routed-moe-ds4.dat"}}) {
    SCOPED_TRACE(key);
    const GgufFile f = header(dir, {{"general.architecture", "deepseek4"}, {key, value}});
    const BuiltinChatTemplate* b = gguf_builtin_chat_template(f);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->name, "deepseek-v4-0731");
    const ModelChatTemplate t = model_chat_template(f);
    ASSERT_TRUE(t.tmpl);
    EXPECT_EQ(t.builtin, "deepseek-v4-0731");
    EXPECT_EQ(t.tmpl->source(), deepseek_v4_0731_template_text());
  }
  for (const auto& keys : std::vector<std::vector<std::pair<std::string, std::string>>>{
           {{"general.architecture", "deepseek4"}, {"general.name", "DeepSeek-V4-Flash"}},
           {{"general.architecture", "deepseek4"}},
           {{"general.architecture", "llama"}, {"general.name", "Llama-0731"}}}) {
    const GgufFile f = header(dir, keys);
    EXPECT_EQ(gguf_builtin_chat_template(f), nullptr);
    const ModelChatTemplate t = model_chat_template(f);
    EXPECT_FALSE(t.tmpl);
    EXPECT_EQ(t.builtin, "");
  }
  const GgufFile own = header(dir, {{"general.architecture", "deepseek4"},
                                    {"general.name", "DeepSeek-V4-Flash-0731"},
                                    {"tokenizer.chat_template", "{{ messages[0]['content'] }}"}});
  const ModelChatTemplate t = model_chat_template(own);
  ASSERT_TRUE(t.tmpl);
  EXPECT_EQ(t.builtin, "");
  EXPECT_EQ(t.tmpl->source(), "{{ messages[0]['content'] }}");
}

}  // namespace
}  // namespace baton
