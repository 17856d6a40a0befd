// The rows of a batched forward: consecutive tokens of several sequences in
// one pass, so that a stage reads its weights once for all of them. A batch
// is a list of chunks, one per sequence, each continuing its sequence at its
// next position: a prefill chunk of many tokens and single decode tokens of
// other sequences mix freely. Input rows (token ids, or boundary activations
// on a stage without the embedding) follow the chunks in order.
//
// What comes back: on the last stage one row of logits per chunk that asks
// for output (its last token's), in chunk order; on other stages every row's
// boundary activations, in row order.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

namespace baton {

struct BatchChunk {
  int seq = 0;           // KV sequence slot; at most one chunk per sequence in a batch
  int64_t n_tokens = 0;  // >= 1, at the sequence's next positions
  bool output = false;   // last stage: return the logits of the chunk's last token
};

// Checks a batch against a stage's shape: at least one chunk; each sequence
// in [0, n_seq) and at most once; every chunk non-empty and within the
// context from its sequence's position; the total within max_batch. Returns
// the total tokens. Throws std::invalid_argument or std::out_of_range with
// the reason.
int64_t check_batch(std::span<const BatchChunk> chunks, int n_seq, int64_t max_batch, int64_t n_ctx,
                    const std::function<int64_t(int)>& position);

// Chunks that ask for output.
int64_t batch_outputs(std::span<const BatchChunk> chunks);

}  // namespace baton
