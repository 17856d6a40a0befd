#include "engine/arch.h"

#include "engine/arch_registry.h"

namespace baton {

std::vector<std::string> Arch::known() {
  std::vector<std::string> out;
  for (const ArchEntry& e : arch_entries()) out.emplace_back(e.name);
  return out;
}

std::unique_ptr<Arch> Arch::from_gguf(const GgufFile& f) { return arch_entry(f).make_arch(f); }

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
