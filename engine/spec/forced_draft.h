// Draft sources that test the target side of speculative decoding without a
// drafter network (docs/SPECULATIVE.md, "Test modes"). Each knows the
// target's own greedy continuation of the prompt beforehand (from a plain
// run) and guesses from it:
//   Accept: the continuation itself, so every guess is kept (the verify
//           forward and its logits rows are exercised, never the rollback);
//   Reject: a token that is never the target's pick (continuation + 1), so
//           every verify keeps only the bonus and rolls the rest back;
//   Prefix: the continuation for a seeded random number of guesses, then
//           wrong ones, so the cut falls at every depth of the block.
// The source checks that what the loop reports as committed is contiguous
// and equals the continuation, and throws otherwise; with end_at_departure
// a bonus that leaves the continuation ends the generation instead
// (Draft::end; departed_at() says where): a GPU's verify rows may round a
// pick unlike its decode steps, and the forced run's figures then cover the
// tokens before that point.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/spec/speculative.h"

namespace baton {

class ForcedDraft final : public DraftSource {
 public:
  enum class Mode { Accept, Reject, Prefix };
  // prompt_len: the prompt's tokens; continuation[k] is the token the target
  // picks at position prompt_len + k (continuation[0] follows the prompt).
  ForcedDraft(Mode mode, int64_t prompt_len, std::vector<int32_t> continuation, int32_t n_vocab, uint64_t seed = 1,
              bool end_at_departure = false);

  Draft propose(int32_t bonus, int64_t position, int max_tokens) override;
  void committed(std::span<const int32_t> tokens, int64_t position, std::span<const float> hidden) override;

  int64_t committed_positions() const { return committed_; }  // positions reported so far
  int64_t hidden_rows() const { return hidden_rows_; }          // rows that came with hidden states
  const std::vector<float>& hidden() const { return hidden_; }  // every committed row's hidden state, in order
  // The position whose bonus left the continuation (end_at_departure), or -1.
  int64_t departed_at() const { return departed_at_; }

 private:
  Mode mode_;
  int64_t prompt_len_;
  std::vector<int32_t> cont_;
  int32_t n_vocab_;
  uint64_t state_;
  bool end_at_departure_;
  int64_t committed_ = 0, hidden_rows_ = 0, departed_at_ = -1;
  std::vector<float> hidden_;
};

}  // namespace baton
