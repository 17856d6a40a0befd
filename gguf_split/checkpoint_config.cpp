#include "gguf_split/checkpoint_config.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace baton {

namespace {
constexpr int64_t kMaxDim = int64_t(1) << 24;
}  // namespace

CheckpointConfig::CheckpointConfig(const std::string& dir)
    : path_((std::filesystem::path(dir) / "config.json").string()) {
  std::ifstream in(path_);
  if (!in) throw std::runtime_error("cannot read " + path_);
  try {
    j_ = json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(path_ + ": does not parse: " + e.what());
  }
  if (!j_.is_object()) throw std::runtime_error(path_ + ": not a JSON object");
}

void CheckpointConfig::refuse(const std::string& what) const { throw std::runtime_error(path_ + ": " + what); }

const CheckpointConfig::json* CheckpointConfig::find(const char* key, const json* obj) const {
  const json& o = obj ? *obj : j_;
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

const CheckpointConfig::json* CheckpointConfig::object(const char* key, const json* obj,
                                                       const std::string& where) const {
  const json* v = find(key, obj);
  if (v && !v->is_object()) refuse(fmt::format("field '{}{}' is not an object", where, key));
  return v;
}

int64_t CheckpointConfig::integer(const char* key, std::optional<int64_t> def) const {
  const json* v = find(key);
  if (!v) {
    if (def) return *def;
    refuse(fmt::format("missing field '{}'", key));
  }
  if (!v->is_number_integer()) refuse(fmt::format("field '{}' is not an integer", key));
  return v->get<int64_t>();
}

int64_t CheckpointConfig::dim(const char* key, std::optional<int64_t> def) const {
  const int64_t v = integer(key, def);
  if (v < 1 || v > kMaxDim) refuse(fmt::format("field '{}' = {} is out of range (1..2^24)", key, v));
  return v;
}

double CheckpointConfig::number(const char* key, double def, const json* obj, const std::string& where) const {
  const json* v = find(key, obj);
  if (!v) return def;
  if (!v->is_number()) refuse(fmt::format("field '{}{}' is not a number", where, key));
  return v->get<double>();
}

bool CheckpointConfig::boolean(const char* key, bool def) const {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_boolean()) refuse(fmt::format("field '{}' is not true or false", key));
  return v->get<bool>();
}

std::string CheckpointConfig::string(const char* key, const std::string& def, const json* obj,
                                     const std::string& where) const {
  const json* v = find(key, obj);
  if (!v) return def;
  if (!v->is_string()) refuse(fmt::format("field '{}{}' is not a string", where, key));
  return v->get<std::string>();
}

int64_t CheckpointConfig::token_id(const char* key) const {
  const json* v = find(key);
  if (v && v->is_array() && !v->empty()) v = &(*v)[0];
  if (!v || v->is_null()) return -1;
  if (!v->is_number_integer()) refuse(fmt::format("field '{}' is not a token id", key));
  return v->get<int64_t>();
}

}  // namespace baton
