// libFuzzer target for the GGUF reader: any input must either parse or throw
// GgufError. Any other exception, a crash or a sanitizer report is a bug.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "engine/gguf/file.h"

namespace {

// Touches what a caller would use after a successful parse.
void exercise(const baton::GgufFile& f) {
  volatile uint64_t sink = f.tensor_table_hash();
  for (const auto& [key, v] : f.metadata()) {
    if (v.is_integer() || v.type == baton::GgufType::BOOL) {
      try {
        sink = sink + uint64_t(f.get_int(key));
      } catch (const std::runtime_error&) {
        // a u64 above INT64_MAX: refused by as_int, by design
      }
    }
  }
  std::vector<uint8_t> buf;
  for (const auto& t : f.tensors()) {
    if (t.nbytes > (1u << 16)) continue;
    buf.resize(t.nbytes);
    f.read_tensor(t, buf.data());
    sink = sink + t.row_bytes();
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    baton::GgufFile f = baton::GgufFile::parse(data, size);
    exercise(f);
  } catch (const baton::GgufError&) {
  }
  return 0;
}
