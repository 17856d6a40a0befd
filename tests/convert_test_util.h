// Helpers the `baton convert` and `baton logits` suites share (test_cli_convert_llama,
// test_cli_convert_deepseek4, test_cli_logits): running the binary, writing checkpoint files,
// token lists and raw logits.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace baton::test {

inline CommandResult baton(std::vector<std::string> args) {
  args.insert(args.begin(), baton_binary());
  return run_command(args);
}

inline void write_text(const std::string& path, const std::string& s) {
  write_file(path, std::vector<uint8_t>(s.begin(), s.end()));
}

// A safetensors file: the JSON header's length (8 bytes, little-endian), the header, the data.
inline void write_safetensors_file(const std::string& path, const nlohmann::json& header,
                                   const std::vector<uint8_t>& data) {
  const std::string text = header.dump();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  write_file(path, out);
}

inline std::vector<int32_t> random_tokens(uint64_t seed, int n, int64_t V) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t(rng() % uint64_t(V)));
  return t;
}

// "1,2,3", the form of `baton logits --tokens`.
inline std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

inline std::vector<float> read_raw_f32(const std::string& path) {
  auto bytes = read_file(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

}  // namespace baton::test
