#include "chat/output/arguments.h"

#include "chat/output/parser_impl.h"

namespace baton {

namespace {

uint8_t type_bit(std::string_view name) {
  if (name == "string") return kArgString;
  if (name == "integer") return kArgInteger;
  if (name == "number") return kArgNumber;
  if (name == "boolean") return kArgBoolean;
  if (name == "object") return kArgObject;
  if (name == "array") return kArgArray;
  if (name == "null") return kArgNull;
  return 0;
}

template <class Json>
uint8_t value_bit(const Json& v) {
  if (v.is_string()) return kArgString;
  if (v.is_number_integer()) return kArgInteger;
  if (v.is_number()) return kArgNumber;
  if (v.is_boolean()) return kArgBoolean;
  if (v.is_object()) return kArgObject;
  if (v.is_array()) return kArgArray;
  return kArgNull;
}

}  // namespace

uint8_t schema_argument_types(const nlohmann::ordered_json& s) {
  if (!s.is_object()) return 0;
  if (auto t = s.find("type"); t != s.end()) {
    uint8_t bits = 0;
    if (t->is_string()) bits = type_bit(t->get<std::string>());
    if (t->is_array()) {
      for (const auto& n : *t) {
        if (!n.is_string()) return 0;
        const uint8_t b = type_bit(n.get<std::string>());
        if (b == 0) return 0;
        bits |= b;
      }
    }
    return bits;
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = s.find(key);
    if (it == s.end() || !it->is_array() || it->empty()) continue;
    uint8_t bits = 0;
    for (const auto& branch : *it) {
      const uint8_t b = schema_argument_types(branch);
      if (b == 0) return 0;  // one branch takes anything: so does the union
      bits |= b;
    }
    return bits;
  }
  if (auto c = s.find("const"); c != s.end()) return value_bit(*c);
  if (auto e = s.find("enum"); e != s.end() && e->is_array() && !e->empty()) {
    uint8_t bits = 0;
    for (const auto& v : *e) bits |= value_bit(v);
    return bits;
  }
  if (s.contains("properties")) return kArgObject;
  return 0;
}

std::string typed_argument(std::string_view text, uint8_t types) {
  using chat_text::json_quote;
  if (types == kArgString) return json_quote(text);
  const std::string_view v = chat_text::trim_ws(text);
  // Python's spellings, which Qwen3-Coder's template writes (`value | string`).
  if ((types == 0 || (types & kArgBoolean)) && (v == "True" || v == "False")) return v == "True" ? "true" : "false";
  if ((types == 0 || (types & kArgNull)) && v == "None") return "null";
  const auto j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) {
    if (types == 0) return std::string(v);
    uint8_t bit = value_bit(j);
    if (bit == kArgInteger && !(types & kArgInteger)) bit = kArgNumber;  // 3 is a number too
    if (bit == kArgNumber && (types & kArgInteger) && !(types & kArgNumber) && j.is_number_float()) {
      // 3.0 is an integer to JSON Schema; written as the integer it is
      const double d = j.get<double>();
      if (d == static_cast<double>(static_cast<int64_t>(d)) && d > -9.0e18 && d < 9.0e18) {
        return std::to_string(static_cast<int64_t>(d));
      }
    }
    if (bit != kArgString && (types & bit)) return std::string(v);
  }
  return json_quote(text);
}

}  // namespace baton
