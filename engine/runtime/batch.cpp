#include "engine/runtime/batch.h"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

namespace baton {

int64_t check_batch(std::span<const BatchChunk> chunks, int n_seq, int64_t max_batch, int64_t n_ctx,
                    const std::function<int64_t(int)>& position) {
  if (chunks.empty()) throw std::invalid_argument("a batch needs at least one chunk");
  std::vector<bool> seen(size_t(n_seq > 0 ? n_seq : 0), false);
  int64_t total = 0;
  for (const BatchChunk& c : chunks) {
    if (c.seq < 0 || c.seq >= n_seq) {
      throw std::out_of_range(fmt::format("sequence {} out of range (have {})", c.seq, n_seq));
    }
    if (seen[size_t(c.seq)]) throw std::invalid_argument(fmt::format("sequence {} appears twice in one batch", c.seq));
    seen[size_t(c.seq)] = true;
    if (c.n_tokens < 1) throw std::invalid_argument(fmt::format("sequence {}: a chunk needs at least one token", c.seq));
    const int64_t pos = position(c.seq);
    if (pos + c.n_tokens > n_ctx) {
      throw std::out_of_range(
          fmt::format("sequence {} would reach {} tokens; the context is {}", c.seq, pos + c.n_tokens, n_ctx));
    }
    total += c.n_tokens;
  }
  if (total > max_batch) {
    throw std::invalid_argument(
        fmt::format("a forward takes 1..{} tokens (the planned batch), got {}; split the batch", max_batch, total));
  }
  return total;
}

int64_t batch_outputs(std::span<const BatchChunk> chunks) {
  int64_t n = 0;
  for (const BatchChunk& c : chunks) n += c.output ? 1 : 0;
  return n;
}

}  // namespace baton
