// The registry of architectures: general.architecture -> factory. Each
// factory lives in its arch_<name>.cpp.
#include "engine/arch.h"

#include <stdexcept>

#include "engine/gguf.h"

namespace baton {

std::unique_ptr<Arch> make_llama_arch(const GgufFile& f);
std::unique_ptr<Arch> make_qwen2_arch(const GgufFile& f);
std::unique_ptr<Arch> make_qwen3_arch(const GgufFile& f);
std::unique_ptr<Arch> make_deepseek4_arch(const GgufFile& f);

namespace {
struct Entry {
  const char* name;
  std::unique_ptr<Arch> (*make)(const GgufFile&);
};
const Entry kArchs[] = {
    {"llama", make_llama_arch},
    {"qwen2", make_qwen2_arch},
    {"qwen3", make_qwen3_arch},
    {"deepseek4", make_deepseek4_arch},
};
}  // namespace

std::vector<std::string> Arch::known() {
  std::vector<std::string> out;
  for (const auto& e : kArchs) out.emplace_back(e.name);
  return out;
}

std::unique_ptr<Arch> Arch::from_gguf(const GgufFile& f) {
  const std::string name = f.get_str("general.architecture", "");
  if (name.empty()) throw std::runtime_error("the file has no general.architecture key");
  for (const auto& e : kArchs) {
    if (name == e.name) return e.make(f);
  }
  std::string known;
  for (const auto& e : kArchs) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw std::runtime_error("unknown architecture '" + name + "' (this build runs: " + known + ")");
}

uint64_t Arch::kv_bytes_per_token_per_layer() const {
  uint64_t n = 0;
  for (int64_t w : kv_stream_widths()) n += uint64_t(w);
  return n * sizeof(float);
}

std::vector<KvStreamShape> Arch::kv_layer_streams(int /*layer*/, int64_t n_ctx) const {
  std::vector<KvStreamShape> out;
  for (int64_t w : kv_stream_widths()) out.push_back({n_ctx, w, false});
  return out;
}

}  // namespace baton
