#include "chat/tool_call_grammar.h"

#include <algorithm>
#include <stdexcept>

#include "chat/output/arguments.h"
#include "engine/sampling/json_schema.h"

namespace baton {

using ojson = nlohmann::ordered_json;
using Item = Grammar::Item;

namespace {

// The DSML markup of DeepSeek V3.2 / V4 templates ("｜" is U+FF5C).
constexpr std::string_view kDsml = "\xEF\xBD\x9C" "DSML" "\xEF\xBD\x9C";

std::vector<Item> concat(std::vector<Item> a, const std::vector<Item>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A property that DSML writes as raw text (string="true"): a plain string
// schema. Everything else is written as JSON (string="false").
bool dsml_raw_string(const ojson& s) {
  if (!s.is_object() || s.value("type", ojson()) != "string") return false;
  for (const auto& [k, v] : s.items()) {
    if (k != "type" && k != "description" && k != "title" && k != "minLength" && k != "maxLength") return false;
  }
  return true;
}

Grammar::RuleId text_until(Grammar& g, std::string_view marker);

// How the XML formats (Qwen3-Coder, GLM) write one call: the markup around
// the name, each parameter and each value.
struct XmlSyntax {
  std::string open, name_close, key_open, key_close, value_close, call_close;
};
const XmlSyntax kQwenXml = {"<tool_call>\n<function=", ">\n", "<parameter=", ">\n", "\n</parameter>\n",
                            "</function>\n</tool_call>"};
const XmlSyntax kGlmXml = {"<tool_call>", "\n", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n",
                           "</tool_call>"};

class Builder {
 public:
  Builder(Grammar& g) : g_(g), json_(g) {}

  Grammar::RuleId rule(const std::vector<std::vector<Item>>& alts) {
    const auto r = g_.add_rule();
    for (const auto& a : alts) g_.add_alternative(r, a);
    return r;
  }

  // The arguments object of one tool, as JSON.
  Grammar::RuleId arguments(const ToolSpec& t) {
    if (t.parameters.is_null() || (t.parameters.is_object() && t.parameters.empty())) return json_.any_object();
    return json_.compile(t.parameters);
  }

  // The parameters of a tool's call in its schema's order, each written by
  // param(name, schema); an optional one may be left out.
  template <class Param>
  std::vector<Item> parameters(const ToolSpec& t, Param param) {
    if (!t.parameters.is_null() && !t.parameters.is_object()) throw SchemaError("parameters must be an object schema");
    std::vector<std::string> required;
    if (t.parameters.is_object() && t.parameters.contains("required")) {
      for (const auto& r : t.parameters["required"]) required.push_back(r.get<std::string>());
    }
    std::vector<Item> out;
    if (!t.parameters.is_object() || !t.parameters.contains("properties")) return out;
    for (const auto& [k, sub] : t.parameters["properties"].items()) {
      const std::vector<Item> p = param(k, sub);
      const bool req = std::find(required.begin(), required.end(), k) != required.end();
      out.push_back(Item::ref(req ? rule({p}) : rule({{}, p})));
    }
    return out;
  }

  // {"name": "NAME", "<args_key>": ARGS}, one alternative per tool.
  Grammar::RuleId json_call(const std::vector<ToolSpec>& tools, const std::string& args_key) {
    std::vector<std::vector<Item>> alts;
    const Item ws = Item::ref(json_.ws());
    for (const ToolSpec& t : tools) {
      std::vector<Item> a = {Item::byte('{'), ws};
      a = concat(a, Grammar::literal("\"name\":"));
      a.push_back(ws);
      a = concat(a, Grammar::literal(ojson(t.name).dump() + ","));
      a.push_back(ws);
      a = concat(a, Grammar::literal(ojson(args_key).dump() + ":"));
      a.push_back(ws);
      a.push_back(Item::ref(arguments(t)));
      a.push_back(ws);
      a.push_back(Item::byte('}'));
      alts.push_back(std::move(a));
    }
    return rule(alts);
  }

  // <｜DSML｜invoke name="NAME">\n PARAMETERS </｜DSML｜invoke>\n, one
  // alternative per tool; parameters in the schema's order, optional ones
  // may be left out.
  Grammar::RuleId dsml_invoke(const std::vector<ToolSpec>& tools) {
    const std::string d(kDsml);
    std::vector<std::vector<Item>> alts;
    for (const ToolSpec& t : tools) {
      std::vector<Item> a = Grammar::literal("<" + d + "invoke name=\"" + t.name + "\">\n");
      a = concat(a, parameters(t, [&](const std::string& k, const ojson& sub) {
                   const bool raw = dsml_raw_string(sub);
                   std::vector<Item> p = Grammar::literal("<" + d + "parameter name=\"" + k + "\" string=\"" +
                                                          (raw ? "true" : "false") + "\">");
                   p.push_back(Item::ref(raw ? raw_text(sub) : json_.compile(sub, &t.parameters)));
                   return concat(p, Grammar::literal("</" + d + "parameter>\n"));
                 }));
      a = concat(a, Grammar::literal("</" + d + "invoke>\n"));
      alts.push_back(std::move(a));
    }
    return rule(alts);
  }

  // One XML call of one of the tools: its parameters in the schema's order,
  // optional ones may be left out. A parameter whose schema allows strings
  // is written as bare text (chat/output/arguments.h reads it back: a
  // string, or a value of another type it allows); any text up to the
  // closing tag, or with lengths or a string enum, text without '<' / one
  // of the values. Other parameters are JSON.
  Grammar::RuleId xml_call(const std::vector<ToolSpec>& tools, const XmlSyntax& x) {
    const std::string_view close = trim_newlines(x.value_close);
    std::vector<std::vector<Item>> alts;
    for (const ToolSpec& t : tools) {
      std::vector<Item> a = Grammar::literal(x.open + t.name + x.name_close);
      a = concat(a, parameters(t, [&](const std::string& k, const ojson& sub) {
                   std::vector<Item> p = Grammar::literal(x.key_open + k + x.key_close);
                   if (!(schema_argument_types(sub) & kArgString)) {
                     p.push_back(Item::ref(json_.compile(sub, &t.parameters)));
                     return concat(p, Grammar::literal(x.value_close));
                   }
                   if (const auto e = string_enum(sub); !e.empty()) {
                     std::vector<std::vector<Item>> values;
                     for (const std::string& v : e) values.push_back(Grammar::literal(v));
                     p.push_back(Item::ref(rule(values)));
                     return concat(p, Grammar::literal(x.value_close));
                   }
                   if (dsml_raw_string(sub) && (sub.contains("minLength") || sub.contains("maxLength"))) {
                     p.push_back(Item::ref(raw_text(sub)));
                     return concat(p, Grammar::literal(x.value_close));
                   }
                   // Up to the first closing tag (a newline before it is the template's).
                   p.push_back(Item::ref(text_until(g_, close)));
                   return concat(p, Grammar::literal(x.value_close.substr(x.value_close.find(close) + close.size())));
                 }));
      a = concat(a, Grammar::literal(x.call_close));
      alts.push_back(std::move(a));
    }
    return rule(alts);
  }

  static std::string_view trim_newlines(std::string_view s) {
    while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
    while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
    return s;
  }

  // The values of {"type": "string", "enum": [...]} (all strings), else none.
  static std::vector<std::string> string_enum(const ojson& s) {
    std::vector<std::string> out;
    if (!s.is_object() || s.value("type", ojson()) != "string" || !s.contains("enum") || !s["enum"].is_array()) {
      return out;
    }
    for (const auto& v : s["enum"]) {
      if (!v.is_string()) return {};
      out.push_back(v.get<std::string>());
    }
    return out;
  }

  // A raw string parameter: characters other than '<' (which would start
  // the closing tag), counted as the schema's lengths ask.
  Grammar::RuleId raw_text(const ojson& s) {
    ByteSet ascii = ByteSet::range(0x09, 0x0A);
    ascii.add(0x20, 0x7F).remove('<');
    const auto ch = rule(Grammar::utf8_char(ascii));
    const int64_t min = s.value("minLength", int64_t(0));
    const int64_t max = s.value("maxLength", int64_t(-1));
    if (min < 0 || min > 4096 || max > 4096) throw SchemaError("string lengths above 4096 are not supported");
    auto tail = rule({{}});
    if (max < 0) {
      tail = g_.add_rule();
      g_.add_alternative(tail, {});
      g_.add_alternative(tail, {Item::ref(ch), Item::ref(tail)});
    } else {
      for (int64_t i = min; i < max; ++i) tail = rule({{}, {Item::ref(ch), Item::ref(tail)}});
    }
    std::vector<Item> seq(size_t(min), Item::ref(ch));
    seq.push_back(Item::ref(tail));
    return rule({seq});
  }

 private:
  Grammar& g_;
  JsonSchemaCompiler json_;
};

// Any bytes up to and including the first occurrence of `marker`: the
// marker's matching automaton (Knuth-Morris-Pratt), one rule per matched
// prefix length, each byte going to the length it leaves matched.
Grammar::RuleId text_until(Grammar& g, std::string_view marker) {
  const size_t n = marker.size();
  std::vector<size_t> pi(n, 0);  // longest proper border of marker[0..k]
  for (size_t k = 1; k < n; ++k) {
    size_t j = pi[k - 1];
    while (j > 0 && marker[k] != marker[j]) j = pi[j - 1];
    pi[k] = j + (marker[k] == marker[j] ? 1 : 0);
  }
  auto delta = [&](size_t k, uint8_t b) {
    for (;;) {
      if (uint8_t(marker[k]) == b) return k + 1;
      if (k == 0) return size_t(0);
      k = pi[k - 1];
    }
  };
  std::vector<Grammar::RuleId> state(n);
  for (size_t k = 0; k < n; ++k) state[k] = g.add_rule();
  for (size_t k = 0; k < n; ++k) {
    std::vector<ByteSet> to(n + 1);
    std::vector<bool> used(n + 1, false);
    for (int b = 0; b < 256; ++b) {
      const size_t t = delta(k, uint8_t(b));
      to[t].add(uint8_t(b), uint8_t(b));
      used[t] = true;
    }
    for (size_t t = 0; t <= n; ++t) {
      if (!used[t]) continue;
      if (t == n) g.add_alternative(state[k], {Item::set(to[t])});
      else g.add_alternative(state[k], {Item::set(to[t]), Item::ref(state[t])});
    }
  }
  return state[0];
}

}  // namespace

std::shared_ptr<const Grammar> tool_call_grammar(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                                 std::string_view reasoning_end) {
  if (tools.empty()) throw std::invalid_argument("a forced tool call needs at least one tool");
  auto g = std::make_shared<Grammar>();
  Builder b(*g);
  Grammar::RuleId root = 0;
  switch (format) {
    case ToolCallFormat::hermes:
      root = b.rule({concat(concat(Grammar::literal("<tool_call>\n"), {Item::ref(b.json_call(tools, "arguments"))}),
                            Grammar::literal("\n</tool_call>"))});
      break;
    case ToolCallFormat::llama3_json: root = b.json_call(tools, "parameters"); break;
    case ToolCallFormat::mistral:
      root = b.rule({concat(concat(Grammar::literal("[TOOL_CALLS]["), {Item::ref(b.json_call(tools, "arguments"))}),
                            Grammar::literal("]"))});
      break;
    case ToolCallFormat::deepseek_dsml: {
      const std::string d(kDsml);
      root = b.rule({concat(concat(Grammar::literal("<" + d + "tool_calls>\n"), {Item::ref(b.dsml_invoke(tools))}),
                            Grammar::literal("</" + d + "tool_calls>"))});
      break;
    }
    case ToolCallFormat::qwen3_coder: root = b.xml_call(tools, kQwenXml); break;
    case ToolCallFormat::glm: root = b.xml_call(tools, kGlmXml); break;
    case ToolCallFormat::none: throw std::invalid_argument("this model has no tool-call format to force");
  }
  if (!reasoning_end.empty()) {
    const auto sep = b.rule({{}, {Item::byte('\n')}, {Item::byte('\n'), Item::byte('\n')}});
    root = b.rule({{Item::ref(text_until(*g, reasoning_end)), Item::ref(sep), Item::ref(root)}});
  }
  return finish_schema_grammar(std::move(g), root);
}

std::shared_ptr<const Grammar> forced_tool_call_grammar(const ChatTools& tools, const ChatOutputFormat& output) {
  const ToolChoice& choice = tools.choice;
  if (choice.mode != ToolChoice::Mode::required && choice.mode != ToolChoice::Mode::named) return nullptr;
  if (output.tools == ToolCallFormat::none || tools.tools.empty()) return nullptr;
  std::vector<ToolSpec> allowed;
  for (const ToolSpec& t : tools.tools) {
    if (choice.mode == ToolChoice::Mode::required || t.name == choice.name) allowed.push_back(t);
  }
  return tool_call_grammar(output.tools, allowed,
                           output.reasoning_open ? std::string_view(output.reasoning_end) : std::string_view());
}

}  // namespace baton
