// DraftPacer: whether drafting pays here, for this text, measured as it runs.
//
// A drafting step (a draft round, then a verify forward of the bonus and the
// guesses) emits 1 to L + 1 tokens; a plain step emits one. Which is faster
// depends on the machine (what a round and a K-row verify cost against the
// one-token step: docs/DSPARK.md) and on the text (how many guesses the
// target keeps), so the pacer measures both rates and drafts only while the
// drafting rate keeps up with the plain one:
//
//   - it starts with kPlainSteps plain steps (the plain rate's first figure);
//   - it then drafts, and after each window of `probe` drafting steps compares
//     their tokens per second with the plain rate (the fastest of the recent
//     plain steps: noise only ever slows a step down);
//   - where drafting is slower it pauses for `pause` plain steps (which
//     refresh the plain rate), then probes again; each failed probe doubles
//     the pause up to `max_pause`, one that pays resets it.
//
// So a drafter that does not pay costs at most one probe window in
// 1 + max_pause / probe of the steps, and one that pays stays on. The
// caller times each step from before the draft round to after the verify's
// logits, and reports a step without guesses as plain.
#pragma once

#include <cstdint>
#include <deque>

namespace baton {

class DraftPacer {
 public:
  struct Options {
    int probe = 8;         // drafting steps per judgement
    int pause = 32;        // plain steps after the first probe that does not pay
    int max_pause = 1024;  // the longest pause (the pause doubles per failed probe)
  };
  static constexpr int kPlainSteps = 2;   // plain steps before the first probe
  static constexpr int kPlainWindow = 8;  // recent plain steps the plain rate is the fastest of

  DraftPacer();
  explicit DraftPacer(Options o);

  // Whether the next step drafts.
  bool draft_now() const { return plain_left_ == 0; }
  // A drafting step: `tokens` emitted (1 + guesses kept) in `seconds`.
  void drafted(int64_t tokens, double seconds);
  // A plain one-token step of `seconds`.
  void plain(double seconds);

  // For logs and tests.
  int64_t pauses() const { return pauses_; }        // probes that did not pay
  int last_pause() const { return last_pause_; }    // plain steps of the latest pause
  double plain_seconds() const;                     // 0 before any plain step
  // Tokens per second of the drafting steps the latest judgement saw.
  double judged_tokens_per_s() const { return judged_rate_; }

 private:
  Options o_;
  int plain_left_ = kPlainSteps;  // plain steps before drafting again
  int pause_ = 0;
  int last_pause_ = 0;
  int64_t pauses_ = 0;
  double judged_rate_ = 0;
  std::deque<double> plain_s_;    // the last kPlainWindow plain steps
  int64_t win_tokens_ = 0;        // the drafting window: steps, tokens and time
  int win_steps_ = 0;
  double win_s_ = 0;
};

}  // namespace baton
