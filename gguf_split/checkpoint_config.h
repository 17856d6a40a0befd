// A checkpoint's config.json, read for the converters (convert_llama,
// convert_deepseek4): typed fields with defaults, and refusals that name the
// file and the field.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace baton {

class CheckpointConfig {
 public:
  using json = nlohmann::json;
  // Reads DIR/config.json; throws std::runtime_error when it is missing, does
  // not parse or is not an object.
  explicit CheckpointConfig(const std::string& dir);

  [[noreturn]] void refuse(const std::string& what) const;  // "PATH: what"
  const json& root() const { return j_; }

  // A field of `obj` (the root by default); nullptr when absent or null.
  const json* find(const char* key, const json* obj = nullptr) const;
  // An object field (nullptr when absent); `where` prefixes the field's name
  // in messages, e.g. "rope_parameters.".
  const json* object(const char* key, const json* obj = nullptr, const std::string& where = "") const;
  // An integer field; without a default, a missing field is refused.
  int64_t integer(const char* key, std::optional<int64_t> def = {}) const;
  // An integer in 1..2^24 (a dimension or a count).
  int64_t dim(const char* key, std::optional<int64_t> def = {}) const;
  double number(const char* key, double def, const json* obj = nullptr, const std::string& where = "") const;
  bool boolean(const char* key, bool def) const;
  std::string string(const char* key, const std::string& def, const json* obj = nullptr,
                     const std::string& where = "") const;
  // A special token id: an integer, the first of a list (llama 3.1 lists
  // several EOS ids), or -1 when absent.
  int64_t token_id(const char* key) const;

 private:
  std::string path_;
  json j_;
};

}  // namespace baton
