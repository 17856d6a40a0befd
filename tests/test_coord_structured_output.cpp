// Structured output end to end in process: models sampling at temperature 1
// under a JSON schema's grammar write JSON that validates against the schema,
// for every seed (100 on stories260K, 20 on a random-weight model with the
// real 32000-token Llama-2 vocabulary); response_format is parsed, or refused
// with a 400 naming what is not supported; forced tool calls.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "coordinator/api/openai_request.h"
#include "chat/output_format.h"
#include "chat/tool_call_grammar.h"
#include "coordinator/cluster/local_engine.h"
#include "chat/jinja_prompt.h"
#include "engine/sampling/json_schema.h"
#include "engine/text/tokenizer.h"
#include "tests/json_schema_check.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using ojson = nlohmann::ordered_json;

struct Outcome {
  std::string text;
  FinishReason finish = FinishReason::error;
  std::string error;
  bool done = false;
};

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0},
    "score": {"type": ["number", "null"]},
    "kind": {"enum": ["cat", "dog", 7, null]},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 2},
    "ok": {"type": "boolean"},
    "pet": {"type": "object", "properties": {"legs": {"const": 4}}, "required": ["legs"]}
  },
  "required": ["name", "age", "kind", "tags"],
  "$defs": {"tag": {"type": "string", "minLength": 1, "maxLength": 3}}
})";

// Every seed at once on `model`, sampling at temperature 1 under the
// schema's grammar: each text ends with stop and validates.
void check_seeds(const std::string& model, int seeds) {
  LocalEngineConfig c;
  c.model_path = test::model_path(model);
  c.stage.n_ctx = 1024;
  c.stage.n_seq = 4;
  c.stage.max_batch = 64;
  c.queue_capacity = seeds;  // every seed at once
  LocalEngine engine(c, nullptr);
  engine.wait_loaded();
  const ojson schema = ojson::parse(kSchema);
  auto grammar = json_schema_grammar(schema);
  const auto prompt = engine.model().tokenizer->encode("Answer in JSON:", true, false);

  std::mutex mu;
  std::condition_variable cv;
  std::vector<Outcome> out(static_cast<size_t>(seeds));
  int finished = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    GenerationRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 40;  // of the allowed tokens (the others are -infinity)
    r.sampling.top_p = 1;
    r.sampling.min_p = 0;
    r.sampling.seed = uint64_t(seed);
    r.max_tokens = 600;  // above the longest text the schema admits, in single-byte tokens
    r.grammar = grammar;
    engine.submit(std::move(r), [&, seed](GenerationEvent&& ev) {
      std::lock_guard lock(mu);
      Outcome& o = out[size_t(seed)];
      o.text += ev.text;
      if (ev.finish) {
        o.finish = *ev.finish;
        o.error = ev.error;
        o.done = true;
        ++finished;
        cv.notify_all();
      }
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return finished == seeds; });
  std::set<std::string> distinct;
  for (int seed = 0; seed < seeds; ++seed) {
    const Outcome& o = out[size_t(seed)];
    SCOPED_TRACE(model + " seed " + std::to_string(seed) + ": " + o.text);
    ASSERT_EQ(o.finish, FinishReason::stop) << o.error;  // the grammar completed
    const ojson v = ojson::parse(o.text, nullptr, false);
    ASSERT_FALSE(v.is_discarded());
    EXPECT_EQ(test::schema_violation(v, schema, schema), "");
    distinct.insert(o.text);
  }
  // Sampling still samples: the seeds give different documents.
  EXPECT_GT(distinct.size(), size_t(seeds / 2));
}

// 100 seeds on the 512-token SentencePiece vocabulary (fast), 20 on the
// random-weight model with the real 32000-token Llama-2 vocabulary.
TEST(StructuredOutput, ValidJsonForEverySeedSmallVocabulary) { check_seeds("stories260K.gguf", 100); }
TEST(StructuredOutput, RandomModelWritesValidJsonForEverySeed) { check_seeds("llama-2-tiny-random.gguf", 20); }

ModelInfo model_for_parsing() {
  GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  return model_info_from_gguf(f, test::model_path("stories260K.gguf"), "m", 2048);
}

TEST(StructuredOutput, ResponseFormatIsParsed) {
  const ModelInfo m = model_for_parsing();
  auto chat = [&](const std::string& rf) {
    return parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":)" + rf + "}", m);
  };
  EXPECT_EQ(chat(R"({"type":"text"})").gen.grammar, nullptr);
  ApiRequest obj = chat(R"({"type":"json_object"})");
  ASSERT_NE(obj.gen.grammar, nullptr);
  GrammarMatcher om(obj.gen.grammar);
  EXPECT_TRUE(om.advance(R"({"a": [1]})") && om.finished());
  ApiRequest js = chat(R"({"type":"json_schema","json_schema":{"name":"x","strict":true,
      "schema":{"type":"object","properties":{"z":{"type":"null"},"a":{"type":"boolean"}},"required":["z","a"]}}})");
  ASSERT_NE(js.gen.grammar, nullptr);
  GrammarMatcher jm(js.gen.grammar);
  // The schema's own order (z before a), not the alphabetical one.
  EXPECT_TRUE(jm.advance(R"({"z":null,"a":true})") && jm.finished());
  ApiRequest comp = parse_completion_request(R"({"model":"m","prompt":"x","response_format":{"type":"json_object"}})", m);
  EXPECT_NE(comp.gen.grammar, nullptr);
}

TEST(StructuredOutput, UnsupportedResponseFormatsAre400s) {
  const ModelInfo m = model_for_parsing();
  const std::pair<std::string, std::string> cases[] = {
      {R"({"type":"yaml"})", "response_format type 'yaml' is not supported"},
      {R"("json")", "Invalid type for 'response_format'"},
      {R"({"type":"json_schema"})", "'response_format.json_schema' is required"},
      {R"({"type":"json_schema","json_schema":{"schema":{}}})", "'response_format.json_schema.name' is required"},
      {R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"a+"}}})",
       "'pattern' is not supported (at #)"},
      {R"({"type":"json_schema","json_schema":{"name":"x","schema":{"properties":{"n":{"type":"integer","multipleOf":2}}}}})",
       "'multipleOf' is not supported (at #/properties/n)"},
  };
  for (const auto& [rf, want] : cases) {
    try {
      parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":)" + rf + "}", m);
      ADD_FAILURE() << "accepted " << rf;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// A $ref chain 5,000 deep (382 KB, within every request limit) once
// overflowed the compiler's stack: now a 400 naming the depth limit, through
// response_format and through a tool's parameters alike. A chain within the
// limit, and a property name of 10,000 bytes beside additionalProperties
// (once a recursion as deep as the name), still compile.
std::string ref_defs(int n) {  // "$defs": d0 -> d1 -> ... -> dn, an integer
  std::string defs;
  for (int i = 0; i < n; ++i) {
    defs += fmt::format(R"("d{}":{{"$ref":"#/$defs/d{}"}},)", i, i + 1);
  }
  defs += fmt::format(R"("d{}":{{"type":"integer"}})", n);
  return R"("$defs":{)" + defs + "}";
}
std::string ref_chain(int n) { return R"({"$ref":"#/$defs/d0",)" + ref_defs(n) + "}"; }

TEST(StructuredOutput, DeepSchemasAre400sNotCrashes) {
  ModelInfo m = model_for_parsing();
  m.n_ctx = 1 << 20;  // the tools are rendered into the prompt first
  m.chat_template = load_chat_template_file(test::shared_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  const std::string head = R"({"model":"m","messages":[{"role":"user","content":"hi"}],)";
  const std::string deep = ref_chain(5000);
  ASSERT_GT(deep.size(), 100000u);
  for (const std::string& body :
       {head + R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)" + deep + "}}}",
        head + R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",)" +
            R"("properties":{"a":{"$ref":"#/$defs/d0"}},)" + ref_defs(5000) + R"(}}}],"tool_choice":"required"})"}) {
    try {
      parse_chat_request(body, m);
      ADD_FAILURE() << "accepted a 5,000-deep $ref chain";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find(fmt::format("deeper than {} levels", kMaxSchemaDepth)), std::string::npos)
          << e.what();
    }
  }
  ApiRequest ok = parse_chat_request(
      head + R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)" + ref_chain(40) + "}}}", m);
  ASSERT_NE(ok.gen.grammar, nullptr);
  GrammarMatcher om(ok.gen.grammar);
  EXPECT_TRUE(om.advance("42") && om.accepting());  // a number may go on: accepting, not finished

  const std::string name(10000, 'k');
  ApiRequest wide = parse_chat_request(
      head + R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object",)" +
          R"("properties":{")" + name + R"(":{"type":"integer"}},"additionalProperties":{"type":"boolean"}}}}})",
      m);
  ASSERT_NE(wide.gen.grammar, nullptr);
  GrammarMatcher wm(wide.gen.grammar);
  EXPECT_TRUE(wm.advance(R"({"kk":true})") && wm.finished());
  GrammarMatcher wn(wide.gen.grammar);
  EXPECT_FALSE(wn.advance("{\"" + name + "\":true"));  // the declared name takes an integer
}

}  // namespace
}  // namespace baton

namespace baton {
namespace {

std::vector<ToolSpec> weather_tools() {
  return {{"get_weather", "", ojson::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "days": {"type": "integer"}}, "required": ["city"]})")},
          {"now", "", ojson()}};
}

bool full_match(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.advance(text) && m.finished();
}

TEST(ToolCallGrammar, EachFormatWritesOneCallOfAGivenTool) {
  const std::string d = "\xEF\xBD\x9C" "DSML" "\xEF\xBD\x9C";
  struct Case {
    ToolCallFormat format;
    std::vector<std::string> good, bad;
  };
  const Case cases[] = {
      {ToolCallFormat::hermes,
       {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>",
        "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>"},
       {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>", "Sure! <tool_call>"}},
      {ToolCallFormat::llama3_json,
       {R"({"name": "get_weather", "parameters": {"city": "Oslo"}})"},
       {R"({"name": "get_weather", "arguments": {"city": "Oslo"}})"}},
      {ToolCallFormat::mistral,
       {R"([TOOL_CALLS][{"name": "now", "arguments": {"x": [1]}}])"},
       {R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": 1}}])"}},
      {ToolCallFormat::deepseek_dsml,
       {"<" + d + "tool_calls>\n<" + d + "invoke name=\"get_weather\">\n<" + d +
            "parameter name=\"city\" string=\"true\">New York</" + d + "parameter>\n<" + d +
            "parameter name=\"days\" string=\"false\">3</" + d + "parameter>\n</" + d + "invoke>\n</" + d + "tool_calls>",
        "<" + d + "tool_calls>\n<" + d + "invoke name=\"now\">\n</" + d + "invoke>\n</" + d + "tool_calls>"},
       {"<" + d + "tool_calls>\n<" + d + "invoke name=\"get_weather\">\n</" + d + "invoke>\n</" + d + "tool_calls>",
        "<" + d + "tool_calls>\n<" + d + "invoke name=\"get_weather\">\n<" + d +
            "parameter name=\"city\" string=\"true\">a<b</" + d + "parameter>\n</" + d + "invoke>\n</" + d + "tool_calls>"}},
  };
  for (const Case& c : cases) {
    auto g = tool_call_grammar(c.format, weather_tools());
    for (const auto& s : c.good) EXPECT_TRUE(full_match(g, s)) << s;
    for (const auto& s : c.bad) EXPECT_FALSE(full_match(g, s)) << s;
  }
  // DSML writes each parameter alone; its $ref still resolves in the tool's schema.
  auto refs = tool_call_grammar(ToolCallFormat::deepseek_dsml,
                                {{"f", "", ojson::parse(R"({"$defs": {"n": {"type": "integer"}},
                                                           "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]})")}});
  EXPECT_TRUE(full_match(refs, "<" + d + "tool_calls>\n<" + d + "invoke name=\"f\">\n<" + d +
                                   "parameter name=\"a\" string=\"false\">12</" + d + "parameter>\n</" + d + "invoke>\n</" + d +
                                   "tool_calls>"));
  // An open reasoning block stays free up to its first end marker.
  auto thinking = tool_call_grammar(ToolCallFormat::hermes, weather_tools(), "</think>");
  const std::string call = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(full_match(thinking, "Hmm, </thin k> <</think</think>\n\n" + call));
  EXPECT_TRUE(full_match(thinking, "</think>" + call));
  EXPECT_FALSE(full_match(thinking, "a</think>b" + call));
  EXPECT_FALSE(full_match(thinking, call));
  // A named function: the grammar of that tool alone.
  auto named = tool_call_grammar(ToolCallFormat::hermes, {weather_tools()[1]});
  EXPECT_FALSE(full_match(named, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\"}}\n</tool_call>"));
  EXPECT_THROW(tool_call_grammar(ToolCallFormat::none, weather_tools()), std::invalid_argument);
  EXPECT_THROW(tool_call_grammar(ToolCallFormat::hermes, {{"f", "", ojson::parse(R"({"properties": {"a": {"pattern": "x"}}})")}}),
               SchemaError);
}

// Qwen3-Coder's and GLM's XML calls: a string parameter is bare text (any
// text up to the closing tag; without '<' when it has lengths; one of the
// values of an enum), others JSON; and what the grammar lets through, the
// parser reads back as the same call.
TEST(ToolCallGrammar, XmlFormatsWriteCallsTheParserReadsBack) {
  std::vector<ToolSpec> tools = weather_tools();
  tools.push_back({"edit", "", ojson::parse(R"({"type": "object", "properties": {"path": {"type": "string"},
      "mode": {"type": "string", "enum": ["a", "b c"]}, "flags": {"type": "array", "items": {"type": "boolean"}},
      "note": {"type": ["string", "null"]}}, "required": ["path", "mode"]})")});
  struct Case {
    ToolCallFormat format;
    std::vector<std::pair<std::string, ojson>> good;  // text, the call it parses to
    std::vector<std::string> bad;
  };
  const Case cases[] = {
      {ToolCallFormat::qwen3_coder,
       {{"<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
         "</parameter>\n</function>\n</tool_call>",
         {{"name", "get_weather"}, {"arguments", {{"city", "New York"}, {"days", 3}}}}},
        {"<tool_call>\n<function=now>\n</function>\n</tool_call>", {{"name", "now"}, {"arguments", ojson::object()}}},
        {"<tool_call>\n<function=edit>\n<parameter=path>\nif (a < b) {\n  <b>x</b>;\n}\n\n</parameter>\n"
         "<parameter=mode>\nb c\n</parameter>\n<parameter=flags>\n[true, false]\n</parameter>\n"
         "<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>",
         {{"name", "edit"},
          {"arguments", {{"path", "if (a < b) {\n  <b>x</b>;\n}\n"}, {"mode", "b c"}, {"flags", {true, false}},
                         {"note", nullptr}}}}}},
       {"<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\na<b\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\nsoon\n"
        "</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=edit>\n<parameter=path>\nx\n</parameter>\n<parameter=mode>\nc\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>\n<function=other>\n</function>\n</tool_call>", "Sure! <tool_call>"}},
      {ToolCallFormat::glm,
       {{"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n"
         "<arg_value>2</arg_value>\n</tool_call>",
         {{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}, {"days", 2}}}}},
        {"<tool_call>now\n</tool_call>", {{"name", "now"}, {"arguments", ojson::object()}}},
        {"<tool_call>edit\n<arg_key>path</arg_key>\n<arg_value> a </arg_key>\n</arg_value>\n<arg_key>mode</arg_key>\n"
         "<arg_value>a</arg_value>\n</tool_call>",
         {{"name", "edit"}, {"arguments", {{"path", " a </arg_key>\n"}, {"mode", "a"}}}}}},
       {"<tool_call>get_weather\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>2.5</arg_value>\n</tool_call>"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(tool_call_format_name(c.format));
    auto g = tool_call_grammar(c.format, tools);
    ChatTools request{tools, {ToolChoice::Mode::required, ""}, true};
    ChatOutputFormat base;
    base.tools = c.format;
    const ChatOutputFormat f = request_output_format(base, "", request);
    for (const auto& [text, call] : c.good) {
      EXPECT_TRUE(full_match(g, text)) << text;
      ChatOutputParser p(f);
      p.push(text);
      p.finish();
      ASSERT_EQ(p.output().tool_calls.size(), 1u) << text;
      EXPECT_EQ(p.output().content, "");
      EXPECT_EQ(p.output().tool_calls[0].name, call["name"]);
      EXPECT_EQ(ojson::parse(p.output().tool_calls[0].arguments), call["arguments"]);
    }
    for (const auto& s : c.bad) EXPECT_FALSE(full_match(g, s)) << s;
  }
}

// The random model forced to call a tool in the XML formats: every seed
// writes a call that the parser reads back with arguments that validate.
TEST(ToolCallGrammar, RandomModelWritesValidXmlCalls) {
  LocalEngineConfig c;
  c.model_path = test::model_path("llama-2-tiny-random.gguf");
  c.stage.n_ctx = 512;
  c.stage.n_seq = 4;
  LocalEngine engine(c, nullptr);
  engine.wait_loaded();
  const std::vector<ToolSpec> tools = {
      weather_tools()[0],
      {"set", "", ojson::parse(R"({"type": "object", "properties": {"mode": {"enum": ["on", "off"], "type": "string"},
          "level": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
          "maxItems": 2}}, "required": ["mode"]})")}};
  const auto prompt = engine.model().tokenizer->encode("Call a tool:", true, false);
  for (const ToolCallFormat format : {ToolCallFormat::qwen3_coder, ToolCallFormat::glm}) {
    SCOPED_TRACE(tool_call_format_name(format));
    constexpr int kSeeds = 12;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Outcome> out(kSeeds);
    int finished = 0;
    for (int seed = 0; seed < kSeeds; ++seed) {
      GenerationRequest r;
      r.prompt = prompt;
      r.sampling = {1.0f, 40, 1.0f, 0.0f, uint64_t(seed)};
      r.max_tokens = 400;
      r.grammar = tool_call_grammar(format, tools);
      engine.submit(std::move(r), [&, seed](GenerationEvent&& ev) {
        std::lock_guard lock(mu);
        out[size_t(seed)].text += ev.text;
        if (ev.finish) {
          out[size_t(seed)].finish = *ev.finish;
          ++finished;
          cv.notify_all();
        }
      });
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return finished == kSeeds; });
    ChatOutputFormat base;
    base.tools = format;
    const ChatOutputFormat f = request_output_format(base, "", ChatTools{tools, {ToolChoice::Mode::required, ""}, true});
    for (const Outcome& o : out) {
      SCOPED_TRACE(o.text);
      ASSERT_EQ(o.finish, FinishReason::stop);
      ChatOutputParser p(f);
      p.push(o.text);
      p.finish();
      ASSERT_EQ(p.output().tool_calls.size(), 1u);
      EXPECT_EQ(p.output().content, "");
      const ToolCall& call = p.output().tool_calls[0];
      ASSERT_TRUE(call.name == "get_weather" || call.name == "set");
      const ojson args = ojson::parse(call.arguments, nullptr, false);
      ASSERT_FALSE(args.is_discarded()) << call.arguments;
      const ojson& params = tools[call.name == "get_weather" ? 0 : 1].parameters;
      EXPECT_EQ(test::schema_violation(args, params, params), "");
    }
  }
}

// The random model, forced to call a tool: every seed writes a call whose
// arguments validate against the tool's schema.
TEST(ToolCallGrammar, RandomModelWritesValidCalls) {
  LocalEngineConfig c;
  c.model_path = test::model_path("llama-2-tiny-random.gguf");
  c.stage.n_ctx = 512;
  c.stage.n_seq = 4;
  LocalEngine engine(c, nullptr);
  engine.wait_loaded();
  const std::vector<ToolSpec> tools = {
      weather_tools()[0], {"now", "", ojson::parse(R"({"properties": {"tz": {"type": "string", "maxLength": 4}}})")}};
  auto grammar = tool_call_grammar(ToolCallFormat::hermes, tools);
  const auto prompt = engine.model().tokenizer->encode("Call a tool:", true, false);
  constexpr int kSeeds = 20;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Outcome> out(kSeeds);
  int finished = 0;
  for (int seed = 0; seed < kSeeds; ++seed) {
    GenerationRequest r;
    r.prompt = prompt;
    r.sampling = {1.0f, 40, 1.0f, 0.0f, uint64_t(seed)};
    r.max_tokens = 400;
    r.grammar = grammar;
    engine.submit(std::move(r), [&, seed](GenerationEvent&& ev) {
      std::lock_guard lock(mu);
      out[size_t(seed)].text += ev.text;
      if (ev.finish) {
        out[size_t(seed)].finish = *ev.finish;
        ++finished;
        cv.notify_all();
      }
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return finished == kSeeds; });
  const std::string open = "<tool_call>\n", close = "\n</tool_call>";
  for (const Outcome& o : out) {
    SCOPED_TRACE(o.text);
    ASSERT_EQ(o.finish, FinishReason::stop);
    ASSERT_EQ(o.text.rfind(open, 0), 0u);
    ASSERT_GE(o.text.size(), open.size() + close.size());
    ASSERT_EQ(o.text.substr(o.text.size() - close.size()), close);
    const ojson call = ojson::parse(o.text.substr(open.size(), o.text.size() - open.size() - close.size()), nullptr, false);
    ASSERT_FALSE(call.is_discarded());
    const std::string name = call["name"].get<std::string>();
    ASSERT_TRUE(name == "get_weather" || name == "now");
    const ojson& params = tools[name == "get_weather" ? 0 : 1].parameters;
    EXPECT_EQ(test::schema_violation(call["arguments"], params, params), "");
  }
}

}  // namespace
}  // namespace baton

#include <fstream>
#include <sstream>

#include "chat/jinja/template.h"

namespace baton {
namespace {

// tool_choice "required" or a named function forces one call in the model's
// syntax (Qwen 2.5's template: Hermes); "auto" leaves the model free.
TEST(ToolCallGrammar, ToolChoiceForcesACallThroughTheRequest) {
  const ModelInfo m = model_for_parsing();
  std::ifstream in(test::shared_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const JinjaTemplate qwen = JinjaTemplate::parse(ss.str());
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}])";
  auto body = [&](const std::string& choice, const std::string& extra = "") {
    return R"({"model":"m","messages":[{"role":"user","content":"Weather?"}],"tools":)" + tools +
           R"(,"tool_choice":)" + choice + extra + "}";
  };
  const std::string weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  const std::string now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  auto completes = [](const ApiRequest& r, const std::string& text) {
    GrammarMatcher g(r.gen.grammar);
    return g.advance(text) && g.finished();
  };
  const ApiRequest required = parse_chat_request(body(R"("required")"), m, &qwen);
  ASSERT_NE(required.gen.grammar, nullptr);
  EXPECT_TRUE(completes(required, weather));
  EXPECT_TRUE(completes(required, now));
  EXPECT_FALSE(completes(required, "It is sunny."));
  const ApiRequest named =
      parse_chat_request(body(R"({"type": "function", "function": {"name": "now"}})"), m, &qwen);
  ASSERT_NE(named.gen.grammar, nullptr);
  EXPECT_TRUE(completes(named, now));
  EXPECT_FALSE(completes(named, weather));
  EXPECT_EQ(parse_chat_request(body(R"("auto")"), m, &qwen).gen.grammar, nullptr);
  // parallel_tool_calls false: the grammar takes one call and then only the
  // end; the output side keeps one call (single_tool_call), with or without
  // a grammar. The default (true) leaves the output side free.
  const ApiRequest one = parse_chat_request(body(R"("required")", R"(,"parallel_tool_calls":false)"), m, &qwen);
  ASSERT_NE(one.gen.grammar, nullptr);
  EXPECT_TRUE(one.output.single_tool_call);
  EXPECT_TRUE(completes(one, weather));
  GrammarMatcher second(one.gen.grammar);
  EXPECT_FALSE(second.advance(weather + "\n" + now));
  EXPECT_TRUE(parse_chat_request(body(R"("auto")", R"(,"parallel_tool_calls":false)"), m, &qwen).output.single_tool_call);
  EXPECT_FALSE(required.output.single_tool_call);
  try {
    parse_chat_request(body(R"("required")", R"(,"response_format":{"type":"json_object"})"), m, &qwen);
    ADD_FAILURE() << "a forced call and a response_format together were accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
  }
}

}  // namespace
}  // namespace baton
