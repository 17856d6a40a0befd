// ChatOutputParser on realistic model outputs of every format: content,
// reasoning and tool calls parsed from the whole text equal what any chunking
// gives (byte by byte, every split in two, random cuts), arguments stream
// before the call's markup ends, and malformed markup comes back as content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

#include "chat/output/arguments.h"
#include "chat/output/parser.h"

namespace baton {
namespace {

using json = nlohmann::json;

ChatOutputFormat format(ToolCallFormat tools, std::string open = "", std::string close = "", bool opened = false) {
  ChatOutputFormat f;
  f.tools = tools;
  f.reasoning_start = std::move(open);
  f.reasoning_end = std::move(close);
  f.reasoning_open = opened;
  return f;
}

ChatOutput parse_chunks(const ChatOutputFormat& f, const std::string& text, const std::vector<size_t>& cuts) {
  ChatOutputParser p(f);
  size_t at = 0;
  for (size_t c : cuts) {
    p.push(std::string_view(text).substr(at, c - at));
    at = c;
  }
  p.push(std::string_view(text).substr(at));
  p.finish();
  return p.output();
}

struct Expected {
  std::string content, reasoning;
  std::vector<std::pair<std::string, json>> calls;  // name, arguments
};

void expect_output(const ChatOutput& got, const Expected& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  EXPECT_EQ(got.reasoning, want.reasoning) << what;
  ASSERT_EQ(got.tool_calls.size(), want.calls.size()) << what;
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, want.calls[i].first) << what;
    const json args = json::parse(got.tool_calls[i].arguments, nullptr, false);
    EXPECT_EQ(args, want.calls[i].second) << what << ": arguments " << got.tool_calls[i].arguments;
    EXPECT_FALSE(got.tool_calls[i].id.empty()) << what;
  }
}

// Whole, byte by byte, every split in two and random cuts all give `want`.
void check_all_chunkings(const ChatOutputFormat& f, const std::string& text, const Expected& want) {
  const ChatOutput whole = parse_chunks(f, text, {});
  expect_output(whole, want, "whole");
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const ChatOutput bytes = parse_chunks(f, text, every);
  expect_output(bytes, want, "byte by byte");
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    EXPECT_EQ(bytes.tool_calls[i].arguments, whole.tool_calls[i].arguments) << "byte by byte, call " << i;
  }
  for (size_t cut = 1; cut < text.size(); ++cut) {
    const ChatOutput two = parse_chunks(f, text, {cut});
    ASSERT_EQ(two.content, whole.content) << "split at " << cut;
    ASSERT_EQ(two.reasoning, whole.reasoning) << "split at " << cut;
    ASSERT_EQ(two.tool_calls.size(), whole.tool_calls.size()) << "split at " << cut;
    for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
      ASSERT_EQ(two.tool_calls[i].name, whole.tool_calls[i].name) << "split at " << cut;
      ASSERT_EQ(two.tool_calls[i].arguments, whole.tool_calls[i].arguments) << "split at " << cut;
    }
  }
  std::mt19937 rng(1234);
  for (int round = 0; round < 50; ++round) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 5 == 0) cuts.push_back(i);
    }
    const ChatOutput r = parse_chunks(f, text, cuts);
    EXPECT_EQ(r.content, whole.content) << "seed 1234 round " << round;
    EXPECT_EQ(r.reasoning, whole.reasoning) << "seed 1234 round " << round;
    ASSERT_EQ(r.tool_calls.size(), whole.tool_calls.size()) << "seed 1234 round " << round;
  }
}

// DeepSeek V4 in thinking mode: the prompt ended with <think>, so the output
// opens with the reasoning; then text and a DSML block of two calls.
const std::string kDsmlOutput =
    "The user asks about Zürich; I need the weather tool.\n</think>Let me check the weather.\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Zürich \"old town\"</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"unit\": \"celsius\", \"alerts\": [1, 2]}"
    "</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"search\">\n"
    "<｜DSML｜parameter name=\"query\" string=\"true\">hotels\nnear <lake> \\ 50%</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>";

TEST(ChatOutput, DeepSeekDsmlWithReasoning) {
  check_all_chunkings(format(ToolCallFormat::deepseek_dsml, "<think>", "</think>", true), kDsmlOutput,
                      {"Let me check the weather.",
                       "The user asks about Zürich; I need the weather tool.",
                       {{"get_weather", {{"city", "Zürich \"old town\""}, {"days", 2},
                                         {"opts", {{"unit", "celsius"}, {"alerts", {1, 2}}}}}},
                        {"search", {{"query", "hotels\nnear <lake> \\ 50%"}}}}});
}

// DeepSeek V3.2 writes function_calls; an invoke without parameters has {}
// arguments; a string="false" value that is not JSON becomes a string.
TEST(ChatOutput, DeepSeekDsmlFunctionCallsAndOddValues) {
  const std::string text =
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">not json</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"y\" string=\"false\"> true </｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "</｜DSML｜function_calls>";
  check_all_chunkings(format(ToolCallFormat::deepseek_dsml, "<think>", "</think>"), text,
                      {"", "", {{"now", json::object()}, {"f", {{"x", "not json"}, {"y", true}}}}});
}

// The arguments stream: byte by byte, the first call's arguments have come
// (in several deltas) before its invoke closes, and its id and name came
// once, in the first delta of the call.
TEST(ChatOutput, DsmlArgumentsStreamBeforeTheCallEnds) {
  ChatOutputParser p(format(ToolCallFormat::deepseek_dsml, "<think>", "</think>", true));
  const size_t close = kDsmlOutput.find("</｜DSML｜invoke>");
  std::string args_before_close;
  int arg_deltas = 0, headers = 0;
  for (size_t i = 0; i < kDsmlOutput.size(); ++i) {
    const ChatOutputDelta d = p.push(std::string_view(kDsmlOutput).substr(i, 1));
    for (const auto& t : d.tool_calls) {
      if (t.index != 0) continue;
      if (!t.name.empty()) {
        ++headers;
        EXPECT_EQ(t.name, "get_weather");
        EXPECT_EQ(t.id.rfind("call_", 0), 0u) << t.id;
        EXPECT_EQ(t.id.size(), 29u);
      }
      if (!t.arguments.empty()) ++arg_deltas;
      if (i < close) args_before_close += t.arguments;
    }
  }
  p.finish();
  EXPECT_EQ(headers, 1);
  EXPECT_GT(arg_deltas, 10);
  EXPECT_EQ(args_before_close.rfind("{\"city\": \"Zürich \\\"old town\\\"\", \"days\": 2", 0), 0u) << args_before_close;
  EXPECT_NE(p.output().tool_calls[0].id, p.output().tool_calls[1].id);
}

// Qwen 3 (Hermes syntax): the model opens its reasoning itself; two calls,
// the second with braces and quotes inside a string.
TEST(ChatOutput, HermesQwenWithThinking) {
  const std::string text =
      "<think>\nThe user wants the weather, and a search.\n</think>\n\n"
      "I will look both up.\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a } tricky \\\" string {\"}}\n</tool_call>";
  check_all_chunkings(format(ToolCallFormat::hermes, "<think>", "</think>"), text,
                      {"I will look both up.",
                       "The user wants the weather, and a search.",
                       {{"get_weather", {{"city", "Paris"}, {"days", 3}}},
                        {"search", {{"query", "a } tricky \" string {"}}}}});
}

// Keys in another order, or an extra key: the object is held whole, then parsed.
TEST(ChatOutput, HermesOtherKeyOrders) {
  const std::string text =
      "<tool_call>{\"arguments\": {\"q\": [1, {\"a\": null}]}, \"name\": \"f\"}</tool_call>"
      "<tool_call>{\"name\": \"g\", \"arguments\": {}, \"id\": \"x\"}</tool_call>";
  check_all_chunkings(format(ToolCallFormat::hermes), text,
                      {"", "", {{"f", {{"q", {1, {{"a", nullptr}}}}}}, {"g", json::object()}}});
}

// Llama 3.x: the call is the whole answer, with or without <|python_tag|>.
TEST(ChatOutput, Llama3Json) {
  check_all_chunkings(format(ToolCallFormat::llama3_json),
                      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\"}}",
                      {"", "", {{"get_weather", {{"city", "San Francisco, CA"}}}}});
  check_all_chunkings(format(ToolCallFormat::llama3_json),
                      "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"llamas\"}}",
                      {"", "", {{"search", {{"query", "llamas"}}}}});
  // Two calls separated by a semicolon.
  check_all_chunkings(format(ToolCallFormat::llama3_json),
                      " {\"name\": \"a\", \"parameters\": {}}; {\"type\": \"function\", \"name\": \"b\", "
                      "\"parameters\": {\"x\": 1}}",
                      {"", "", {{"a", json::object()}, {"b", {{"x", 1}}}}});
  // JSON that is not a call, and a call after text, are content.
  check_all_chunkings(format(ToolCallFormat::llama3_json), "{\"result\": 5, \"ok\": true}",
                      {"{\"result\": 5, \"ok\": true}", "", {}});
  check_all_chunkings(format(ToolCallFormat::llama3_json),
                      "Sure: {\"name\": \"f\", \"parameters\": {}}", {"Sure: {\"name\": \"f\", \"parameters\": {}}", "", {}});
}

// Mistral Nemo's list, and the name[ARGS] form of Small 3.2 / Devstral /
// Ministral 3 (with [CALL_ID] as its template writes it back), and [THINK].
TEST(ChatOutput, Mistral) {
  check_all_chunkings(format(ToolCallFormat::mistral),
                      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
                      "\"abc123def\"}, {\"name\": \"search\", \"arguments\": {\"query\": \"x]\"}}]",
                      {"", "", {{"get_weather", {{"city", "Paris"}}}, {"search", {{"query", "x]"}}}}});
  check_all_chunkings(format(ToolCallFormat::mistral, "[THINK]", "[/THINK]"),
                      "[THINK]Two lookups.[/THINK]On it.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"
                      "[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{\"query\": \"x\"}",
                      {"On it.", "Two lookups.", {{"get_weather", {{"city", "Paris"}}}, {"search", {{"query", "x"}}}}});
  ChatOutputParser p(format(ToolCallFormat::mistral));
  p.push("[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{}[TOOL_CALLS]g[ARGS]{}");
  p.finish();
  ASSERT_EQ(p.output().tool_calls.size(), 2u);
  EXPECT_EQ(p.output().tool_calls[0].id, "a1b2c3d4e");
  // Mistral's templates take back only ids of 9 letters and digits.
  EXPECT_EQ(p.output().tool_calls[1].id.size(), 9u);
}

// The tools of the XML samples, their parameters typed as a request's
// schemas type them (request_output_format).
ChatOutputFormat xml_format(ToolCallFormat tools, std::string open = "", std::string close = "", bool opened = false) {
  ChatOutputFormat f = format(tools, std::move(open), std::move(close), opened);
  f.argument_types["get_weather"] = {{"city", kArgString}, {"days", kArgInteger}, {"metric", kArgBoolean},
                                     {"opts", kArgObject}, {"note", kArgString | kArgNull}};
  f.argument_types["write_file"] = {{"path", kArgString}, {"content", kArgString}, {"mode", kArgNumber}};
  return f;
}

// Qwen3-Coder, as its template writes calls: text first, two calls, values
// typed by schema (Python's True, a "42" that the schema says is a string),
// string values holding markup-like text and newlines.
const std::string kQwenXmlOutput =
    "I'll check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich \"old town\"\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
    "<parameter=opts>\n{\"unit\": \"celsius\", \"alerts\": [1, 2]}\n</parameter>\n"
    "<parameter=note>\nNone\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=write_file>\n<parameter=path>\n42\n</parameter>\n<parameter=content>\n"
    "<div class=\"a\">\n  <parameter=x> </function> </tool_call>\n</div>\n\n</parameter>\n"
    "<parameter=mode>\n0.5\n</parameter>\n</function>\n</tool_call>";

TEST(ChatOutput, Qwen3CoderXml) {
  check_all_chunkings(xml_format(ToolCallFormat::qwen3_coder), kQwenXmlOutput,
                      {"I'll check both.",
                       "",
                       {{"get_weather", {{"city", "Zürich \"old town\""}, {"days", 2}, {"metric", true},
                                         {"opts", {{"unit", "celsius"}, {"alerts", {1, 2}}}}, {"note", nullptr}}},
                        {"write_file", {{"path", "42"},
                                        {"content", "<div class=\"a\">\n  <parameter=x> </function> </tool_call>\n</div>\n"},
                                        {"mode", 0.5}}}}});
  // With reasoning (Qwen 3.5, Nemotron 3 Nano), a call without parameters,
  // two functions in one <tool_call>, and parameters of no known type: JSON
  // when they parse, else strings.
  check_all_chunkings(xml_format(ToolCallFormat::qwen3_coder, "<think>", "</think>", true),
                      "Plan.\n</think>\n\n<tool_call>\n<function=now>\n</function>\n<function=lookup>\n"
                      "<parameter=n>\n5\n</parameter>\n<parameter=q>\nfive apples\n</parameter>\n"
                      "<parameter=l>\n[1, \"a\"]\n</parameter>\n</function>\n</tool_call>",
                      {"", "Plan.", {{"now", json::object()}, {"lookup", {{"n", 5}, {"q", "five apples"}, {"l", {1, "a"}}}}}});
}

// A value that does not fit its schema's types is the model's text, as a
// string; 3.0 for an integer is 3; surrounding whitespace of JSON values
// goes, of strings stays.
TEST(ChatOutput, XmlArgumentTyping) {
  EXPECT_EQ(typed_argument(" 42 ", kArgString), "\" 42 \"");
  EXPECT_EQ(typed_argument("42", kArgInteger), "42");
  EXPECT_EQ(typed_argument("3.0", kArgInteger), "3");
  EXPECT_EQ(typed_argument("3.5", kArgInteger), "\"3.5\"");
  EXPECT_EQ(typed_argument("7", kArgNumber), "7");
  EXPECT_EQ(typed_argument("abc", kArgInteger), "\"abc\"");
  EXPECT_EQ(typed_argument("False", kArgBoolean), "false");
  EXPECT_EQ(typed_argument("false", kArgBoolean | kArgString), "false");
  EXPECT_EQ(typed_argument("maybe", kArgBoolean | kArgString), "\"maybe\"");
  EXPECT_EQ(typed_argument("\"q\"", kArgString | kArgInteger), "\"\\\"q\\\"\"");  // a JSON string stays text
  EXPECT_EQ(typed_argument("\"q\"", 0), "\"q\"");
  EXPECT_EQ(typed_argument("null", kArgString | kArgNull), "null");
  EXPECT_EQ(typed_argument(" {\"a\": 1}\n", kArgObject), "{\"a\": 1}");
  EXPECT_EQ(typed_argument("[1]", kArgObject), "\"[1]\"");
  EXPECT_EQ(typed_argument("True", 0), "true");
  // Schemas to types.
  using ojson = nlohmann::ordered_json;
  EXPECT_EQ(schema_argument_types(ojson::parse(R"({"type": "string", "enum": ["a"]})")), kArgString);
  EXPECT_EQ(schema_argument_types(ojson::parse(R"({"type": ["integer", "null"]})")), kArgInteger | kArgNull);
  EXPECT_EQ(schema_argument_types(ojson::parse(R"({"anyOf": [{"type": "string"}, {"type": "array"}]})")),
            kArgString | kArgArray);
  EXPECT_EQ(schema_argument_types(ojson::parse(R"({"enum": [1, "x"]})")), kArgInteger | kArgString);
  EXPECT_EQ(schema_argument_types(ojson::parse(R"({"properties": {}})")), kArgObject);
  EXPECT_EQ(schema_argument_types(ojson::parse(R"({"$ref": "#/defs/x"})")), 0);
  EXPECT_EQ(schema_argument_types(ojson::parse(R"({"anyOf": [{"type": "string"}, {}]})")), 0);
}

// GLM 4.5 / 4.6 with reasoning, text, two calls (one without arguments);
// GLM 4.7 writes the same markup without newlines.
TEST(ChatOutput, GlmXml) {
  const Expected want = {
      "Checking.",
      "Need the weather.",
      {{"get_weather", {{"city", "Zürich\n<b>old</b> </arg_value"}, {"days", 2}, {"opts", {{"unit", "c"}}},
                        {"note", "None of <arg_key>"}}},
       {"now", json::object()}}};
  check_all_chunkings(
      xml_format(ToolCallFormat::glm, "<think>", "</think>"),
      "<think>Need the weather.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Zürich\n<b>old</b> </arg_value</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
      "<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"c\"}</arg_value>\n<arg_key>note</arg_key>\n"
      "<arg_value>None of <arg_key></arg_value>\n</tool_call>\n<tool_call>now\n</tool_call>",
      want);
  check_all_chunkings(
      xml_format(ToolCallFormat::glm, "<think>", "</think>", true),
      "Need the weather.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich\n<b>old</b> "
      "</arg_value</arg_value><arg_key>days</arg_key><arg_value>2</arg_value><arg_key>opts</arg_key>"
      "<arg_value>{\"unit\": \"c\"}</arg_value><arg_key>note</arg_key><arg_value>None of <arg_key></arg_value>"
      "</tool_call><tool_call>now</tool_call>",
      want);
}

// String arguments stream before their closing tag; the newline before
// Qwen3-Coder's </parameter> is held until it is known not to be markup.
TEST(ChatOutput, XmlArgumentsStreamBeforeTheCallEnds) {
  ChatOutputParser p(xml_format(ToolCallFormat::qwen3_coder));
  const size_t close = kQwenXmlOutput.find("</function>");
  std::string before_close;
  int arg_deltas = 0, headers = 0;
  for (size_t i = 0; i < kQwenXmlOutput.size(); ++i) {
    const ChatOutputDelta d = p.push(std::string_view(kQwenXmlOutput).substr(i, 1));
    for (const auto& t : d.tool_calls) {
      if (t.index != 0) continue;
      if (!t.name.empty()) ++headers;
      if (!t.arguments.empty()) ++arg_deltas;
      if (i < close) before_close += t.arguments;
    }
  }
  p.finish();
  EXPECT_EQ(headers, 1);
  EXPECT_GT(arg_deltas, 10);
  EXPECT_EQ(before_close.rfind("{\"city\": \"Zürich \\\"old town\\\"\", \"days\": 2, \"metric\": true", 0), 0u)
      << before_close;
  EXPECT_EQ(p.output().tool_calls[0].arguments,
            "{\"city\": \"Zürich \\\"old town\\\"\", \"days\": 2, \"metric\": true, \"opts\": {\"unit\": "
            "\"celsius\", \"alerts\": [1, 2]}, \"note\": null}");
}

// Malformed or unfinished markup is content; nothing is lost.
TEST(ChatOutput, MalformedMarkupIsContent) {
  struct Case {
    ToolCallFormat f;
    std::string text;
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::hermes, "Here: <tool_call>{\"name\": \"f\", \"argu"},
      {ToolCallFormat::hermes, "<tool_call>not json at all</tool_call> then text"},
      {ToolCallFormat::hermes, "<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>"},
      {ToolCallFormat::hermes, "a <tool_cal"},
      {ToolCallFormat::deepseek_dsml, "<｜DSML｜tool_calls>\nhello"},
      {ToolCallFormat::deepseek_dsml, "x <｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f"},
      {ToolCallFormat::deepseek_dsml, "<｜DSML｜tool_calls><｜DSML｜invoke name=\"a b\"x"},
      {ToolCallFormat::mistral, "[TOOL_CALLS] hello there"},
      {ToolCallFormat::mistral, "[TOOL_CALLS]f[ARGS]\"not an object\""},
      {ToolCallFormat::mistral, "[TOOL_CALLS][{\"no\": \"name\"}]"},
      {ToolCallFormat::llama3_json, "{\"name\": \"f\", \"parameters\": "},
      {ToolCallFormat::llama3_json, "<|python_tag|>brave_search.call(query=\"x\")"},
      {ToolCallFormat::qwen3_coder, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::qwen3_coder, "Use <tool_call> to call.\n<tool_call>\n<function=f"},
      {ToolCallFormat::qwen3_coder, "<tool_call>\n<function=a\"b>\n</function>"},
      {ToolCallFormat::glm, "The <tool_call> tag is how I call tools."},
      {ToolCallFormat::glm, "<tool_call>f\nno arguments here</tool_call>"},
      {ToolCallFormat::glm, "<tool_call>get_weather\n<arg_ke"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    check_all_chunkings(format(c.f), c.text, {c.text, "", {}});
  }
  // Reasoning that never closes is reasoning; without markers all is content.
  check_all_chunkings(format(ToolCallFormat::none, "<think>", "</think>"), "<think>still thinking",
                      {"", "still thinking", {}});
  check_all_chunkings(format(ToolCallFormat::none), "<think>a</think>b <tool_call>", {"<think>a</think>b <tool_call>", "", {}});
}

// A committed call whose markup breaks ends there: the call keeps what came,
// the rest is content.
TEST(ChatOutput, BrokenCommittedCallEndsTheCall) {
  check_all_chunkings(format(ToolCallFormat::deepseek_dsml),
                      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                      "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\noops",
                      {"oops", "", {{"f", {{"a", "x"}}}}});
  // Cut by max_tokens inside a string value: the value and the object close.
  check_all_chunkings(format(ToolCallFormat::deepseek_dsml),
                      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                      "<｜DSML｜parameter name=\"a\" string=\"true\">unfinish",
                      {"", "", {{"f", {{"a", "unfinish"}}}}});
  // The XML formats alike: a break after a parameter, a cut inside a
  // string value (typed) and inside a value held for typing.
  check_all_chunkings(format(ToolCallFormat::qwen3_coder),
                      "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\noops",
                      {"oops", "", {{"f", {{"a", "x"}}}}});
  check_all_chunkings(xml_format(ToolCallFormat::qwen3_coder),
                      "<tool_call>\n<function=get_weather>\n<parameter=city>\nunfinish",
                      {"", "", {{"get_weather", {{"city", "unfinish"}}}}});
  check_all_chunkings(xml_format(ToolCallFormat::glm), "<tool_call>get_weather\n<arg_key>days</arg_key><arg_value>12",
                      {"", "", {{"get_weather", {{"days", 12}}}}});
  check_all_chunkings(format(ToolCallFormat::glm), "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\noops",
                      {"oops", "", {{"f", {{"a", 1}}}}});
}

TEST(ChatOutput, ReasoningMarkersAndWhitespace) {
  // The prompt opened the block; the model writes the marker again.
  check_all_chunkings(format(ToolCallFormat::none, "<think>", "</think>", true),
                      "\n<think>\nstep one\nstep two\n\n</think>\n\nThe answer is 4.",
                      {"The answer is 4.", "step one\nstep two", {}});
  // Not at the start: content.
  check_all_chunkings(format(ToolCallFormat::none, "<think>", "</think>"), "Hi <think>x</think>",
                      {"Hi <think>x</think>", "", {}});
  // Without tools, content is passed as it is, whitespace included.
  check_all_chunkings(format(ToolCallFormat::none), "  Once upon a time \n", {"  Once upon a time \n", "", {}});
}

// single_tool_call (parallel_tool_calls false, disable_parallel_tool_use):
// in every format, the first call is returned whole and everything from
// the start of a second call on is dropped, whatever the chunking.
TEST(ChatOutput, SingleToolCallDropsTheSecondCall) {
  auto single = [](ChatOutputFormat f) {
    f.single_tool_call = true;
    return f;
  };
  check_all_chunkings(single(format(ToolCallFormat::hermes, "<think>", "</think>")),
                      "<think>\nPlan.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
                      "{\"q\": \"x\"}}\n</tool_call> and more",
                      {"Checking.", "Plan.", {{"get_weather", {{"city", "Paris"}}}}});
  check_all_chunkings(single(format(ToolCallFormat::llama3_json)),
                      " {\"name\": \"a\", \"parameters\": {}}; {\"type\": \"function\", \"name\": \"b\", "
                      "\"parameters\": {\"x\": 1}}",
                      {"", "", {{"a", json::object()}}});
  check_all_chunkings(single(format(ToolCallFormat::mistral)),
                      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                      "{\"name\": \"search\", \"arguments\": {\"query\": \"x]\"}}]",
                      {"", "", {{"get_weather", {{"city", "Paris"}}}}});
  check_all_chunkings(single(format(ToolCallFormat::mistral)),
                      "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]search[ARGS]{\"query\": \"x\"}",
                      {"", "", {{"get_weather", {{"city", "Paris"}}}}});
  check_all_chunkings(single(format(ToolCallFormat::deepseek_dsml, "<think>", "</think>", true)), kDsmlOutput,
                      {"Let me check the weather.",
                       "The user asks about Zürich; I need the weather tool.",
                       {{"get_weather", {{"city", "Zürich \"old town\""}, {"days", 2},
                                         {"opts", {{"unit", "celsius"}, {"alerts", {1, 2}}}}}}}});
  check_all_chunkings(single(format(ToolCallFormat::qwen3_coder)),
                      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                      "</tool_call>\n<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n</function>\n"
                      "</tool_call>",
                      {"", "", {{"get_weather", {{"city", "Paris"}}}}});
  check_all_chunkings(single(format(ToolCallFormat::glm)),
                      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
                      "<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>x</arg_value>\n</tool_call>",
                      {"", "", {{"get_weather", {{"city", "Paris"}}}}});
  // One call alone is untouched.
  check_all_chunkings(single(format(ToolCallFormat::hermes)),
                      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
                      {"", "", {{"now", json::object()}}});
}

}  // namespace
}  // namespace baton
