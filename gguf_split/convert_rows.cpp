#include "gguf_split/convert_rows.h"

#include <cstring>

namespace baton {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void convert_row(DType from, const uint8_t* src, DType to, uint8_t* dst, int64_t n, std::vector<float>& tmp) {
  if (from == to) {
    std::memcpy(dst, src, size_t(n) * dtype_info(from).block_bytes);
    return;
  }
  tmp.resize(size_t(n));
  dequantize_row(from, src, tmp.data(), n);
  quantize_row(to, tmp.data(), dst, n);
}

}  // namespace baton
