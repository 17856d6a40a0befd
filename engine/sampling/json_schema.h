// JSON Schema -> byte grammar (engine/sampling/grammar.h), for structured output:
// the text a grammar accepts is JSON that validates against the schema.
// docs/GRAMMAR.md lists what is supported; anything else is refused with a
// SchemaError naming the keyword and where it is, never silently ignored
// (annotations such as title, description and format aside).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "engine/sampling/grammar.h"

namespace baton {

// The message names the keyword and its place: "'pattern' is not supported
// (at #/properties/code)".
struct SchemaError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Schemas nested inside schemas, $ref hops included, deeper than this are
// refused (SchemaError).
inline constexpr int kMaxSchemaDepth = 64;

// Adds to a Grammar the rules of values of JSON schemas. Several schemas may
// go into one grammar (a tool call: one schema per function), each given its
// own root document for $ref.
class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(Grammar& g) : g_(g) {}

  // The rule of the values `schema` (a whole document: $ref resolves inside
  // it) accepts. Throws SchemaError. Ordered: properties are written in the
  // order the schema gives them.
  // `document`, when given, is the document `schema` sits in ($ref
  // resolves there), e.g. a tool's parameters for one of its properties.
  Grammar::RuleId compile(const nlohmann::ordered_json& schema, const nlohmann::ordered_json* document = nullptr);

  // Building blocks, each made once per grammar.
  Grammar::RuleId ws();            // nothing, a space, or a newline and up to 16 spaces or tabs
  Grammar::RuleId any_value();     // any JSON value
  Grammar::RuleId any_object();    // any JSON object
  Grammar::RuleId string_value();  // any JSON string

 private:
  using RuleId = Grammar::RuleId;
  RuleId value(const nlohmann::ordered_json& s, const std::string& at);
  RuleId typed(const nlohmann::ordered_json& s, const std::string& type, const std::string& at);
  RuleId object(const nlohmann::ordered_json& s, const std::string& at);
  RuleId array(const nlohmann::ordered_json& s, const std::string& at);
  RuleId string(const nlohmann::ordered_json& s, const std::string& at);
  RuleId number(bool integer, bool non_negative);
  RuleId literal(const std::string& text);
  RuleId ref(const std::string& target, const std::string& at);
  RuleId key_not_in(const std::vector<std::string>& names, const std::string& at);
  RuleId repeat(RuleId unit, int64_t min, int64_t max);  // max < 0: unbounded
  RuleId digits(int max);  // 0..max digits
  RuleId char_rule();
  RuleId any_array();
  RuleId rule_of(std::vector<std::vector<Grammar::Item>> alternatives);

  Grammar& g_;
  const nlohmann::ordered_json* doc_ = nullptr;
  std::map<std::string, RuleId> refs_;  // per document
  std::map<std::string, RuleId> shared_;
  int depth_ = 0;  // schemas being compiled, one inside the other
};

// Sets g's root and checks the grammar; a rule that can recurse without
// reading input (a '$ref' cycle) is a SchemaError. Returns g.
std::shared_ptr<const Grammar> finish_schema_grammar(std::shared_ptr<Grammar> g, Grammar::RuleId root);

// Any JSON object (response_format {"type": "json_object"}).
std::shared_ptr<const Grammar> json_object_grammar();
// Values of `schema` (response_format json_schema). Throws SchemaError.
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);

}  // namespace baton
