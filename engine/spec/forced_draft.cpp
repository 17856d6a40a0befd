#include "engine/spec/forced_draft.h"

#include <fmt/format.h>

#include <stdexcept>

namespace baton {

ForcedDraft::ForcedDraft(Mode mode, int64_t prompt_len, std::vector<int32_t> continuation, int32_t n_vocab,
                         uint64_t seed, bool end_at_departure)
    : mode_(mode),
      prompt_len_(prompt_len),
      cont_(std::move(continuation)),
      n_vocab_(n_vocab),
      state_(seed),
      end_at_departure_(end_at_departure) {
  if (n_vocab_ < 2) throw std::invalid_argument("ForcedDraft: a vocabulary of at least 2 tokens");
}

Draft ForcedDraft::propose(int32_t bonus, int64_t position, int max_tokens) {
  const int64_t k = position - prompt_len_;  // the bonus is continuation[k]
  if (k < 0 || k >= int64_t(cont_.size()) || cont_[size_t(k)] != bonus) {
    if (end_at_departure_ && k >= 0) {
      departed_at_ = position;
      Draft end;
      end.end = true;
      return end;
    }
    throw std::logic_error(fmt::format("ForcedDraft: bonus {} at position {} is not the continuation's", bonus, position));
  }
  Draft d;
  int right = max_tokens;  // guesses taken from the continuation
  if (mode_ == Mode::Reject) right = 0;
  if (mode_ == Mode::Prefix) {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;  // an LCG: enough for picking depths
    right = int((state_ >> 33) % uint64_t(max_tokens + 1));
  }
  for (int i = 0; i < max_tokens && k + 1 + i < int64_t(cont_.size()); ++i) {
    const int32_t t = cont_[size_t(k + 1 + i)];
    d.tokens.push_back(i < right ? t : int32_t((t + 1) % n_vocab_));
  }
  return d;
}

void ForcedDraft::committed(std::span<const int32_t> tokens, int64_t position, std::span<const float> hidden) {
  if (position != committed_) {
    throw std::logic_error(fmt::format("ForcedDraft: committed at {}, expected {}", position, committed_));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t k = position + int64_t(i) - prompt_len_;
    if (k >= 0 && (k >= int64_t(cont_.size()) || cont_[size_t(k)] != tokens[i])) {
      throw std::logic_error(fmt::format("ForcedDraft: committed token {} at {} is not the continuation's", tokens[i],
                                         position + int64_t(i)));
    }
  }
  committed_ += int64_t(tokens.size());
  if (!hidden.empty()) {
    hidden_rows_ += int64_t(tokens.size());
    hidden_.insert(hidden_.end(), hidden.begin(), hidden.end());
  }
}

}  // namespace baton
