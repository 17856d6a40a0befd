#include "engine/sampling/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace baton {

using json = nlohmann::ordered_json;
using Item = Grammar::Item;

namespace {

// Repetition counts expand into one rule per step; beyond this the grammar
// would be larger than the schema is worth.
constexpr int64_t kMaxCount = 4096;
constexpr size_t kMaxElements = size_t(1) << 20;
constexpr int kWsMax = 16;            // spaces or tabs after a newline
constexpr int kIntDigits = 16;        // digits of an integer part
constexpr int kFracDigits = 16;       // digits after the point
constexpr int kExpDigits = 2;         // keeps every number within a double's range

// Keywords that only annotate: they constrain nothing we generate.
const std::set<std::string> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs", "definitions",
    "deprecated", "readOnly", "writeOnly", "format", "strict", "name"};
// Keywords that constrain values and are not supported: refused by name.
const std::set<std::string> kRefused = {
    "pattern", "patternProperties", "propertyNames", "minProperties", "maxProperties", "uniqueItems", "contains",
    "minContains", "maxContains", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "dependencies", "unevaluatedProperties", "unevaluatedItems", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "prefixItems", "additionalItems", "contentEncoding", "contentMediaType",
    "$dynamicRef", "$anchor", "$recursiveRef"};

[[noreturn]] void refuse(const std::string& what, const std::string& at) {
  throw SchemaError(fmt::format("{} (at {})", what, at));
}

int64_t count_of(const json& s, const char* key, int64_t dflt, const std::string& at) {
  auto it = s.find(key);
  if (it == s.end()) return dflt;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) refuse(fmt::format("'{}' must be a non-negative integer", key), at);
  const int64_t v = it->get<int64_t>();
  if (v > kMaxCount) refuse(fmt::format("'{}' above {} is not supported", key, kMaxCount), at);
  return v;
}

std::string pointer_token(std::string_view t) {
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '~' && i + 1 < t.size() && (t[i + 1] == '0' || t[i + 1] == '1')) {
      out += t[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      out += t[i];
    }
  }
  return out;
}

}  // namespace

Grammar::RuleId JsonSchemaCompiler::rule_of(std::vector<std::vector<Item>> alternatives) {
  const RuleId r = g_.add_rule();
  for (const auto& a : alternatives) g_.add_alternative(r, a);
  if (g_.element_count() > kMaxElements) throw SchemaError("the schema's grammar is too large");
  return r;
}

Grammar::RuleId JsonSchemaCompiler::ws() {
  if (auto it = shared_.find("ws"); it != shared_.end()) return it->second;
  RuleId indent = rule_of({{}});
  for (int i = 0; i < kWsMax; ++i) {
    indent = rule_of({{}, {Item::set(ByteSet::of(' ').add('\t', '\t')), Item::ref(indent)}});
  }
  return shared_["ws"] = rule_of({{}, {Item::byte(' ')}, {Item::byte('\n'), Item::ref(indent)}});
}

// One character of a JSON string: a printable ASCII byte, a well-formed UTF-8
// sequence (no overlongs, surrogates or code points past U+10FFFF), or an
// escape; \u escapes of surrogates are left out so that a character is
// always one code point (minLength and maxLength count code points).
Grammar::RuleId JsonSchemaCompiler::char_rule() {
  if (auto it = shared_.find("char"); it != shared_.end()) return it->second;
  ByteSet ascii = ByteSet::range(0x20, 0x7F);
  ascii.remove('"').remove('\\');
  ByteSet hex = ByteSet::range('0', '9');
  hex.add('a', 'f').add('A', 'F');
  ByteSet not_d = ByteSet::range('0', '9');
  not_d.add('a', 'c').add('e', 'f').add('A', 'C').add('E', 'F');
  ByteSet d = ByteSet::of('d');
  d.add('D', 'D');
  ByteSet esc;
  for (char c : std::string_view("\"\\/bfnrt")) esc.add(uint8_t(c), uint8_t(c));
  std::vector<std::vector<Item>> alts = Grammar::utf8_char(ascii);
  alts.push_back({Item::byte('\\'), Item::set(esc)});
  alts.push_back({Item::byte('\\'), Item::byte('u'), Item::set(not_d), Item::set(hex), Item::set(hex), Item::set(hex)});
  alts.push_back(
      {Item::byte('\\'), Item::byte('u'), Item::set(d), Item::set(ByteSet::range('0', '7')), Item::set(hex), Item::set(hex)});
  return shared_["char"] = rule_of(std::move(alts));
}

Grammar::RuleId JsonSchemaCompiler::repeat(RuleId unit, int64_t min, int64_t max) {
  RuleId tail;
  if (max < 0) {
    tail = g_.add_rule();
    g_.add_alternative(tail, {});
    g_.add_alternative(tail, {Item::ref(unit), Item::ref(tail)});
  } else {
    tail = rule_of({{}});
    for (int64_t i = min; i < max; ++i) tail = rule_of({{}, {Item::ref(unit), Item::ref(tail)}});
  }
  std::vector<Item> seq(size_t(min), Item::ref(unit));
  seq.push_back(Item::ref(tail));
  return rule_of({seq});
}

Grammar::RuleId JsonSchemaCompiler::string_value() {
  if (auto it = shared_.find("string"); it != shared_.end()) return it->second;
  const RuleId body = repeat(char_rule(), 0, -1);
  return shared_["string"] = rule_of({{Item::byte('"'), Item::ref(body), Item::byte('"')}});
}

Grammar::RuleId JsonSchemaCompiler::digits(int max) {
  const std::string key = fmt::format("digits{}", max);
  if (auto it = shared_.find(key); it != shared_.end()) return it->second;
  const RuleId digit = rule_of({{Item::set(ByteSet::range('0', '9'))}});
  return shared_[key] = repeat(digit, 0, max);
}

// Numbers with bounded digit counts, so that a model cannot write digits
// forever: what is written is still any JSON number of that size.
Grammar::RuleId JsonSchemaCompiler::number(bool integer, bool non_negative) {
  const std::string key = fmt::format("number{}{}", integer, non_negative);
  if (auto it = shared_.find(key); it != shared_.end()) return it->second;
  const RuleId int_part =
      rule_of({{Item::byte('0')}, {Item::set(ByteSet::range('1', '9')), Item::ref(digits(kIntDigits - 1))}});
  const RuleId sign = non_negative ? rule_of({{}}) : rule_of({{}, {Item::byte('-')}});
  if (integer) return shared_[key] = rule_of({{Item::ref(sign), Item::ref(int_part)}});
  const Item digit = Item::set(ByteSet::range('0', '9'));
  const RuleId frac = rule_of({{}, {Item::byte('.'), digit, Item::ref(digits(kFracDigits - 1))}});
  ByteSet e = ByteSet::of('e');
  e.add('E', 'E');
  ByteSet pm = ByteSet::of('+');
  pm.add('-', '-');
  const RuleId exp_sign = rule_of({{}, {Item::set(pm)}});
  const RuleId exp = rule_of({{}, {Item::set(e), Item::ref(exp_sign), digit, Item::ref(digits(kExpDigits - 1))}});
  return shared_[key] = rule_of({{Item::ref(sign), Item::ref(int_part), Item::ref(frac), Item::ref(exp)}});
}

Grammar::RuleId JsonSchemaCompiler::literal(const std::string& text) { return rule_of({Grammar::literal(text)}); }

Grammar::RuleId JsonSchemaCompiler::any_value() {
  if (auto it = shared_.find("value"); it != shared_.end()) return it->second;
  // Made before its alternatives: objects and arrays hold values.
  const RuleId v = g_.add_rule();
  shared_["value"] = v;
  g_.add_alternative(v, {Item::ref(any_object())});
  g_.add_alternative(v, {Item::ref(any_array())});
  g_.add_alternative(v, {Item::ref(string_value())});
  g_.add_alternative(v, {Item::ref(number(false, false))});
  g_.add_alternative(v, Grammar::literal("true"));
  g_.add_alternative(v, Grammar::literal("false"));
  g_.add_alternative(v, Grammar::literal("null"));
  return v;
}

Grammar::RuleId JsonSchemaCompiler::any_object() {
  if (auto it = shared_.find("object"); it != shared_.end()) return it->second;
  const RuleId obj = g_.add_rule();
  shared_["object"] = obj;
  const RuleId member = rule_of({{Item::ref(string_value()), Item::byte(':'), Item::ref(ws()), Item::ref(any_value())}});
  const RuleId more = repeat(rule_of({{Item::byte(','), Item::ref(ws()), Item::ref(member)}}), 0, -1);
  g_.add_alternative(obj, {Item::byte('{'), Item::ref(ws()), Item::byte('}')});
  g_.add_alternative(obj, {Item::byte('{'), Item::ref(ws()), Item::ref(member), Item::ref(more), Item::ref(ws()),
                           Item::byte('}')});
  return obj;
}

Grammar::RuleId JsonSchemaCompiler::any_array() {
  if (auto it = shared_.find("array"); it != shared_.end()) return it->second;
  const RuleId arr = g_.add_rule();
  shared_["array"] = arr;
  const RuleId more = repeat(rule_of({{Item::byte(','), Item::ref(ws()), Item::ref(any_value())}}), 0, -1);
  g_.add_alternative(arr, {Item::byte('['), Item::ref(ws()), Item::byte(']')});
  g_.add_alternative(arr, {Item::byte('['), Item::ref(ws()), Item::ref(any_value()), Item::ref(more), Item::ref(ws()),
                           Item::byte(']')});
  return arr;
}

Grammar::RuleId JsonSchemaCompiler::compile(const json& schema, const json* document) {
  doc_ = document ? document : &schema;
  refs_.clear();
  depth_ = 0;
  const RuleId r = value(schema, "#");
  doc_ = nullptr;
  return r;
}

Grammar::RuleId JsonSchemaCompiler::ref(const std::string& target, const std::string& at) {
  if (auto it = refs_.find(target); it != refs_.end()) return it->second;
  const json* node = nullptr;
  if (target == "#") {
    node = doc_;
  } else if (target.rfind("#/", 0) == 0) {
    node = doc_;
    size_t pos = 2;
    while (node && pos <= target.size()) {
      const size_t slash = std::min(target.find('/', pos), target.size());
      const std::string key = pointer_token(std::string_view(target).substr(pos, slash - pos));
      if (!node->is_object() || !node->contains(key)) node = nullptr;
      else node = &(*node)[key];
      pos = slash + 1;
    }
  } else {
    refuse(fmt::format("'$ref' to '{}' is not supported (only '#' and '#/...' inside the schema)", target), at);
  }
  if (!node) refuse(fmt::format("'$ref' '{}' points nowhere", target), at);
  // Registered before it is compiled, so that a recursive schema refers to it.
  const RuleId r = g_.add_rule();
  refs_[target] = r;
  g_.add_alternative(r, {Item::ref(value(*node, target))});
  return r;
}

Grammar::RuleId JsonSchemaCompiler::value(const json& s, const std::string& at) {
  // Schemas inside schemas and $ref hops each go one level deeper; the bound
  // keeps the compiler's stack the same whatever the input (a $ref chain
  // fits in a request's size limit thousands deep).
  if (depth_ >= kMaxSchemaDepth) {
    refuse(fmt::format("the schema nests deeper than {} levels (schemas inside schemas and '$ref' hops)",
                       kMaxSchemaDepth),
           at.size() > 200 ? at.substr(0, 200) + "..." : at);
  }
  ++depth_;
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{depth_};
  if (s.is_boolean()) {
    if (!s.get<bool>()) refuse("the schema 'false' admits no value", at);
    return any_value();
  }
  if (!s.is_object()) refuse("a schema must be an object or a boolean", at);
  for (const auto& [k, v] : s.items()) {
    if (kRefused.count(k)) refuse(fmt::format("'{}' is not supported", k), at);
  }
  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) refuse("'$ref' must be a string", at);
    for (const auto& [k, v] : s.items()) {
      if (k != "$ref" && !kAnnotations.count(k)) refuse(fmt::format("'{}' beside '$ref' is not supported", k), at);
    }
    return ref(it->get<std::string>(), at);
  }
  if (auto it = s.find("const"); it != s.end()) return literal(it->dump());
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array() || it->empty()) refuse("'enum' must be a non-empty array", at);
    std::vector<std::vector<Item>> alts;
    for (const json& v : *it) alts.push_back(Grammar::literal(v.dump()));
    return rule_of(alts);
  }
  for (const char* comb : {"anyOf", "oneOf", "allOf"}) {
    auto it = s.find(comb);
    if (it == s.end()) continue;
    if (!it->is_array() || it->empty()) refuse(fmt::format("'{}' must be a non-empty array", comb), at);
    for (const auto& [k, v] : s.items()) {
      if (k != comb && !kAnnotations.count(k)) refuse(fmt::format("'{}' beside '{}' is not supported", k, comb), at);
    }
    if (std::string_view(comb) == "allOf" && it->size() != 1) refuse("'allOf' with more than one schema is not supported", at);
    std::vector<std::vector<Item>> alts;
    for (size_t i = 0; i < it->size(); ++i) {
      alts.push_back({Item::ref(value((*it)[i], fmt::format("{}/{}/{}", at, comb, i)))});
    }
    return rule_of(alts);
  }
  auto t = s.find("type");
  if (t == s.end()) {
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      return typed(s, "object", at);
    }
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed(s, "array", at);
    if (s.contains("minLength") || s.contains("maxLength")) return typed(s, "string", at);
    if (s.contains("minimum")) return typed(s, "number", at);
    return any_value();
  }
  if (t->is_string()) return typed(s, t->get<std::string>(), at);
  if (!t->is_array() || t->empty()) refuse("'type' must be a string or a non-empty array of strings", at);
  std::vector<std::vector<Item>> alts;
  for (const json& one : *t) {
    if (!one.is_string()) refuse("'type' must be a string or a non-empty array of strings", at);
    alts.push_back({Item::ref(typed(s, one.get<std::string>(), at))});
  }
  return rule_of(alts);
}

Grammar::RuleId JsonSchemaCompiler::typed(const json& s, const std::string& type, const std::string& at) {
  if (type == "object") return object(s, at);
  if (type == "array") return array(s, at);
  if (type == "string") return string(s, at);
  if (type == "boolean") return rule_of({Grammar::literal("true"), Grammar::literal("false")});
  if (type == "null") return literal("null");
  if (type == "number" || type == "integer") {
    bool non_negative = false;
    if (auto it = s.find("minimum"); it != s.end()) {
      // Only the common "minimum": 0 (no sign); other bounds need digit
      // arithmetic in the grammar.
      if (!it->is_number() || it->get<double>() != 0) refuse("'minimum' other than 0 is not supported", at);
      non_negative = true;
    }
    return number(type == "integer", non_negative);
  }
  refuse(fmt::format("unknown type '{}'", type), at);
}

Grammar::RuleId JsonSchemaCompiler::string(const json& s, const std::string& at) {
  const int64_t min = count_of(s, "minLength", 0, at);
  const int64_t max = s.contains("maxLength") ? count_of(s, "maxLength", 0, at) : -1;
  if (max >= 0 && max < min) refuse("'maxLength' is below 'minLength'", at);
  if (min == 0 && max < 0) return string_value();
  return rule_of({{Item::byte('"'), Item::ref(repeat(char_rule(), min, max)), Item::byte('"')}});
}

Grammar::RuleId JsonSchemaCompiler::array(const json& s, const std::string& at) {
  const int64_t min = count_of(s, "minItems", 0, at);
  const int64_t max = s.contains("maxItems") ? count_of(s, "maxItems", 0, at) : -1;
  if (max >= 0 && max < min) refuse("'maxItems' is below 'minItems'", at);
  RuleId item;
  if (auto it = s.find("items"); it != s.end()) {
    if (it->is_boolean() && !it->get<bool>()) {
      if (min > 0) refuse("'items': false with 'minItems' above 0 admits no value", at);
      return literal("[]");
    }
    item = value(*it, at + "/items");
  } else {
    item = any_value();
  }
  const RuleId r = g_.add_rule();
  if (min == 0) g_.add_alternative(r, {Item::byte('['), Item::ref(ws()), Item::byte(']')});
  if (max != 0) {
    const RuleId next = rule_of({{Item::byte(','), Item::ref(ws()), Item::ref(item)}});
    const RuleId rest = repeat(next, std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
    g_.add_alternative(r, {Item::byte('['), Item::ref(ws()), Item::ref(item), Item::ref(rest), Item::ref(ws()),
                           Item::byte(']')});
  }
  return r;
}

// A string key that is none of `names` (all printable ASCII without escapes):
// a trie of the names, where leaving it at any byte, or ending the key at a
// node that is not a name, is allowed. Keys have no escapes, so that a name
// cannot come back written another way.
Grammar::RuleId JsonSchemaCompiler::key_not_in(const std::vector<std::string>& names, const std::string& at) {
  ByteSet plain = ByteSet::range(0x20, 0x7E);
  plain.remove('"').remove('\\');
  for (const std::string& n : names) {
    for (char c : n) {
      if (!plain.has(uint8_t(c))) {
        refuse(fmt::format("property name '{}' with 'additionalProperties' needs plain ASCII names", n), at);
      }
    }
  }
  // Characters of a free key: printable ASCII or well-formed UTF-8, no escapes.
  const RuleId free_char = g_.add_rule();
  for (const auto& alt : Grammar::utf8_char(plain)) g_.add_alternative(free_char, alt);
  const RuleId free_rest = repeat(free_char, 0, -1);
  // After a byte that leaves the trie: any characters, then the quote.
  const RuleId tail = rule_of({{Item::ref(free_rest), Item::byte('"')}});
  // The trie of the names, built without recursion (a name's length must
  // not set the stack's depth). A child always comes after its parent, so
  // the rules are made from the last node back to the root.
  struct TrieNode {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // byte, node index
    bool is_name = false;
  };
  std::vector<TrieNode> trie(1);
  for (const std::string& n : names) {
    uint32_t at_node = 0;
    for (char ch : n) {
      const uint8_t b = uint8_t(ch);
      auto& kids = trie[at_node].children;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == b; });
      if (it != kids.end()) {
        at_node = it->second;
      } else {
        kids.emplace_back(b, uint32_t(trie.size()));
        at_node = uint32_t(trie.size());
        trie.emplace_back();
      }
    }
    trie[at_node].is_name = true;
  }
  std::vector<RuleId> rule_of_node(trie.size());
  for (size_t i = trie.size(); i-- > 0;) {
    std::vector<std::vector<Item>> alts;
    ByteSet other = plain;
    auto kids = trie[i].children;
    std::sort(kids.begin(), kids.end());
    for (const auto& [b, child] : kids) {
      alts.push_back({Item::byte(b), Item::ref(rule_of_node[child])});
      other.remove(b);
    }
    if (!trie[i].is_name) alts.push_back({Item::byte('"')});
    alts.push_back({Item::set(other), Item::ref(tail)});
    // Multi-byte characters: their first byte is never a name's (names are ASCII).
    for (size_t i = 1; i < g_.alternatives(free_char).size(); ++i) {
      std::vector<Item> alt;
      for (uint32_t pos = g_.alternatives(free_char)[i]; g_.element(pos).kind != Grammar::Kind::end; ++pos) {
        alt.push_back(Item::set(g_.byte_set(g_.element(pos).arg)));
      }
      alt.push_back(Item::ref(tail));
      alts.push_back(std::move(alt));
    }
    rule_of_node[i] = rule_of(alts);
  }
  return rule_of({{Item::byte('"'), Item::ref(rule_of_node[0])}});
}

// Declared properties come in the schema's order, required ones always,
// optional ones may be left out. after[i]: the rest from property i once
// something was written (a comma comes first); first[i]: the same when
// nothing was written yet.
Grammar::RuleId JsonSchemaCompiler::object(const json& s, const std::string& at) {
  const json* props = nullptr;
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) refuse("'properties' must be an object", at);
    props = &*it;
  }
  std::set<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) refuse("'required' must be an array of names", at);
    for (const json& n : *it) {
      if (!n.is_string()) refuse("'required' must be an array of names", at);
      if (!props || !props->contains(n.get<std::string>())) {
        refuse(fmt::format("required property '{}' is not in 'properties'", n.get<std::string>()), at);
      }
      required.insert(n.get<std::string>());
    }
  }
  const json* extra = nullptr;  // the schema of additional properties, when allowed
  static const json kAny = true;
  if (auto it = s.find("additionalProperties"); it != s.end()) {
    if (it->is_boolean()) {
      if (it->get<bool>()) extra = &kAny;
    } else {
      extra = &*it;
    }
  }
  if (!props || props->empty()) {
    if (!extra || (extra->is_boolean())) {
      if (!s.contains("additionalProperties") || extra) return any_object();
      return literal("{}");
    }
  }
  std::vector<std::string> names;
  std::vector<RuleId> kv;
  if (props) {
    for (const auto& [name, sub] : props->items()) {
      names.push_back(name);
      std::vector<Item> seq = Grammar::literal(json(name).dump());
      seq.push_back(Item::byte(':'));
      seq.push_back(Item::ref(ws()));
      seq.push_back(Item::ref(value(sub, at + "/properties/" + name)));
      kv.push_back(rule_of({seq}));
    }
  }
  RuleId first_end = rule_of({{}});
  RuleId after_end = first_end;
  if (extra) {
    std::vector<Item> seq = {Item::ref(key_not_in(names, at)), Item::byte(':'), Item::ref(ws()),
                             Item::ref(value(*extra, at + "/additionalProperties"))};
    const RuleId member = rule_of({seq});
    after_end = repeat(rule_of({{Item::byte(','), Item::ref(ws()), Item::ref(member)}}), 0, -1);
    first_end = rule_of({{}, {Item::ref(member), Item::ref(after_end)}});
  }
  RuleId first = first_end, after = after_end;
  for (size_t i = names.size(); i-- > 0;) {
    const bool req = required.count(names[i]) > 0;
    const RuleId a = g_.add_rule();
    g_.add_alternative(a, {Item::byte(','), Item::ref(ws()), Item::ref(kv[i]), Item::ref(after)});
    if (!req) g_.add_alternative(a, {Item::ref(after)});
    const RuleId f = g_.add_rule();
    g_.add_alternative(f, {Item::ref(kv[i]), Item::ref(after)});
    if (!req) g_.add_alternative(f, {Item::ref(first)});
    first = f;
    after = a;
  }
  return rule_of({{Item::byte('{'), Item::ref(ws()), Item::ref(first), Item::ref(ws()), Item::byte('}')}});
}

std::shared_ptr<const Grammar> json_object_grammar() {
  auto g = std::make_shared<Grammar>();
  JsonSchemaCompiler c(*g);
  g->set_root(c.any_object());
  g->check();
  return g;
}

std::shared_ptr<const Grammar> finish_schema_grammar(std::shared_ptr<Grammar> g, Grammar::RuleId root) {
  g->set_root(root);
  try {
    g->check();
  } catch (const std::invalid_argument&) {
    throw SchemaError("a '$ref' cycle that reads no input first (left recursion) is not supported");
  }
  return g;
}

std::shared_ptr<const Grammar> json_schema_grammar(const json& schema) {
  auto g = std::make_shared<Grammar>();
  JsonSchemaCompiler c(*g);
  const Grammar::RuleId root = c.compile(schema);
  return finish_schema_grammar(std::move(g), root);
}

}  // namespace baton
