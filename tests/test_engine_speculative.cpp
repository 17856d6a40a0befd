// Speculative decoding, the target side, on synthetic deepseek4 models
// (`deepseek4-micro`: the layer kinds of `deepseek4-tiny` - sliding, sliding,
// ratio 4 with the indexer, ratio 128, ratio 4 - at n_embd 64 with a window
// of 16; and `deepseek4-tiny` itself, window 32) and a llama: greedy output
// with drafts equals plain greedy output token for token in the
// forced-acceptance, forced-rejection and random-prefix modes for draft
// lengths 1..5, with positions past 127 (a ratio-128 row) and far past the
// window; a verify cut back then continued equals a fresh run, KV state and
// logits, bit for bit; cuts that are not allowed are refused; the captured
// hidden rows equal the layer outputs of a split stage; stops inside an
// accepted block; the sampled rule keeps the target's distribution.
#include <gtest/gtest.h>

#include <cstdlib>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "engine/gguf/file.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/stage.h"
#include "engine/sampling/sampler.h"
#include "engine/spec/draft_pacer.h"
#include "engine/spec/forced_draft.h"
#include "engine/spec/speculative.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

// Under AddressSanitizer and UBSan (scripts/test.sh) a forward costs some
// 20 times more: the drafted-equals-plain matrix then runs 2 of its 20
// prompts (the first and the longest) and the deepseek4-tiny run is skipped;
// the regular build runs everything.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr int kGen = 128;       // tokens generated per prompt
constexpr int kPrompts = 20;
constexpr int kMaxDraft = 5;
constexpr int64_t kCtx = 320;
const std::vector<int> kCapture = {2, 3, 4};  // the last three layers (drafter_capture_layers' default)

StageConfig spec_config() {
  StageConfig c;
  c.n_ctx = kCtx;
  c.n_seq = 2;
  c.max_batch = 64;
  c.n_threads = 1;
  c.verify_rows = kMaxDraft + 1;
  c.capture_layers = kCapture;
  return c;
}

// A synthetic model and a stage over it, made once per shape for the process.
struct SpecModel {
  explicit SpecModel(const std::string& shape, bool capture = true) {
    SynthOptions o;
    o.shape = shape;
    o.seed = 0x5bec;
    path = dir.file(shape + ".gguf");
    write_synth_model(path, o);
    file = std::make_unique<GgufFile>(GgufFile::open(path));
    StageConfig c = spec_config();
    if (!capture) c.capture_layers.clear();
    runner = make_stage_runner(Backend::Cpu, *file, c);
  }
  test::TempDir dir;
  std::string path;
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<StageRunner> runner;
};

class Speculative : public ::testing::Test {
 protected:
  // deepseek4-micro: every layer kind of the tiny shape at n_embd 64 (window 16).
  static SpecModel& micro() {
    static SpecModel m("deepseek4-micro-f32");
    return m;
  }
  static SpecModel& tiny() {
    static SpecModel m("deepseek4-tiny-q4");
    return m;
  }
  // A llama: its KV rows are cut like any (no checkpoint needed), no capture.
  static SpecModel& llama() {
    static SpecModel m("llama-tiny", false);
    return m;
  }
  static SpecModel* model_;  // the model the helpers below use
  void SetUp() override { model_ = &micro(); }

  static StageRunner& stage() { return *model_->runner; }
  static const GgufFile& file() { return *model_->file; }
  static int32_t n_vocab() { return int32_t(stage().n_vocab()); }
  static int64_t n_embd() { return stage().arch().dims().n_embd; }

  // A prompt of random ids; lengths 3..99 so that the 128 generated
  // tokens cross position 127 (the ratio-128 layer's first row) in every run.
  static std::vector<int32_t> prompt(int i) {
    std::mt19937 rng(uint32_t(1000 + i));
    std::vector<int32_t> p(size_t(3 + (i * 37) % 97));
    for (auto& t : p) t = int32_t(rng() % uint32_t(n_vocab()));
    return p;
  }

  static std::span<const float> prefill(int seq, const std::vector<int32_t>& p) {
    StageRunner& s = stage();
    s.reset(seq);
    std::span<const float> logits;
    for (size_t at = 0; at < p.size(); at += 64) {
      logits = s.forward(seq, std::span<const int32_t>(p.data() + at, std::min<size_t>(64, p.size() - at)));
    }
    return logits;
  }

  // Plain greedy decoding written out here: the prompt in chunks, then one
  // token per forward, each the argmax of the last logits.
  static std::vector<int32_t> plain_greedy(int seq, const std::vector<int32_t>& p, int n) {
    std::span<const float> logits = prefill(seq, p);
    std::vector<int32_t> out;
    for (int k = 0; k < n; ++k) {
      out.push_back(argmax(logits));
      if (k + 1 < n) logits = stage().forward(seq, std::span<const int32_t>(&out.back(), 1));
    }
    return out;
  }

  static SpecResult spec_greedy(int seq, const std::vector<int32_t>& p, DraftSource& d, int max_draft, int n,
                                bool capture = false) {
    stage().reset(seq);
    SamplerParams sp;
    sp.temperature = 0;
    Sampler sampler(sp, n_vocab());
    SpecOptions o;
    o.max_draft = max_draft;
    o.n_predict = n;
    o.capture = capture;
    return speculative_generate(stage(), seq, p, sampler, d, o);
  }

  // Each prompt's plain greedy continuation against the drafted runs of
  // `modes` for each draft length (Prefix: the longest only).
  static void greedy_equals_plain(const std::vector<int>& prompts, int n_gen, const std::vector<ForcedDraft::Mode>& modes,
                                  const std::vector<int>& lengths) {
    using Mode = ForcedDraft::Mode;
    const auto t0 = std::chrono::steady_clock::now();
    int64_t verifies = 0, accepted = 0, drafted = 0;
    for (int i : prompts) {
      const std::vector<int32_t> p = prompt(i);
      const std::vector<int32_t> want = plain_greedy(0, p, n_gen);
      for (Mode mode : modes) {
        for (int L : lengths) {
          if (mode == Mode::Prefix && L != lengths.back()) continue;
          ForcedDraft d(mode, int64_t(p.size()), want, n_vocab(), uint64_t(i * 10 + L));
          const SpecResult r = spec_greedy(0, p, d, L, n_gen);
          ASSERT_EQ(r.tokens, want) << "prompt " << i << " (" << p.size() << " tokens), mode " << int(mode)
                                    << ", drafts of " << L;
          EXPECT_EQ(r.stop, "length");
          // Plain decoding leaves the prompt and every token but the last.
          EXPECT_EQ(stage().position(0), int64_t(p.size()) + n_gen - 1);
          EXPECT_EQ(d.committed_positions(), stage().position(0));
          if (mode == Mode::Accept) {
            EXPECT_EQ(r.stats.accepted, r.stats.drafted);
          }
          if (mode == Mode::Reject) {
            EXPECT_EQ(r.stats.accepted, 0);
            EXPECT_EQ(r.stats.verifies, n_gen - 1);
          }
          verifies += r.stats.verifies;
          accepted += r.stats.accepted;
          drafted += r.stats.drafted;
        }
      }
    }
    std::printf("[   info   ] %zu prompts x %d tokens: %lld verifies, %lld of %lld guesses kept, %.1f s\n",
                prompts.size(), n_gen, (long long)verifies, (long long)accepted, (long long)drafted,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
};

SpecModel* Speculative::model_ = nullptr;

using Mode = ForcedDraft::Mode;

TEST_F(Speculative, GreedyEqualsPlainInEveryForcedMode) {
  std::vector<int> prompts;
  for (int i = 0; i < kPrompts; ++i) {
    if (!kSanitized || i == 0 || i == 13) prompts.push_back(i);  // 3 and 96 tokens
  }
  greedy_equals_plain(prompts, kGen, {Mode::Accept, Mode::Reject, Mode::Prefix}, {1, 2, 3, 4, 5});
}

// The same on deepseek4-tiny (n_embd 256, window 32, Q4_K experts; each
// token costs some 30 times the micro model's, so fewer runs): a prompt of
// 91 tokens and 40 generated ones, past position 127, drafts of 1, 3 and 5.
// BATON_SPEC_FULL=1 runs the whole matrix on tiny instead (20 prompts x 128
// tokens, every mode and draft length: minutes, so not in CI).
TEST_F(Speculative, GreedyEqualsPlainOnTiny) {
  const char* full = std::getenv("BATON_SPEC_FULL");
  model_ = &tiny();
  if (full && std::string(full) == "1") {
    std::vector<int> prompts;
    for (int i = 0; i < kPrompts; ++i) prompts.push_back(i);
    greedy_equals_plain(prompts, kGen, {Mode::Accept, Mode::Reject, Mode::Prefix}, {1, 2, 3, 4, 5});
    return;
  }
  if (kSanitized) GTEST_SKIP() << "some 75 ms a token under the sanitizers: the regular build runs it";
  greedy_equals_plain({5}, 40, {Mode::Accept, Mode::Reject}, {1, 3, 5});
}

// The pacer's rule on given timings: plain steps first, then a window of
// drafting steps judged against the fastest recent plain step; a window
// slower than plain pauses drafting, each failed probe doubles the pause up
// to its cap, and a window that pays resets it.
TEST(DraftPacer, DraftsWhileItPaysAndBacksOffWhileItDoesNot) {
  DraftPacer::Options o;
  o.probe = 4, o.pause = 3, o.max_pause = 12;
  DraftPacer p(o);
  for (int i = 0; i < DraftPacer::kPlainSteps; ++i) {
    EXPECT_FALSE(p.draft_now()) << "plain step " << i;
    p.plain(i == 0 ? 0.030 : 0.010);  // the slower first step (a warm-up) does not set the rate
  }
  EXPECT_DOUBLE_EQ(p.plain_seconds(), 0.010);
  // 2 tokens in 15 ms: 133 tokens/s against plain 100: drafting stays on.
  for (int i = 0; i < 3 * o.probe; ++i) {
    ASSERT_TRUE(p.draft_now()) << i;
    p.drafted(2, 0.015);
  }
  EXPECT_EQ(p.pauses(), 0);
  EXPECT_NEAR(p.judged_tokens_per_s(), 2 / 0.015, 1e-6);
  // 1 token in 15 ms: slower than plain. The window ends in a pause of 3, then 6, then 12, 12.
  for (int want : {3, 6, 12, 12}) {
    for (int i = 0; i < o.probe; ++i) {
      ASSERT_TRUE(p.draft_now());
      p.drafted(1, 0.015);
    }
    EXPECT_EQ(p.last_pause(), want);
    for (int i = 0; i < want; ++i) {
      ASSERT_FALSE(p.draft_now()) << "pause of " << want << ", step " << i;
      p.plain(0.010);
    }
  }
  EXPECT_EQ(p.pauses(), 4);
  // Exactly at the plain rate counts as paying, and resets the pause.
  for (int i = 0; i < o.probe; ++i) p.drafted(1, 0.010);
  EXPECT_TRUE(p.draft_now());
  for (int i = 0; i < o.probe; ++i) p.drafted(1, 0.020);
  EXPECT_EQ(p.last_pause(), o.pause);
  EXPECT_EQ(p.pauses(), 5);
  EXPECT_THROW(DraftPacer({0, 1, 1}), std::invalid_argument);
  EXPECT_THROW(DraftPacer({1, 4, 2}), std::invalid_argument);
}

// A caller that drafts before any plain step (no plain figure) is sent one
// plain step before its window is judged.
TEST(DraftPacer, WithoutAPlainFigureAWindowAsksForAPlainStep) {
  DraftPacer::Options o;
  o.probe = 2;
  DraftPacer fresh(o);
  while (!fresh.draft_now()) fresh.plain(0.0);  // plain steps that measured nothing
  fresh.drafted(1, 1.0);
  fresh.drafted(1, 1.0);
  EXPECT_FALSE(fresh.draft_now());
  EXPECT_EQ(fresh.pauses(), 0);
}

// speculative_generate with a pacer: its first steps are plain (no round
// asked of the source), and the output is the plain greedy output.
TEST_F(Speculative, PacedRunStartsWithPlainStepsAndKeepsThePlainOutput) {
  struct Counting final : DraftSource {
    std::vector<int64_t> at;  // the position of each round asked for
    Draft propose(int32_t bonus, int64_t position, int) override {
      at.push_back(position);
      return {{bonus}, {}};  // one guess: the bonus again
    }
    void committed(std::span<const int32_t>, int64_t, std::span<const float>) override {}
  };
  const std::vector<int32_t> p = prompt(2);
  const int n = 8;  // under one judgement: 2 plain steps, then drafting ones
  const std::vector<int32_t> want = plain_greedy(0, p, n);
  stage().reset(0);
  SamplerParams sp;
  sp.temperature = 0;
  Sampler sampler(sp, n_vocab());
  SpecOptions o;
  o.max_draft = 1;
  o.n_predict = n;
  DraftPacer pacer;
  o.pacer = &pacer;
  Counting source;
  const SpecResult r = speculative_generate(stage(), 0, p, sampler, source, o);
  EXPECT_EQ(r.tokens, want);
  // The last step wants one token: no guess, whatever the pacer says.
  ASSERT_FALSE(source.at.empty());
  EXPECT_EQ(source.at[0], int64_t(p.size()) + DraftPacer::kPlainSteps);
  EXPECT_GE(int64_t(source.at.size()), r.stats.verifies - DraftPacer::kPlainSteps - 1);
  EXPECT_EQ(r.stats.drafted, int64_t(source.at.size()));
  EXPECT_GT(pacer.plain_seconds(), 0.0);
}

// The loop is the architecture's business only through truncate_seq: a
// llama's cut is a plain one.
TEST_F(Speculative, GreedyEqualsPlainOnLlama) {
  model_ = &llama();
  greedy_equals_plain({1}, 32, {Mode::Accept, Mode::Reject, Mode::Prefix}, {3});
}

// Runs `t` into seq at its next positions, in chunks; every row's logits
// where a chunk is short enough for them (the stage's verify rows).
std::vector<float> feed(Stage& s, int seq, const std::vector<int32_t>& t) {
  std::vector<float> all;
  for (size_t at = 0; at < t.size(); at += 16) {
    const auto chunk = std::span<const int32_t>(t).subspan(at, std::min<size_t>(16, t.size() - at));
    ForwardOptions o;
    o.all_logits = chunk.size() <= size_t(kMaxDraft + 1);
    const ForwardRows r = s.forward_rows(seq, chunk, o);
    all.insert(all.end(), r.out.begin(), r.out.end());
  }
  return all;
}

// The KV state of seq a equals seq b's: every ring slot of the last
// positions (slots never written hold whatever the allocation held) and
// every complete compressed and index row.
void expect_same_state(const Stage& s, int a, int b) {
  const KvCache& kv = s.kv();
  const auto& shape = dynamic_cast<const Deepseek4Arch&>(s.arch()).shape();
  const int64_t n = s.position(a);
  ASSERT_EQ(s.position(b), n);
  auto same_rows = [&](int l, int st, int64_t first, int64_t count) {
    const KvStreamShape& sh = kv.stream_shape(l, st);
    const size_t bytes = size_t(count * sh.width) * sizeof(float);
    ASSERT_EQ(std::memcmp(kv.stream(l, a, st) + first * sh.width, kv.stream(l, b, st) + first * sh.width, bytes), 0)
        << "layer " << l << " stream " << st << " rows " << first << "+" << count << " at length " << n;
  };
  auto same_ring = [&](int l, int st, int64_t slots, int64_t offset) {
    for (int64_t p = std::max<int64_t>(0, n - slots); p < n; ++p) same_rows(l, st, offset + p % slots, 1);
  };
  for (int l = 0; l < shape.n_layer; ++l) {
    same_ring(l, Deepseek4Arch::kWindow, kv.stream_shape(l, Deepseek4Arch::kWindow).rows, 0);
    const int r = shape.compress_ratio(l);
    if (r == 0) continue;
    const int64_t slots = kv.stream_shape(l, Deepseek4Arch::kCompState).rows / 2;  // kv ring, then gate ring
    same_rows(l, Deepseek4Arch::kCompRows, 0, n / r);
    same_ring(l, Deepseek4Arch::kCompState, slots, 0);
    same_ring(l, Deepseek4Arch::kCompState, slots, slots);
    if (!shape.has_indexer(l)) continue;
    same_rows(l, Deepseek4Arch::kIdxRows, 0, n / r);
    same_ring(l, Deepseek4Arch::kIdxState, slots, 0);
    same_ring(l, Deepseek4Arch::kIdxState, slots, slots);
  }
}

// For each head: seq 0 runs the head, then for keep = 0..6 a checkpointed
// forward of a 6-token block cut back to keep tokens of it, compared with
// seq 1, which grows from the head one block token at a time (a fresh run),
// and cut back again to the head; then the block cut to `tail_keep` tokens
// and continued with a tail, against seq 2 run fresh: the tail's logits
// agree bit for bit.
TEST_F(Speculative, CutBackThenContinueEqualsFreshRun) {
  StageConfig c = spec_config();
  c.n_seq = 3;
  Stage s(file(), c);  // a Stage of its own: the test reads its KV
  std::mt19937 rng(7);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = int32_t(rng() % uint32_t(n_vocab()));
    return t;
  };
  const std::vector<int32_t> tail = tokens(9);
  ForwardOptions verify;
  verify.all_logits = verify.checkpoint = true;
  // Heads whose blocks straddle a ratio-4 window end (every 4), the
  // ratio-128 row at 127 and 255, and the window ring's wraps (every 16).
  int64_t tail_keep = 0;
  for (int64_t head : {1, 14, 29, 125, 126, 127, 253}) {
    SCOPED_TRACE(testing::Message() << "head " << head);
    const std::vector<int32_t> h = tokens(size_t(head)), block = tokens(size_t(kMaxDraft + 1));
    for (int seq = 0; seq < 3; ++seq) s.reset(seq);
    feed(s, 0, h);
    feed(s, 1, h);
    for (int64_t keep = 0; keep <= kMaxDraft + 1; ++keep) {
      SCOPED_TRACE(testing::Message() << "keep " << keep);
      if (keep > 0) feed(s, 1, {block[size_t(keep - 1)]});
      s.forward_rows(0, block, verify);
      s.truncate_seq(0, head + keep);
      expect_same_state(s, 0, 1);
      s.truncate_seq(0, head);  // further back inside the same checkpoint
    }
    tail_keep = (tail_keep + 1) % (kMaxDraft + 1);
    std::vector<int32_t> fresh = h;
    fresh.insert(fresh.end(), block.begin(), block.begin() + tail_keep);
    feed(s, 2, fresh);
    s.forward_rows(0, block, verify);
    s.truncate_seq(0, head + tail_keep);
    const std::vector<float> a = feed(s, 0, tail), b = feed(s, 2, tail);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "tail after keeping " << tail_keep;
    expect_same_state(s, 0, 2);
  }
}

TEST_F(Speculative, RefusesCutsItCannotMake) {
  StageRunner& s = stage();
  s.reset(0);
  s.reset(1);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  s.forward(0, std::span<const int32_t>(t.data(), 10));
  // No checkpointed forward: only the end or 0.
  EXPECT_THROW(s.truncate_seq(0, 5), std::invalid_argument);
  EXPECT_THROW(s.truncate(0, 5), std::invalid_argument);  // the plain cut refuses too
  EXPECT_THROW(s.truncate_seq(0, 11), std::out_of_range);
  s.truncate_seq(0, 10);  // nothing to do
  ForwardOptions v;
  v.all_logits = v.checkpoint = true;
  s.forward_rows(0, std::span<const int32_t>(t.data(), 4), v);  // positions 10..13
  EXPECT_THROW(s.truncate_seq(0, 9), std::invalid_argument);    // before the checkpoint
  s.forward(1, std::span<const int32_t>(t.data(), 3));
  EXPECT_THROW(s.truncate_seq(1, 1), std::invalid_argument);    // the checkpoint is seq 0's
  s.truncate_seq(0, 12);
  s.truncate_seq(0, 11);  // further back inside the same checkpoint
  s.forward(0, std::span<const int32_t>(t.data(), 1));          // moves past it
  try {
    s.truncate_seq(0, 11);
    ADD_FAILURE() << "a cut after a later forward was allowed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("can keep 12 or 0"), std::string::npos) << e.what();
  }
  s.truncate_seq(0, 0);
  EXPECT_EQ(s.position(0), 0);
  // Checkpoints and all-row logits only within the planned verify rows.
  ForwardOptions big = v;
  EXPECT_THROW(s.forward_rows(0, std::span<const int32_t>(t.data(), 7), big), std::invalid_argument);
  // More verify rows than the ratio-4 state ring (8) holds are refused at planning.
  StageConfig c = spec_config();
  c.verify_rows = 9;
  EXPECT_THROW(Stage::plan(file(), c), std::invalid_argument);
  c.verify_rows = 8;
  EXPECT_NO_THROW(Stage::plan(file(), c));
  c.capture_layers = {5};
  EXPECT_THROW(Stage::plan(file(), c), std::invalid_argument);
}

TEST_F(Speculative, CapturedRowsAreTheLayerOutputsForEveryCommittedPosition) {
  const std::vector<int32_t> p = prompt(3);
  const std::vector<int32_t> want = plain_greedy(0, p, 40);
  ForcedDraft d(Mode::Prefix, int64_t(p.size()), want, n_vocab(), 5);
  const SpecResult r = spec_greedy(0, p, d, kMaxDraft, 40, /*capture=*/true);
  ASSERT_EQ(r.tokens, want);
  const int64_t E = n_embd(), rows = stage().position(0);
  ASSERT_EQ(d.hidden_rows(), rows);
  ASSERT_EQ(int64_t(d.hidden().size()), rows * int64_t(kCapture.size()) * E);
  // The same rows from stages that end at each captured layer: their
  // boundary output is the layer's hyper-connection state; its stream mean
  // is the capture.
  std::vector<int32_t> all = p;
  all.insert(all.end(), want.begin(), want.begin() + (rows - int64_t(p.size())));
  for (size_t i = 0; i < kCapture.size(); ++i) {
    StageConfig c;
    c.n_ctx = kCtx;
    c.last_layer = kCapture[i];
    c.head = false;
    c.max_batch = 64;
    Stage part(file(), c);
    for (size_t at = 0; at < all.size(); at += 64) {
      const size_t n = std::min<size_t>(64, all.size() - at);
      const std::span<const float> x = part.forward(0, std::span<const int32_t>(all.data() + at, n));
      for (size_t t = 0; t < n; ++t) {
        const float* got = d.hidden().data() + ((at + t) * kCapture.size() + i) * size_t(E);
        for (int64_t e = 0; e < E; ++e) {
          float mean = 0;
          for (int k = 0; k < 4; ++k) mean += x[t * 4 * size_t(E) + size_t(k * E + e)];
          ASSERT_NEAR(got[e], mean / 4, 1e-5f * std::max(1.0f, std::fabs(mean))) << "row " << at + t << " layer "
                                                                                   << kCapture[i];
        }
      }
    }
  }
}

TEST_F(Speculative, StopsInsideAnAcceptedBlock) {
  const std::vector<int32_t> p = prompt(5);
  const std::vector<int32_t> want = plain_greedy(0, p, 30);
  SamplerParams sp;
  sp.temperature = 0;
  // n_predict inside a block: exactly that many, the KV as plain leaves it.
  for (int n : {1, 2, 7, 11}) {
    ForcedDraft d(Mode::Accept, int64_t(p.size()), want, n_vocab());
    const SpecResult r = spec_greedy(0, p, d, kMaxDraft, n);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + n));
    EXPECT_EQ(stage().position(0), int64_t(p.size()) + n - 1);
  }
  // A stop token at output index 9 (the middle of the second block).
  // The stop is an output token not seen before it (from index 7 on: the second block).
  int k = 7;
  while (k < 30 && std::find(want.begin(), want.begin() + k, want[size_t(k)]) != want.begin() + k) ++k;
  if (k == 30) GTEST_SKIP() << "the continuation repeats itself: no fresh token to stop at";
  {
    stage().reset(0);
    Sampler sampler(sp, n_vocab());
    ForcedDraft d(Mode::Accept, int64_t(p.size()), want, n_vocab());
    SpecOptions o;
    o.n_predict = 30;
    o.stop_tokens = {want[size_t(k)]};
    const SpecResult r = speculative_generate(stage(), 0, p, sampler, d, o);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + k));
    EXPECT_EQ(r.stop, "stop token");
    EXPECT_EQ(stage().position(0), int64_t(p.size()) + k);
  }
  {
    // A stop string: each token's text is "<id>;"; stop at the text of output 9.
    stage().reset(0);
    Sampler sampler(sp, n_vocab());
    ForcedDraft d(Mode::Accept, int64_t(p.size()), want, n_vocab());
    SpecOptions o;
    o.n_predict = 30;
    o.piece = [](int32_t id) { return "<" + std::to_string(id) + ">;"; };
    o.stop_strings = {"<" + std::to_string(want[size_t(k)]) + ">"};
    const SpecResult r = speculative_generate(stage(), 0, p, sampler, d, o);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + k + 1));
    EXPECT_EQ(r.stop, "stop string");
    std::string text;
    for (int i = 0; i < k; ++i) text += o.piece(want[size_t(i)]);
    EXPECT_EQ(r.text, text);
  }
}

// A GPU's verify rows may pick unlike its decode steps (docs/SPECULATIVE.md):
// with end_at_departure the forced source ends the run at the first bonus
// that leaves its continuation, everything before it intact; without, it
// throws (the CPU's case, where a departure is a bug).
TEST_F(Speculative, ForcedSourceEndsTheRunWhereItLeavesTheContinuation) {
  const std::vector<int32_t> p = prompt(5);
  const std::vector<int32_t> want = plain_greedy(0, p, 30);
  const size_t k = 8;  // the continuation says otherwise from output 8 on
  std::vector<int32_t> script = want;
  script[k] = (want[k] + 1) % n_vocab();
  {
    ForcedDraft d(Mode::Accept, int64_t(p.size()), script, n_vocab(), 1, /*end_at_departure=*/true);
    const SpecResult r = spec_greedy(0, p, d, kMaxDraft, 30);
    EXPECT_EQ(r.stop, "source");
    EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + k + 1));  // the target's own pick at k
    EXPECT_EQ(d.departed_at(), int64_t(p.size() + k));
    EXPECT_EQ(stage().position(0), int64_t(p.size() + k));  // as plain decoding leaves it
  }
  {
    ForcedDraft d(Mode::Accept, int64_t(p.size()), want, n_vocab(), 1, /*end_at_departure=*/true);
    const SpecResult r = spec_greedy(0, p, d, kMaxDraft, 30);
    EXPECT_EQ(r.tokens, want);
    EXPECT_EQ(d.departed_at(), -1);
  }
  ForcedDraft strict(Mode::Accept, int64_t(p.size()), script, n_vocab());
  EXPECT_THROW(spec_greedy(0, p, strict, kMaxDraft, 30), std::logic_error);
}

TEST_F(Speculative, SampledWithoutDraftsEqualsPlainSampling) {
  const std::vector<int32_t> p = prompt(7);
  SamplerParams sp;
  sp.temperature = 0.9f;
  sp.seed = 42;
  sp.top_k = 0;
  sp.top_p = 1;
  sp.min_p = 0;
  Sampler plain(sp, n_vocab());
  std::span<const float> logits = prefill(0, p);
  std::vector<int32_t> want;
  for (int k = 0; k < 24; ++k) {
    want.push_back(plain.sample(logits));
    if (k + 1 < 24) logits = stage().forward(0, std::span<const int32_t>(&want.back(), 1));
  }
  Sampler s(sp, n_vocab());
  ForcedDraft d(Mode::Reject, int64_t(p.size()), want, n_vocab());
  SpecOptions o;
  o.max_draft = 0;
  o.n_predict = 24;
  stage().reset(0);
  EXPECT_EQ(speculative_generate(stage(), 0, p, s, d, o).tokens, want);
}

TEST_F(Speculative, DrafterLayersComeFromTheFileElseTheLastThree) {
  EXPECT_EQ(drafter_capture_layers(&file(), 5), kCapture);
  EXPECT_EQ(drafter_capture_layers(nullptr, 43), (std::vector<int>{40, 41, 42}));
  EXPECT_EQ(drafter_capture_layers(nullptr, 2), (std::vector<int>{0, 1}));
  auto with_ids = [&](const char* key, std::vector<int32_t> ids) {
    GgufWriter w;
    std::vector<GgufValue> items;
    for (int32_t i : ids) items.push_back(GgufValue::of_i32(i));
    w.set(key, GgufValue::of_array(GgufType::INT32, std::move(items)));
    const std::string path = model_->dir.file(std::string(key) + ".gguf");
    w.write(path);
    return GgufFile::open(path);
  };
  const GgufFile a = with_ids("dspark.target_layer_ids", {1, 3, 4});
  EXPECT_EQ(drafter_capture_layers(&a, 5), (std::vector<int>{1, 3, 4}));
  const GgufFile b = with_ids("deepseek4.dspark.target_layer_ids", {40, 41, 42});
  EXPECT_EQ(drafter_capture_layers(&b, 43), (std::vector<int>{40, 41, 42}));
  EXPECT_THROW(drafter_capture_layers(&b, 5), std::runtime_error);
}

// The sampled rule keeps the target's distribution: over many draws with a
// draft distribution q unlike p, the token the rule gives follows p.
TEST(SpeculativeRule, SampledVerifyFollowsTheTarget) {
  const std::vector<Sampler::Candidate> p = {{2, 0, 0.5}, {0, 0, 0.3}, {3, 0, 0.15}, {1, 0, 0.05}};
  const float q[4] = {0.1f, 0.6f, 0.1f, 0.2f};
  Rng rng(99);
  const int n = 200000;
  std::vector<int> count(4);
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    // The guess drawn from q, as a drafter would.
    const double u = rng.uniform();
    const int32_t guess = u < 0.1 ? 0 : u < 0.7 ? 1 : u < 0.8 ? 2 : 3;
    bool k = false;
    ++count[size_t(verify_sampled(p, guess, q[guess], q, rng.uniform(), rng.uniform(), &k))];
    kept += k;
  }
  const double want[4] = {0.3, 0.05, 0.5, 0.15};
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(count[size_t(t)] / double(n), want[t], 0.005) << "token " << t;
  // Kept share: sum min(p, q) = 0.1 + 0.05 + 0.1 + 0.15.
  EXPECT_NEAR(kept / double(n), 0.4, 0.005);
  // A deterministic guess (no draft distribution): kept with p(guess), else
  // the target without it.
  bool k = false;
  EXPECT_EQ(verify_sampled(p, 1, 1.0, nullptr, 0.01, 0.0, &k), 1);
  EXPECT_TRUE(k);
  EXPECT_EQ(verify_sampled(p, 2, 1.0, nullptr, 0.6, 0.0, &k), 0);
  EXPECT_FALSE(k);
}

}  // namespace
}  // namespace baton
