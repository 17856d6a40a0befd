// Tools and thinking on /v1/chat/completions without a server: the request
// fields (tools, tool_choice, parallel_tool_calls, reasoning_effort) parsed
// and refused by name; OpenAI-shaped conversations with tool calls rendered
// through real templates exactly as Jinja2 renders the Hugging Face shape;
// the output format each real template gets; and the response shapes
// (message.tool_calls, reasoning_content, delta.tool_calls, finish_reason)
// built from fixture outputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/output/arguments.h"
#include "chat/output_format.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/openai_request.h"
#include "chat/jinja_prompt.h"
#include "engine/gguf/file.h"
#include "chat/jinja/template.h"
#include "engine/text/tokenizer.h"
#include "tests/deepseek_v4_0731_text.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string template_path(const std::string& name) { return test::shared_dir() + "/chat_templates/" + name; }

std::shared_ptr<const JinjaTemplate> real_template(const std::string& name) {
  return std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(read_text(template_path(name))));
}

ModelInfo stories_info(const std::string& template_name = "") {
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  ModelInfo m;
  m.id = "stories260K";
  m.arch = "llama";
  m.n_ctx = 4096;
  m.n_vocab = 512;
  m.tokenizer = Tokenizer::from_gguf(f);
  m.chat_family = detect_chat_family(f);
  m.chat_stop_tokens = chat_stop_tokens(m.chat_family, *m.tokenizer);
  if (!template_name.empty()) m.chat_template = real_template(template_name);
  return m;
}

const json kWeatherTool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"description", "Weather of a city."},
      {"parameters",
       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}};

json chat_body(json extra = json::object()) {
  json b = {{"model", "stories260K"}, {"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

void expect_refused(const ModelInfo& m, const json& body, const std::string& param, const std::string& code = "") {
  try {
    parse_chat_request(body.dump(), m);
    ADD_FAILURE() << "accepted " << body.dump();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body.dump();
    EXPECT_EQ(e.param, param) << e.what();
    if (!code.empty()) EXPECT_EQ(e.code, code) << e.what();
  }
}

TEST(ChatTools, ToolsAndChoiceParsed) {
  const ModelInfo m = stories_info("Qwen-Qwen2.5-7B-Instruct.jinja");
  const json second = json::parse(
      R"({"type": "function", "function": {"name": "search-web_2", "parameters": {"type": "object", "b": 1, "a": 2}}})");
  std::string body =
      chat_body({{"tools", {kWeatherTool, second}}, {"tool_choice", "required"}, {"parallel_tool_calls", false}}).dump();
  // The body as a client writes it, schema keys in their own order.
  const std::string sorted = R"({"a":2,"b":1,"type":"object"})";
  body.replace(body.find(sorted), sorted.size(), R"({"type":"object","b":1,"a":2})");
  ApiRequest r = parse_chat_request(body, m);
  ASSERT_EQ(r.tools.tools.size(), 2u);
  EXPECT_EQ(r.tools.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools.tools[0].description, "Weather of a city.");
  EXPECT_EQ(r.tools.tools[1].parameters.dump(), R"({"type":"object","b":1,"a":2})");  // key order kept
  EXPECT_EQ(r.tools.choice.mode, ToolChoice::Mode::required);
  EXPECT_FALSE(r.tools.parallel);
  EXPECT_TRUE(r.tools.active());
  EXPECT_EQ(r.output.tools, ToolCallFormat::hermes);

  r = parse_chat_request(
      chat_body({{"tools", {kWeatherTool}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}})
          .dump(),
      m);
  EXPECT_EQ(r.tools.choice.mode, ToolChoice::Mode::named);
  EXPECT_EQ(r.tools.choice.name, "get_weather");
  EXPECT_TRUE(r.tools.parallel);

  // tool_choice none: no tools reach the template and calls are not parsed.
  ApiRequest none = parse_chat_request(chat_body({{"tools", {kWeatherTool}}, {"tool_choice", "none"}}).dump(), m);
  ApiRequest plain = parse_chat_request(chat_body().dump(), m);
  ApiRequest with = parse_chat_request(chat_body({{"tools", {kWeatherTool}}}).dump(), m);
  EXPECT_FALSE(none.tools.active());
  EXPECT_EQ(none.output.tools, ToolCallFormat::none);
  EXPECT_EQ(none.gen.prompt, plain.gen.prompt);
  EXPECT_GT(with.gen.prompt.size(), plain.gen.prompt.size() + 20);
  EXPECT_EQ(with.tools.choice.mode, ToolChoice::Mode::automatic);
}

TEST(ChatTools, BadFieldsAreNamed) {
  const ModelInfo m = stories_info("Qwen-Qwen2.5-7B-Instruct.jinja");
  auto tool_with = [](const char* key, json v) {
    json t = kWeatherTool;
    t["function"][key] = std::move(v);
    return t;
  };
  expect_refused(m, chat_body({{"tools", "x"}}), "tools", "invalid_type");
  expect_refused(m, chat_body({{"tools", {5}}}), "tools.[0]", "invalid_type");
  expect_refused(m, chat_body({{"tools", {{{"function", {{"name", "f"}}}}}}}), "tools.[0].type",
                 "missing_required_parameter");
  expect_refused(m, chat_body({{"tools", {{{"type", "custom"}, {"function", {{"name", "f"}}}}}}}), "tools.[0].type");
  expect_refused(m, chat_body({{"tools", {{{"type", "function"}}}}}), "tools.[0].function",
                 "missing_required_parameter");
  expect_refused(m, chat_body({{"tools", {kWeatherTool, tool_with("name", 3)}}}), "tools.[1].function.name",
                 "invalid_type");
  expect_refused(m, chat_body({{"tools", {tool_with("name", "get weather")}}}), "tools.[0].function.name");
  expect_refused(m, chat_body({{"tools", {tool_with("name", std::string(65, 'a'))}}}), "tools.[0].function.name");
  expect_refused(m, chat_body({{"tools", {kWeatherTool, kWeatherTool}}}), "tools.[1].function.name");
  expect_refused(m, chat_body({{"tools", {tool_with("parameters", "{}")}}}), "tools.[0].function.parameters",
                 "invalid_type");
  expect_refused(m, chat_body({{"tools", {tool_with("description", 1)}}}), "tools.[0].function.description");
  expect_refused(m, chat_body({{"tools", {kWeatherTool}}, {"tool_choice", "sometimes"}}), "tool_choice");
  expect_refused(m, chat_body({{"tools", {kWeatherTool}}, {"tool_choice", 1}}), "tool_choice", "invalid_type");
  expect_refused(m,
                 chat_body({{"tools", {kWeatherTool}},
                            {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
                 "tool_choice");
  expect_refused(m, chat_body({{"tool_choice", "required"}}), "tool_choice");
  expect_refused(m, chat_body({{"tools", {kWeatherTool}}, {"parallel_tool_calls", "yes"}}), "parallel_tool_calls",
                 "invalid_type");
  expect_refused(m, chat_body({{"functions", {kWeatherTool["function"]}}}), "functions", "unsupported_parameter");
  expect_refused(m, chat_body({{"reasoning_effort", "extreme"}}), "reasoning_effort");
  expect_refused(m, chat_body({{"reasoning_effort", 3}}), "reasoning_effort", "invalid_type");
  // History: tool-call arguments must be a JSON object (as text or as one).
  json msgs = json::array({{{"role", "user"}, {"content", "Hi"}},
                           {{"role", "assistant"},
                            {"content", nullptr},
                            {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                             {"function", {{"name", "f"}, {"arguments", "{not json"}}}}}}}});
  expect_refused(m, chat_body({{"messages", msgs}}), "messages.[1].tool_calls.[0].function.arguments");
  msgs[1]["tool_calls"][0]["function"].erase("name");
  expect_refused(m, chat_body({{"messages", msgs}}), "messages.[1].tool_calls.[0].function.name",
                 "missing_required_parameter");
  msgs[1]["tool_calls"] = "x";
  expect_refused(m, chat_body({{"messages", msgs}}), "messages.[1].tool_calls", "invalid_type");
  expect_refused(m, chat_body({{"messages", {{{"role", "tool"}, {"tool_call_id", 5}, {"content", "x"}}}}}),
                 "messages.[0].tool_call_id", "invalid_type");
  // A key given twice (the last one counts) is a request like any other.
  for (const char* dup : {R"("tools":5,"tools":[{"type":"function","function":{"name":"f","parameters":{"a":1}}}])",
                          R"("tools":[{"type":"function","function":{"name":"f","parameters":{"a":1}}}],"tools":5)"}) {
    const std::string body =
        std::string(R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],)") + dup + "}";
    try {
      const ApiRequest r = parse_chat_request(body, m);
      ASSERT_EQ(r.tools.tools.size(), 1u);
      EXPECT_EQ(r.tools.tools[0].parameters.dump(), R"({"a":1})");
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "tools") << e.what();
    }
  }
  // Without a Jinja template nothing renders tools.
  const ModelInfo bare = stories_info();
  expect_refused(bare, chat_body({{"tools", {kWeatherTool}}}), "tools", "unsupported_parameter");
  EXPECT_NO_THROW(parse_chat_request(chat_body({{"tools", {kWeatherTool}}, {"tool_choice", "none"}}).dump(), bare));
}

// The format each real template gets, and the request's changes to it.
TEST(ChatTools, OutputFormatOfRealTemplates) {
  struct Want {
    const char* file;
    ToolCallFormat tools;
    const char* reasoning;
  };
  const std::vector<Want> wants = {
      {"deepseek-ai-DeepSeek-V4.jinja", ToolCallFormat::deepseek_dsml, "<think>"},
      {"deepseek-ai-DeepSeek-V4-Flash-0731.jinja", ToolCallFormat::deepseek_dsml, "<think>"},
      {"deepseek-ai-DeepSeek-V3.2.jinja", ToolCallFormat::deepseek_dsml, "<think>"},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::llama3_json, ""},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::llama3_json, ""},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallFormat::llama3_json, ""},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::hermes, ""},
      {"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::hermes, "<think>"},
      {"Qwen-QwQ-32B.jinja", ToolCallFormat::hermes, "<think>"},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::hermes, ""},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::mistral, ""},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolCallFormat::mistral, ""},
      {"unsloth-mistral-Devstral-Small-2507.jinja", ToolCallFormat::mistral, ""},
      {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", ToolCallFormat::mistral, "[THINK]"},
      {"Qwen3-Coder.jinja", ToolCallFormat::qwen3_coder, ""},
      {"Qwen3.5-4B.jinja", ToolCallFormat::qwen3_coder, "<think>"},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", ToolCallFormat::qwen3_coder, "<think>"},
      {"StepFun3.5-Flash.jinja", ToolCallFormat::qwen3_coder, "<think>"},
      {"GLM-4.6.jinja", ToolCallFormat::glm, "<think>"},
      {"GLM-4.7-Flash.jinja", ToolCallFormat::glm, "<think>"},
      {"Spark2.5.jinja", ToolCallFormat::glm, "<think>"},
      {"inclusionai-ling-3.0-flash.jinja", ToolCallFormat::glm, "<think>"},
      {"ByteDance-Seed-OSS.jinja", ToolCallFormat::none, ""},  // <seed:tool_call>: not parsed
      {"meetkai-functionary-medium-v3.1.jinja", ToolCallFormat::none, ""},  // <function=f>{...}: not parsed
      {"openai-gpt-oss-120b.jinja", ToolCallFormat::none, ""},
  };
  for (const Want& w : wants) {
    const ChatOutputFormat f =
        detect_chat_output_format(read_text(template_path(w.file)), "llama", ChatFamily::Plain);
    EXPECT_EQ(f.tools, w.tools) << w.file << ": " << tool_call_format_name(f.tools);
    EXPECT_EQ(f.reasoning_start, w.reasoning) << w.file;
  }
  // Without a template: DeepSeek V4's architecture, a vocabulary with <think>.
  const ChatOutputFormat ds4 = detect_chat_output_format("", "deepseek4", ChatFamily::Plain);
  EXPECT_EQ(ds4.tools, ToolCallFormat::deepseek_dsml);
  EXPECT_EQ(ds4.reasoning_end, "</think>");
  const ChatOutputFormat chatml =
      detect_chat_output_format("", "qwen3", ChatFamily::ChatML, [](std::string_view t) { return t[0] == '<'; });
  EXPECT_EQ(chatml.tools, ToolCallFormat::hermes);
  EXPECT_EQ(chatml.reasoning_start, "<think>");

  // The prompt opens the reasoning block (trailing whitespace allowed).
  EXPECT_TRUE(request_output_format(ds4, "<｜Assistant｜><think>\n", true).reasoning_open);
  EXPECT_FALSE(request_output_format(ds4, "<｜Assistant｜></think>", true).reasoning_open);
  EXPECT_EQ(request_output_format(ds4, "x", false).tools, ToolCallFormat::none);
}

// A control token has no text in the output unless the request shows it, as
// a chat's request does for the control tokens among its format's markers.
TEST(ChatTools, ControlMarkersAreShownToTheParser) {
  const ModelInfo m = stories_info();
  const Tokenizer& tok = *m.tokenizer;
  const int32_t bos = tok.bos();  // a control token of this vocabulary
  ASSERT_GE(bos, 0);
  ASSERT_TRUE(tok.token_to_piece(bos).empty());
  ChatOutputFormat f;
  f.reasoning_start = tok.token_text(bos);  // as if the marker were a control token
  f.reasoning_end = "</x>";
  EXPECT_EQ(chat_marker_tokens(f, tok), std::vector<int32_t>{bos});
  f.reasoning_start = "<x>";  // plain text: nothing to show
  EXPECT_TRUE(chat_marker_tokens(f, tok).empty());

  GenerationRequest req;
  req.max_tokens = 4;
  for (bool show : {false, true}) {
    req.show_tokens = show ? std::vector<int32_t>{bos} : std::vector<int32_t>{};
    TextAssembler text({});
    Usage usage;
    GenerationEvent ev;
    EXPECT_FALSE(accept_token(req, tok, bos, 0, {}, false, text, usage, ev));
    ASSERT_EQ(ev.tokens.size(), 1u);
    EXPECT_EQ(ev.tokens[0].piece, show ? tok.token_text(bos) : "");
    EXPECT_EQ(ev.text + text.flush(), show ? tok.token_text(bos) : "");
  }
}

// DeepSeek V4's thinking follows reasoning_effort (and the kwargs, which
// win): the prompt ends with <think> and the output starts as reasoning.
TEST(ChatTools, ReasoningEffortTurnsThinkingOn) {
  const ModelInfo m = stories_info("deepseek-ai-DeepSeek-V4-Flash-0731.jinja");
  auto prompt_of = [&](const ApiRequest& r) { return m.tokenizer->decode(r.gen.prompt); };
  const ApiRequest off = parse_chat_request(chat_body().dump(), m);
  EXPECT_FALSE(off.output.reasoning_open);  // the template's default: thinking off
  const ApiRequest high = parse_chat_request(chat_body({{"reasoning_effort", "high"}}).dump(), m);
  EXPECT_TRUE(high.output.reasoning_open);
  EXPECT_NE(prompt_of(high).find("Reasoning Effort: Absolute maximum"), std::string::npos);
  const ApiRequest low = parse_chat_request(chat_body({{"reasoning_effort", "low"}}).dump(), m);
  EXPECT_TRUE(low.output.reasoning_open);
  EXPECT_EQ(prompt_of(low).find("Reasoning Effort"), std::string::npos);
  EXPECT_FALSE(parse_chat_request(chat_body({{"reasoning_effort", "none"}}).dump(), m).output.reasoning_open);
  EXPECT_FALSE(parse_chat_request(
                   chat_body({{"reasoning_effort", "high"}, {"chat_template_kwargs", {{"thinking", false}}}}).dump(), m)
                   .output.reasoning_open);
  EXPECT_TRUE(
      parse_chat_request(chat_body({{"chat_template_kwargs", {{"enable_thinking", true}}}}).dump(), m).output.reasoning_open);
  EXPECT_EQ(off.output.tools, ToolCallFormat::none);
}

// The deepseek-v4-0731 built-in through the request: reasoning_effort picks
// DeepSeek V4 Flash 0731's prompt after BOS (max: its new text; high: the
// text the preview gave max; low, none: none), and a tool call with its
// result renders as DSML and a <tool_result> user turn.
TEST(ChatTools, DeepSeekV40731EffortThroughTheRequest) {
  ModelInfo m = stories_info();
  m.chat_template = load_chat_template("deepseek-v4-0731").tmpl;
  const Tokenizer& tok = *m.tokenizer;
  auto tokens = [&](const std::string& text) { return tok.encode(text, false, true); };
  const std::string& bos = test::kDs4Bos;
  const std::string turn = "<｜User｜>Weather in Paris?<｜Assistant｜>";
  const std::string& high = test::kDs4EffortHigh;
  const std::string& max = test::kDs4EffortMax;
  const ApiRequest r_max = parse_chat_request(chat_body({{"reasoning_effort", "max"}}).dump(), m);
  EXPECT_EQ(r_max.gen.prompt, tokens(bos + max + turn + "<think>"));
  EXPECT_TRUE(r_max.output.reasoning_open);
  EXPECT_EQ(parse_chat_request(chat_body({{"reasoning_effort", "high"}}).dump(), m).gen.prompt,
            tokens(bos + high + turn + "<think>"));
  EXPECT_EQ(parse_chat_request(chat_body({{"reasoning_effort", "low"}}).dump(), m).gen.prompt,
            tokens(bos + turn + "<think>"));
  const ApiRequest r_none = parse_chat_request(chat_body({{"reasoning_effort", "none"}}).dump(), m);
  EXPECT_EQ(r_none.gen.prompt, tokens(bos + turn + "</think>"));
  EXPECT_FALSE(r_none.output.reasoning_open);
  EXPECT_EQ(parse_chat_request(chat_body().dump(), m).gen.prompt, tokens(bos + turn + "</think>"));
  // The kwargs name the effort too, and decide thinking.
  EXPECT_EQ(
      parse_chat_request(chat_body({{"chat_template_kwargs", {{"thinking", true}, {"reasoning_effort", "max"}}}}).dump(),
                         m)
          .gen.prompt,
      r_max.gen.prompt);
  expect_refused(m, chat_body({{"chat_template_kwargs", {{"thinking", true}, {"reasoning_effort", "extreme"}}}}),
                 "messages", "invalid_value");

  // A tool call in OpenAI's shape and its result, with the tools offered:
  // the tools section in an empty system message at the front, reasoning
  // kept (empty), the call in DSML, the result as a user turn.
  const json call = {{"id", "call_1"},
                     {"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}};
  json body = chat_body({{"tools", {kWeatherTool}}, {"reasoning_effort", "max"}});
  body["messages"].push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}});
  const ApiRequest r = parse_chat_request(body.dump(), m);
  EXPECT_EQ(r.output.tools, ToolCallFormat::deepseek_dsml);
  const std::string tools_section =
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
      "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
      "name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" "
      "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke "
      "name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be "
      "specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the "
      "value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you "
      "MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
      "Otherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool "
      "Schemas\n\n"
      // The body's keys in order: chat_body's json sorts them.
      R"({"description": "Weather of a city.", "name": "get_weather", "parameters": {"properties": )"
      R"({"city": {"type": "string"}}, "required": ["city"], "type": "object"}})"
      "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
  EXPECT_EQ(r.gen.prompt,
            tokens(bos + max + "\n\n" + tools_section + turn +
                   "<think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                   "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                   "</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>sunny</tool_result>"
                   "<｜Assistant｜><think>"))
      << tok.decode(r.gen.prompt);
}

// A conversation with tool calls in OpenAI's shape (arguments as JSON text,
// tool results with tool_call_id), sent through parse_chat_request, renders
// what Jinja2 renders for the Hugging Face shape (arguments as objects) with
// the same tools, for the templates of every parsed format.
TEST(ChatTools, ToolConversationsRenderAsJinja2Does) {
  const std::vector<std::string> files = {"Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja",
                                          "deepseek-ai-DeepSeek-V4.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                                          "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                                          "unsloth-mistral-Devstral-Small-2507.jinja", "Qwen3-Coder.jinja",
                                          "Qwen3.5-4B.jinja", "GLM-4.6.jinja", "GLM-4.7-Flash.jinja"};
  const json tools = {kWeatherTool};
  const json args = {{"city", "Zürich"}, {"days", 2}};
  auto conversation = [&](bool openai_shape) {
    json call = {{"id", "abc123xyz"},
                 {"type", "function"},
                 {"function", {{"name", "get_weather"}, {"arguments", openai_shape ? json(args.dump()) : args}}}};
    return json::array({{{"role", "system"}, {"content", "Be brief."}},
                        {{"role", "user"}, {"content", "Weather in Zürich?"}},
                        {{"role", "assistant"}, {"content", openai_shape ? json() : json("")}, {"tool_calls", {call}}},
                        {{"role", "tool"}, {"tool_call_id", "abc123xyz"}, {"content", "{\"temp\": 19}"}}});
  };
  test::TempDir tmp;
  std::filesystem::create_directories(tmp.path() / "templates");
  for (const auto& f : files) std::filesystem::copy_file(template_path(f), tmp.path() / "templates" / f);
  const ojson spec = {{"now", 1768473000},
                      {"cases",
                       {{{"name", "tools"},
                         {"context",
                          {{"bos_token", "<s>"},
                           {"eos_token", "</s>"},
                           {"messages", conversation(false)},
                           {"tools", tools},
                           {"add_generation_prompt", true}}}}}}};
  std::ofstream(tmp.file("spec.json")) << spec.dump();
  const auto run = test::run_command({"/usr/bin/env", "python3", test::source_path("tests/chat/render_oracle.py"),
                                      (tmp.path() / "templates").string(), tmp.file("spec.json"), tmp.file("out.json")});
  ASSERT_EQ(run.exit_code, 0) << "python3 with jinja2 is required (Debian python3-jinja2): " << run.err;
  const json oracle = json::parse(read_text(tmp.file("out.json")));
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const ModelInfo m = stories_info(f);
    ASSERT_TRUE(oracle[f]["tools"].contains("output")) << oracle[f]["tools"].dump();
    const std::string want = oracle[f]["tools"]["output"].get<std::string>();
    EXPECT_NE(want.find("get_weather"), std::string::npos);
    const ApiRequest r = parse_chat_request(chat_body({{"messages", conversation(true)}, {"tools", tools}}).dump(), m);
    EXPECT_EQ(r.gen.prompt, m.tokenizer->encode(want, false, true));
    EXPECT_NE(r.output.tools, ToolCallFormat::none);
  }
}

// The tool-call histories clients send (content absent, null, empty or as
// parts; arguments as text, as an object or absent; several calls) through
// every stock template: each answers with a prompt or a 400, never a crash.
// An assistant turn without "content" once read freed memory (run this suite
// under the sanitizers, as CI does).
TEST(ChatTools, ToolCallHistoriesThroughEveryStockTemplate) {
  auto call = [](const std::string& id, json args) {
    json fn = {{"name", "get_weather"}};
    if (!args.is_null()) fn["arguments"] = std::move(args);
    return json{{"id", id}, {"type", "function"}, {"function", fn}};
  };
  const json text_args = R"({"city": "Paris"})";
  const json obj_args = {{"city", "Paris"}};
  std::vector<json> assistants;
  for (const json& args : {text_args, obj_args, json()}) {
    const json calls = {call("c1", args)};
    assistants.push_back({{"role", "assistant"}, {"tool_calls", calls}});  // no content key
    assistants.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}});
    assistants.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}});
    assistants.push_back({{"role", "assistant"},
                          {"content", json::array({{{"type", "text"}, {"text", "Checking."}}})},
                          {"tool_calls", calls}});
  }
  assistants.push_back({{"role", "assistant"}, {"tool_calls", {call("c1", text_args), call("c2", obj_args)}}});
  assistants.push_back({{"tool_calls", {call("c1", text_args)}}, {"role", "assistant"}});  // role after the calls

  int rendered = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::shared_dir() + "/chat_templates")) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const ModelInfo m = stories_info(name);
    for (const json& assistant : assistants) {
      json msgs = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}, assistant});
      for (const json& c : assistant["tool_calls"]) {
        msgs.push_back({{"role", "tool"}, {"tool_call_id", c["id"]}, {"content", "{\"temp\": 19}"}});
      }
      for (const bool with_tools : {false, true}) {
        json extra = {{"messages", msgs}, {"max_tokens", 2}};
        if (with_tools) extra["tools"] = json::array({kWeatherTool});
        try {
          const ApiRequest r = parse_chat_request(chat_body(extra).dump(), m);
          EXPECT_FALSE(r.gen.prompt.empty());
          ++rendered;
        } catch (const ApiError& e) {
          EXPECT_EQ(e.status, 400) << e.what();
          ++refused;
        }
      }
    }
  }
  // Most render; some templates refuse some shapes by design, as under
  // Jinja2 (Mistral's call ids of 9 characters, Gemma's alternating roles,
  // Kimi's list.append outside the sandbox...).
  EXPECT_GT(rendered, 4 * refused) << rendered << " rendered, " << refused << " refused";
  // The request of the report, which killed the server: a prompt now.
  const ApiRequest r = parse_chat_request(
      R"({"model":"stories260K","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c",)"
      R"("type":"function",)"
      R"("function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"max_tokens":2})",
      stories_info("Qwen-Qwen2.5-7B-Instruct.jinja"));
  EXPECT_FALSE(r.gen.prompt.empty());
}

// The openai client's content parts reach the template as one string ("\n"
// between text parts): Qwen 2.5's template adds content to a string and
// once answered "unsupported operand type(s) for +: 'str' and 'list'".
// Parts other than text are refused by name.
TEST(ChatTools, TextPartsReachTheTemplateAsAString) {
  const ModelInfo m = stories_info("Qwen-Qwen2.5-7B-Instruct.jinja");
  auto prompt = [&](const json& content) {
    return parse_chat_request(chat_body({{"messages", json::array({{{"role", "user"}, {"content", content}}})}}).dump(), m)
        .gen.prompt;
  };
  EXPECT_EQ(prompt(json::array({{{"type", "text"}, {"text", "Hi"}}})), prompt("Hi"));
  EXPECT_EQ(prompt(json::array({{{"type", "text"}, {"text", "Hi"}}, {{"type", "text"}, {"text", "there"}}})),
            prompt("Hi\nthere"));
  expect_refused(m,
                 chat_body({{"messages", json::array({{{"role", "user"},
                                                       {"content", json::array({{{"type", "text"}, {"text", "Hi"}},
                                                                                {{"type", "image_url"},
                                                                                 {"image_url", {{"url", "x"}}}}})}}})}}),
                 "messages.[0].content.[1].type", "unsupported_parameter");
  // The family format, without a template, joins them the same way.
  const ModelInfo plain = stories_info();
  auto family = [&](const json& content) {
    return parse_chat_request(chat_body({{"messages", json::array({{{"role", "user"}, {"content", content}}})}}).dump(),
                              plain)
        .gen.prompt;
  };
  EXPECT_EQ(family(json::array({{{"type", "text"}, {"text", "Hi"}}, {{"type", "text"}, {"text", "there"}}})),
            family("Hi\nthere"));
}

// ---- response shapes, from fixture outputs fed as generation events ----

ApiRequest request_with(ChatOutputFormat f, bool stream) {
  ApiRequest r;
  r.endpoint = ApiEndpoint::chat;
  r.stream = stream;
  r.output = std::move(f);
  return r;
}

std::vector<GenerationEvent> events_of(const std::string& text, size_t piece, FinishReason end) {
  std::vector<GenerationEvent> evs;
  for (size_t i = 0; i < text.size(); i += piece) {
    GenerationEvent ev;
    ev.text = text.substr(i, piece);
    evs.push_back(std::move(ev));
  }
  GenerationEvent last;
  last.finish = end;
  last.usage.prompt_tokens = 5;
  last.usage.completion_tokens = 9;
  evs.push_back(std::move(last));
  return evs;
}

const std::string kQwenOutput =
    "<think>\nPlan: call the tool.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n"
    "</tool_call>";

ChatOutputFormat qwen_format() {
  ChatOutputFormat f;
  f.tools = ToolCallFormat::hermes;
  f.reasoning_start = "<think>";
  f.reasoning_end = "</think>";
  return f;
}

TEST(ChatTools, WholeResponseCarriesToolCallsAndReasoning) {
  ResponseBuilder b(request_with(qwen_format(), false), "m", "chatcmpl-1", 7);
  for (const auto& ev : events_of(kQwenOutput, 3, FinishReason::stop)) b.add(ev);
  const json j = json::parse(b.body());
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const json& msg = choice["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "Checking.");
  EXPECT_EQ(msg["reasoning_content"], "Plan: call the tool.");
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(msg["tool_calls"][1]["function"]["name"], "search");
  EXPECT_NE(msg["tool_calls"][0]["id"], msg["tool_calls"][1]["id"]);

  // Only calls: content is null. Cut by max_tokens: finish_reason stays length.
  ResponseBuilder only(request_with(qwen_format(), false), "m", "chatcmpl-2", 7);
  for (const auto& ev : events_of("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", 5, FinishReason::length)) {
    only.add(ev);
  }
  const json o = json::parse(only.body());
  EXPECT_TRUE(o["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(o["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(o["choices"][0]["message"].contains("reasoning_content"));

  // Malformed markup: content, finish_reason stop, no tool_calls field.
  ResponseBuilder bad(request_with(qwen_format(), false), "m", "chatcmpl-3", 7);
  for (const auto& ev : events_of("<tool_call>{oops</tool_call>", 4, FinishReason::stop)) bad.add(ev);
  const json x = json::parse(bad.body());
  EXPECT_EQ(x["choices"][0]["message"]["content"], "<tool_call>{oops</tool_call>");
  EXPECT_EQ(x["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(x["choices"][0]["message"].contains("tool_calls"));
}

// parallel_tool_calls false, as the request parser sets it: the response
// carries the first call alone and still finishes with tool_calls.
TEST(ChatTools, ParallelToolCallsFalseAnswersTheFirstCall) {
  const ModelInfo m = stories_info("Qwen-Qwen2.5-7B-Instruct.jinja");
  ApiRequest r = parse_chat_request(chat_body({{"tools", {kWeatherTool}}, {"parallel_tool_calls", false}}).dump(), m);
  EXPECT_FALSE(r.tools.parallel);
  ASSERT_TRUE(r.output.single_tool_call);
  EXPECT_EQ(r.gen.grammar, nullptr);  // auto: the model decides, the output side keeps one call
  ChatOutputFormat f = qwen_format();
  f.single_tool_call = true;
  ResponseBuilder b(request_with(f, false), "m", "chatcmpl-1", 7);
  for (const auto& ev : events_of(kQwenOutput, 3, FinishReason::stop)) b.add(ev);
  const json choice = json::parse(b.body())["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
}

// The users' case end to end below the HTTP server: DeepSeek V4 Flash's
// template, tools and reasoning_effort; the request's format parses what
// the model writes in thinking mode into reasoning, text and a DSML call.
TEST(ChatTools, DeepSeekV4ThinkingWithTools) {
  const ModelInfo m = stories_info("deepseek-ai-DeepSeek-V4-Flash-0731.jinja");
  const ApiRequest r =
      parse_chat_request(chat_body({{"tools", {kWeatherTool}}, {"reasoning_effort", "max"}}).dump(), m);
  EXPECT_EQ(r.output.tools, ToolCallFormat::deepseek_dsml);
  EXPECT_TRUE(r.output.reasoning_open);
  const std::string prompt = m.tokenizer->decode(r.gen.prompt);
  EXPECT_NE(prompt.find("## Tools"), std::string::npos);
  EXPECT_NE(prompt.find("\"name\": \"get_weather\""), std::string::npos);
  ResponseBuilder b(r, "m", "chatcmpl-1", 7);
  const std::string output =
      "The user wants Paris' weather.</think>Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>";
  for (const auto& ev : events_of(output, 7, FinishReason::stop)) b.add(ev);
  const json j = json::parse(b.body());
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["reasoning_content"], "The user wants Paris' weather.");
  EXPECT_EQ(msg["content"], "Checking.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
}

// Qwen3-Coder's and GLM's templates through the request: the XML format,
// its argument types from the request's tool schemas, and what the model
// writes back in the template's own markup parsed into typed arguments
// equal to those of the call the history held.
TEST(ChatTools, XmlCallsThroughTheRequest) {
  const json tool = json::parse(R"({"type": "function", "function": {"name": "edit", "parameters": {"type": "object",
      "properties": {"path": {"type": "string"}, "line": {"type": "integer"}, "dry": {"type": "boolean"},
      "opts": {"type": "object"}}}}})");
  const json args = {{"path", "42"}, {"line", 7}, {"dry", true}, {"opts", {{"a", json::array({1, "x"})}}}};
  const json history = json::array(
      {{{"role", "user"}, {"content", "Edit it."}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "edit"}, {"arguments", args.dump()}}}}}}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "done"}},
       {{"role", "user"}, {"content", "Again."}}});
  struct Case {
    const char* file;
    ToolCallFormat format;
    const char* open;   // the history's call, as the template rendered it, starts here
    const char* close;  // and ends here
  };
  for (const Case& c : {Case{"Qwen3-Coder.jinja", ToolCallFormat::qwen3_coder, "<tool_call>", "</tool_call>"},
                        Case{"GLM-4.6.jinja", ToolCallFormat::glm, "<tool_call>edit", "</tool_call>"}}) {
    SCOPED_TRACE(c.file);
    const ModelInfo m = stories_info(c.file);
    const ApiRequest r =
        parse_chat_request(chat_body({{"messages", history}, {"tools", {tool}}, {"max_tokens", 2}}).dump(), m);
    EXPECT_EQ(r.output.tools, c.format);
    ASSERT_EQ(r.output.argument_types.count("edit"), 1u);
    EXPECT_EQ(r.output.argument_types.at("edit").at("path"), kArgString);
    EXPECT_EQ(r.output.argument_types.at("edit").at("line"), kArgInteger);
    // The model writes a call as its template writes one: the history's.
    const std::string prompt = m.tokenizer->decode(r.gen.prompt);
    const size_t from = prompt.rfind(c.open);
    ASSERT_NE(from, std::string::npos) << prompt;
    const size_t to = prompt.find(c.close, from);
    ASSERT_NE(to, std::string::npos) << prompt;
    const std::string call = prompt.substr(from, to + std::string(c.close).size() - from);
    ResponseBuilder b(r, "m", "chatcmpl-1", 7);
    for (const auto& ev : events_of("Editing.\n" + call, 3, FinishReason::stop)) b.add(ev);
    const json j = json::parse(b.body());
    const json& msg = j["choices"][0]["message"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(msg["content"], "Editing.");
    ASSERT_EQ(msg["tool_calls"].size(), 1u) << call;
    EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "edit");
    EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), args) << call;
    // tool_choice required: a grammar of this syntax forces the call.
    EXPECT_EQ(r.gen.grammar, nullptr);
    const ApiRequest forced = parse_chat_request(
        chat_body({{"messages", history}, {"tools", {tool}}, {"tool_choice", "required"}, {"max_tokens", 2}}).dump(), m);
    EXPECT_NE(forced.gen.grammar, nullptr);
  }
}

TEST(ChatTools, StreamCarriesToolCallDeltas) {
  for (size_t piece : {1, 4, 1000}) {
    SCOPED_TRACE(piece);
    ResponseBuilder b(request_with(qwen_format(), true), "m", "chatcmpl-1", 7);
    std::vector<std::string> chunks;
    for (const auto& ev : events_of(kQwenOutput, piece, FinishReason::stop)) {
      for (auto& c : b.stream_chunks(ev)) chunks.push_back(std::move(c));
    }
    ASSERT_GE(chunks.size(), 3u);
    EXPECT_EQ(chunks.back(), "data: [DONE]\n\n");
    std::string content, reasoning, finish;
    std::vector<json> calls;  // id, name, arguments per index
    bool first = true;
    for (size_t i = 0; i + 1 < chunks.size(); ++i) {
      ASSERT_EQ(chunks[i].rfind("data: ", 0), 0u);
      const json j = json::parse(chunks[i].substr(6));
      const json& c = j["choices"][0];
      if (first) EXPECT_EQ(c["delta"]["role"], "assistant");
      first = false;
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      const json& d = c["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (!d.contains("tool_calls")) continue;
      for (const json& t : d["tool_calls"]) {
        const size_t index = t["index"].get<size_t>();
        if (index == calls.size()) {
          // A call's first delta: id, type and name.
          ASSERT_TRUE(t.contains("id")) << t.dump();
          EXPECT_EQ(t["type"], "function");
          calls.push_back({{"id", t["id"]}, {"name", t["function"]["name"]}, {"arguments", ""}});
        } else {
          ASSERT_LT(index, calls.size());
          EXPECT_FALSE(t.contains("id")) << t.dump();
          EXPECT_FALSE(t["function"].contains("name")) << t.dump();
        }
        calls[index]["arguments"] = calls[index]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_EQ(content, "Checking.");
    EXPECT_EQ(reasoning, "Plan: call the tool.");
    EXPECT_EQ(finish, "tool_calls");
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0]["name"], "get_weather");
    EXPECT_EQ(calls[0]["arguments"], "{\"city\": \"Paris\"}");
    EXPECT_EQ(calls[1]["arguments"], "{\"q\": \"x\"}");
  }
}

}  // namespace
}  // namespace baton
