#include "engine/spec/draft_pacer.h"

#include <algorithm>
#include <stdexcept>

namespace baton {

DraftPacer::DraftPacer() : DraftPacer(Options{}) {}

DraftPacer::DraftPacer(Options o) : o_(o), pause_(o.pause) {
  if (o_.probe < 1 || o_.pause < 1 || o_.max_pause < o_.pause) {
    throw std::invalid_argument("DraftPacer: probe and pause >= 1, max_pause >= pause");
  }
}

double DraftPacer::plain_seconds() const {
  return plain_s_.empty() ? 0.0 : *std::min_element(plain_s_.begin(), plain_s_.end());
}

void DraftPacer::plain(double seconds) {
  plain_s_.push_back(seconds);
  if (plain_s_.size() > size_t(kPlainWindow)) plain_s_.pop_front();
  if (plain_left_ > 0) --plain_left_;
}

void DraftPacer::drafted(int64_t tokens, double seconds) {
  win_tokens_ += tokens;
  win_s_ += seconds;
  if (++win_steps_ < o_.probe) return;
  const double plain_s = plain_seconds();
  // Without a plain figure yet (a caller that drafts from its first step)
  // the window cannot be judged: measure one plain step first.
  const bool pays = plain_s > 0 ? double(win_tokens_) * plain_s >= win_s_ : true;
  judged_rate_ = win_s_ > 0 ? double(win_tokens_) / win_s_ : 0.0;
  win_tokens_ = 0, win_steps_ = 0, win_s_ = 0;
  if (plain_s <= 0) {
    plain_left_ = 1;
  } else if (pays) {
    pause_ = o_.pause;
  } else {
    ++pauses_;
    plain_left_ = last_pause_ = pause_;
    pause_ = std::min(o_.max_pause, 2 * pause_);
  }
}

}  // namespace baton
