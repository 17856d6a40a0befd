// A JSON Schema validator for the subset structured output supports, written
// from the specification for the tests (independent of the grammar compiler):
// returns "" when `v` is valid, else what is wrong.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace baton::test {

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline const nlohmann::ordered_json* resolve_ref(const nlohmann::ordered_json& root, const std::string& ref) {
  if (ref == "#") return &root;
  const nlohmann::ordered_json* node = &root;
  size_t pos = 2;
  while (pos <= ref.size()) {
    const size_t slash = std::min(ref.find('/', pos), ref.size());
    const std::string key = ref.substr(pos, slash - pos);
    if (!node->contains(key)) return nullptr;
    node = &(*node)[key];
    pos = slash + 1;
  }
  return node;
}

inline bool has_type(const nlohmann::ordered_json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == int64_t(v.get<double>()));
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

inline std::string schema_violation(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s, const nlohmann::ordered_json& root) {
  using json = nlohmann::ordered_json;
  if (s.is_boolean()) return s.get<bool>() ? "" : "false schema";
  if (s.contains("$ref")) {
    const json* target = resolve_ref(root, s["$ref"].get<std::string>());
    return target ? schema_violation(v, *target, root) : "bad $ref";
  }
  if (s.contains("const") && v != s["const"]) return "not the const " + s["const"].dump();
  if (s.contains("enum")) {
    bool found = false;
    for (const json& e : s["enum"]) found = found || e == v;
    if (!found) return v.dump() + " not in enum";
  }
  if (s.contains("anyOf")) {
    bool ok = false;
    for (const json& sub : s["anyOf"]) ok = ok || schema_violation(v, sub, root).empty();
    if (!ok) return "matches no anyOf branch";
  }
  if (s.contains("oneOf")) {
    int n = 0;
    for (const json& sub : s["oneOf"]) n += schema_violation(v, sub, root).empty();
    if (n != 1) return "matches " + std::to_string(n) + " oneOf branches";
  }
  if (s.contains("allOf")) {
    for (const json& sub : s["allOf"]) {
      if (auto e = schema_violation(v, sub, root); !e.empty()) return e;
    }
  }
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = has_type(v, s["type"]);
    else for (const json& t : s["type"]) ok = ok || has_type(v, t);
    if (!ok) return v.dump() + " is not of type " + s["type"].dump();
  }
  if (v.is_object()) {
    if (s.contains("required")) {
      for (const json& r : s["required"]) {
        if (!v.contains(r.get<std::string>())) return "missing required " + r.get<std::string>();
      }
    }
    for (const auto& [k, sub] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(k)) {
        if (auto e = schema_violation(sub, s["properties"][k], root); !e.empty()) return k + ": " + e;
      } else if (s.contains("additionalProperties")) {
        if (auto e = schema_violation(sub, s["additionalProperties"], root); !e.empty()) return k + ": " + e;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "too many items";
    if (s.contains("items")) {
      for (const json& item : v) {
        if (auto e = schema_violation(item, s["items"], root); !e.empty()) return "item: " + e;
      }
    }
  }
  if (v.is_string()) {
    const size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return "string too short";
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return "string too long";
  }
  if (v.is_number() && s.contains("minimum") && v.get<double>() < s["minimum"].get<double>()) return "below minimum";
  return "";
}

}  // namespace baton::test
