// Speculative decoding's target side on the CUDA deepseek4 stage
// (docs/SPECULATIVE.md): the verify forward, the device checkpoint and the
// cut back into it, and the hidden-state capture, against one-token decode
// steps, fresh runs and the CPU stage. Models: `deepseek4-tiny` (Q2: the
// integer-dot decode paths the real files take; window 32, ratio-4 and
// ratio-128 layers) and `deepseek4-micro` in F32. The plan test runs without
// a GPU; the rest skip.
//
// Bit-exactness: the stage's forwards of up to 8 rows are row-invariant
// (docs/DEEPSEEK4.md, "Batch invariance"): a verify forward's rows equal the
// one-token decode steps of their positions to the bit, queued or replayed
// from the decode graph, and so does everything after a cut (the kept rows
// ran the same arithmetic, the rejected rows' slots are restored from the
// checkpoint). The tests assert exactly that. Against the CPU the rows
// differ by the GPU's 16-bit activations and orders of sums, within the
// stage's batch tolerance (test_cuda_ds4_util.h).
//
// Greedy tokens: drafted output equals the CUDA plain output token for
// token in every forced mode, on `deepseek4-tiny` Q2 (whose random weights
// leave near-ties) as on `deepseek4-micro` F32; against the CPU's tokens
// only over the leading tokens whose plain top-1 margin is clear (above 2 x
// kDecodeTol of the row's max), as CudaDs4Stage.GreedyTokensMatchCpu bounds
// it, except on micro F32 where every product is float32 on both backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "engine/cuda/stages/ds4.h"
#include "engine/gguf/file.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/stage.h"
#include "engine/sampling/sampler.h"
#include "engine/spec/forced_draft.h"
#include "engine/spec/speculative.h"
#include "kernels/cuda/ds4_spec.cuh"
#include "tests/test_cuda_ds4_util.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::kDecodeTol;
using test::kOutlier;
using test::kOutlierShare;
using test::kTypical;
using test::random_tokens;
using test::rel_err;
using test::RowErrors;
using test::write_tiny;
using Mode = ForcedDraft::Mode;

constexpr int kVerify = 6;  // a bonus token and 5 guesses
const std::vector<int> kCapture = {2, 3, 4};
// Heads whose blocks straddle a ratio-4 window end (every 4), the ratio-128
// rows at 127 and 255, and the tiny window ring's wraps (every 32).
const std::vector<int64_t> kHeads = {1, 14, 29, 62, 125, 126, 127, 253};

StageConfig spec_config(int n_seq, bool capture) {
  StageConfig c;
  c.n_ctx = 512;
  c.max_batch = 64;
  c.n_seq = n_seq;
  c.n_threads = 4;
  c.verify_rows = kVerify;
  if (capture) c.capture_layers = kCapture;
  return c;
}

// Runs `t` into seq in chunks of the planned batch; the last chunk's logits.
std::vector<float> prefill(StageRunner& s, int seq, const std::vector<int32_t>& t) {
  std::span<const float> l;
  for (size_t at = 0; at < t.size(); at += size_t(s.max_batch())) {
    l = s.forward(seq, std::span<const int32_t>(t).subspan(at, std::min(t.size() - at, size_t(s.max_batch()))));
  }
  return {l.begin(), l.end()};
}

// One forward per token; every token's logits, back to back.
std::vector<float> decode(StageRunner& s, int seq, std::span<const int32_t> t) {
  std::vector<float> all;
  for (const int32_t& id : t) {
    const auto l = s.forward(seq, std::span<const int32_t>(&id, 1));
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

ForwardOptions verify_options() {
  ForwardOptions o;
  o.all_logits = o.checkpoint = true;
  return o;
}

// The rooms are planned only when asked for, at exactly their size: the
// capture rows (batch x layers x n_embd) and the checkpoint (the CPU arch's
// rollback floats of verify_rows) with its ring table in the workspace, the
// capture rows again in the pinned io. n_seq 6 gives both configs the same
// 6 logit rows, so nothing else moves.
TEST(CudaDs4Spec, PlanHoldsTheCheckpointAndCaptureRooms) {
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", 7));
  StageConfig plain = spec_config(6, false);
  plain.verify_rows = 0;
  const StageConfig spec = spec_config(6, true);
  const MemoryPlan a = CudaDs4Stage::plan(f, plain), b = CudaDs4Stage::plan(f, spec);
  const auto arch = Arch::from_gguf(f);
  const auto& ds4 = dynamic_cast<const Deepseek4Arch&>(*arch);
  const LayerRange all{0, ds4.dims().n_layer - 1};
  const uint64_t E = uint64_t(ds4.dims().n_embd);
  const uint64_t capture = 64 * kCapture.size() * E * sizeof(float);
  const uint64_t rollback = ds4.rollback_floats(all, 512, kVerify) * sizeof(float);
  const uint64_t rings = ds4.rollback_rings(all, 512).size() * sizeof(cuda::RingRows);
  // tiny: 1 + 1 + 5 + 3 + 5 rings; 2944 floats a row (window 128 a layer,
  // ratio 4: 2 x 256 compressor + 2 x 256 indexer, ratio 128: 2 x 128).
  EXPECT_EQ(ds4.rollback_rings(all, 512).size(), 15u);
  EXPECT_EQ(ds4.rollback_floats(all, 512, 1), 2944u);
  EXPECT_EQ(b.bytes(PlanLine::Workspace) - a.bytes(PlanLine::Workspace),
            align_up(capture, 256) + align_up(rollback, 256) + align_up(rings, 256));
  EXPECT_EQ(b.bytes(PlanLine::PinnedIo) - a.bytes(PlanLine::PinnedIo), align_up(capture));
  EXPECT_EQ(b.bytes(PlanLine::KvCache), a.bytes(PlanLine::KvCache));
  EXPECT_EQ(b.bytes(PlanLine::Weights), a.bytes(PlanLine::Weights));
  // A checkpoint covers at most the ratio-4 state ring (8 rows).
  StageConfig big = spec;
  big.verify_rows = 9;
  EXPECT_THROW(CudaDs4Stage::plan(f, big), std::invalid_argument);
  big.verify_rows = 8;
  EXPECT_NO_THROW(CudaDs4Stage::plan(f, big));
  big.capture_layers = {5};
  EXPECT_THROW(CudaDs4Stage::plan(f, big), std::invalid_argument);
  // The float micro model the greedy test runs takes the CUDA stage.
  const GgufFile micro = GgufFile::open(test::write_ds4(dir, "deepseek4-micro", "f32", 7));
  StageConfig m = spec_config(1, false);
  m.max_batch = 8;
  EXPECT_NO_THROW(CudaDs4Stage::plan(micro, m));
}

// (a) Each row of a checkpointed verify forward against the one-token decode
// step of the same position on the GPU (the decode graph: equal to the bit),
// and against the CPU's verify rows (within the tolerance), at every head of
// kHeads.
TEST(CudaDs4Spec, VerifyRowsMatchOneTokenDecode) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", seed));
  CudaDs4Stage gpu(f, spec_config(2, false));
  Stage cpu(f, spec_config(1, false));
  const int64_t V = gpu.n_vocab();
  RowErrors vs_cpu;
  int rows_exact = 0;
  for (int64_t head : kHeads) {
    const auto h = random_tokens(seed + uint64_t(head), size_t(head), V);
    const auto block = random_tokens(seed + 1000 + uint64_t(head), kVerify, V);
    for (int sq = 0; sq < 2; ++sq) {
      gpu.reset(sq);
      prefill(gpu, sq, h);
    }
    cpu.reset(0);
    for (size_t at = 0; at < h.size(); at += 64) {
      cpu.forward(0, std::span<const int32_t>(h).subspan(at, std::min<size_t>(64, h.size() - at)));
    }
    const ForwardRows rows = gpu.forward_rows(0, block, verify_options());
    ASSERT_EQ(rows.out.size(), size_t(kVerify * V));
    ASSERT_TRUE(rows.hidden.empty());
    const std::vector<float> got(rows.out.begin(), rows.out.end());
    const std::vector<float> want = decode(gpu, 1, block);
    const ForwardRows c = cpu.forward_rows(0, block, verify_options());
    for (int64_t t = 0; t < kVerify; ++t) {
      const auto row = std::span<const float>(got).subspan(size_t(t * V), size_t(V));
      rows_exact += std::memcmp(row.data(), want.data() + t * V, size_t(V) * sizeof(float)) == 0;
      vs_cpu.add(rel_err(row, c.out.subspan(size_t(t * V), size_t(V))));
    }
    EXPECT_EQ(gpu.position(0), head + kVerify);
  }
  vs_cpu.report("verify rows vs CPU");
  EXPECT_EQ(rows_exact, int(kHeads.size()) * kVerify) << "verify rows that differ from the decode step's logits";
  EXPECT_LT(vs_cpu.quantile(0.5), kTypical);
  EXPECT_LE(vs_cpu.over(kOutlier), 0.15);
}

// (b) For each head and each k = 0..6: sequence 0 verifies block a, sequence
// 1 block b (a's first k tokens, then others), both checkpointed and cut
// back to head + k (sequence 0 first to one more, then again: a second cut
// inside the same checkpoint); sequence 2 runs a's first k tokens as decode
// steps. A 9-token tail then gives all three the same logits, to the bit.
// Across the ratio-4
// window ends, the ratio-128 rows and the window's wraps of kHeads. What a
// cut restores shows in the tail where the tail still reads it: the window
// slots of heads past the window (32), and the ratio-128 state of heads that
// end a few tokens before its window ends (125-127, 253), whose rejected
// rows overwrote the slots of the window's first positions.
TEST(CudaDs4Spec, CutBackThenContinueEqualsFreshRun) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", seed));
  CudaDs4Stage gpu(f, spec_config(3, false));
  const int64_t V = gpu.n_vocab();
  const auto tail = random_tokens(seed + 7, 9, V);
  int exact = 0, fresh_exact = 0;
  for (int64_t head : kHeads) {
    const auto h = random_tokens(seed + uint64_t(head), size_t(head), V);
    const auto a = random_tokens(seed + 2000 + uint64_t(head), kVerify, V);
    for (int64_t keep = 0; keep <= kVerify; ++keep) {
      SCOPED_TRACE(testing::Message() << "head " << head << ", keep " << keep);
      std::vector<int32_t> b = a;
      for (int64_t t = keep; t < kVerify; ++t) b[size_t(t)] = int32_t((a[size_t(t)] + 1 + t) % V);
      for (int sq = 0; sq < 3; ++sq) {
        gpu.reset(sq);
        prefill(gpu, sq, h);
      }
      gpu.forward_rows(0, a, verify_options());
      gpu.truncate_seq(0, head + std::min<int64_t>(keep + 1, kVerify));
      gpu.truncate_seq(0, head + keep);
      gpu.forward_rows(1, b, verify_options());
      gpu.truncate_seq(1, head + keep);
      decode(gpu, 2, std::span<const int32_t>(a).first(size_t(keep)));
      for (int sq = 0; sq < 3; ++sq) ASSERT_EQ(gpu.position(sq), head + keep);
      const std::vector<float> l0 = decode(gpu, 0, tail), l1 = decode(gpu, 1, tail), l2 = decode(gpu, 2, tail);
      ASSERT_EQ(l0.size(), l1.size());
      ASSERT_EQ(l0.size(), l2.size());
      // A slot left unrestored moves these logits by some 1e-2: the errors
      // say which way a failure went.
      const bool same_rejected = std::memcmp(l0.data(), l1.data(), l0.size() * sizeof(float)) == 0;
      const bool same_fresh = std::memcmp(l0.data(), l2.data(), l0.size() * sizeof(float)) == 0;
      EXPECT_TRUE(same_rejected) << "the kept prefix's continuation depends on the rejected tokens: "
                                 << rel_err(l1, l0);
      EXPECT_TRUE(same_fresh) << "a cut continues unlike a run without the rejected tokens: " << rel_err(l2, l0);
      exact += same_rejected;
      fresh_exact += same_fresh;
    }
  }
  std::printf("cut back: %d of %zu continuations bit-exact against the other rejected tokens, %d against a run "
              "without them\n",
              exact, kHeads.size() * (kVerify + 1), fresh_exact);
}

// The CPU's refusals, word for word where the message matters.
TEST(CudaDs4Spec, RefusesCutsItCannotMake) {
  BATON_REQUIRE_CUDA();
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", 11));
  CudaDs4Stage s(f, spec_config(2, false));
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  s.forward(0, std::span<const int32_t>(t.data(), 10));
  EXPECT_THROW(s.truncate_seq(0, 5), std::invalid_argument);  // no checkpointed forward
  EXPECT_THROW(s.truncate(0, 5), std::invalid_argument);      // the plain cut refuses too
  EXPECT_THROW(s.truncate_seq(0, 11), std::out_of_range);
  s.truncate_seq(0, 10);  // nothing to do
  s.forward_rows(0, std::span<const int32_t>(t.data(), 4), verify_options());  // positions 10..13
  EXPECT_THROW(s.truncate_seq(0, 9), std::invalid_argument);                   // before the checkpoint
  s.forward(1, std::span<const int32_t>(t.data(), 3));
  EXPECT_THROW(s.truncate_seq(1, 1), std::invalid_argument);  // the checkpoint is seq 0's
  s.truncate_seq(0, 12);
  s.truncate_seq(0, 11);                               // further back inside the same checkpoint
  s.forward(0, std::span<const int32_t>(t.data(), 1));  // moves past it (the decode graph)
  try {
    s.truncate_seq(0, 11);
    ADD_FAILURE() << "a cut after a later forward was allowed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("can keep 12 or 0"), std::string::npos) << e.what();
  }
  s.truncate_seq(0, 0);
  EXPECT_EQ(s.position(0), 0);
  EXPECT_THROW(s.forward_rows(0, std::span<const int32_t>(t.data(), 7), verify_options()), std::invalid_argument);
  ForwardOptions cap;
  cap.capture = true;  // planned without capture layers
  EXPECT_THROW(s.forward_rows(0, std::span<const int32_t>(t.data(), 2), cap), std::invalid_argument);
}

// Plain greedy decoding: the prompt in chunks, then one token per forward,
// each the argmax of the last logits (lowest id on ties). margins (when
// given) gets each token's top-1 margin over its row's max |logit|.
std::vector<int32_t> plain_greedy(StageRunner& s, const std::vector<int32_t>& p, int n,
                                  std::vector<double>* margins = nullptr) {
  s.reset(0);
  std::vector<float> logits = prefill(s, 0, p);
  std::vector<int32_t> out;
  for (int k = 0; k < n; ++k) {
    out.push_back(argmax(logits));
    if (margins) {
      std::vector<float> top = logits;
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      double scale = 0;
      for (float v : logits) scale = std::max(scale, std::fabs(double(v)));
      margins->push_back(scale > 0 ? (double(top[0]) - double(top[1])) / scale : 0.0);
    }
    if (k + 1 < n) {
      const auto l = s.forward(0, std::span<const int32_t>(&out.back(), 1));
      logits.assign(l.begin(), l.end());
    }
  }
  return out;
}

SpecResult spec_greedy(StageRunner& s, const std::vector<int32_t>& p, DraftSource& d, int max_draft, int n) {
  s.reset(0);
  SamplerParams sp;
  sp.temperature = 0;
  Sampler sampler(sp, int32_t(s.n_vocab()));
  SpecOptions o;
  o.max_draft = max_draft;
  o.n_predict = n;
  return speculative_generate(s, 0, p, sampler, d, o);
}

// Every forced mode and draft lengths 1, 3, 5 (Prefix: 5) against `want`;
// the KV ends where plain decoding leaves it.
void expect_drafted_equals(StageRunner& s, const std::vector<int32_t>& p, const std::vector<int32_t>& want,
                           uint64_t seed) {
  const int n = int(want.size());
  for (Mode mode : {Mode::Accept, Mode::Reject, Mode::Prefix}) {
    for (int L : {1, 3, 5}) {
      if (mode == Mode::Prefix && L != 5) continue;
      SCOPED_TRACE(testing::Message() << "mode " << int(mode) << ", drafts of " << L);
      ForcedDraft d(mode, int64_t(p.size()), want, int32_t(s.n_vocab()), seed + uint64_t(L));
      SpecResult r;
      ASSERT_NO_THROW(r = spec_greedy(s, p, d, L, n)) << "the drafted run left the plain continuation";
      ASSERT_EQ(r.tokens, want);
      EXPECT_EQ(s.position(0), int64_t(p.size()) + n - 1);
      EXPECT_EQ(d.committed_positions(), s.position(0));
      if (mode == Mode::Accept) {
        EXPECT_EQ(r.stats.accepted, r.stats.drafted);
      }
      if (mode == Mode::Reject) {
        EXPECT_EQ(r.stats.accepted, 0);
      }
    }
  }
}

// (c) deepseek4-micro F32, forwards of at most 8 rows (the float matvecs
// and pair experts, no F16 GEMM): the CUDA plain greedy tokens equal the
// CPU's, and the drafted runs equal them in every forced mode. Prompts of 5,
// 61 and 99 tokens and 48 generated: past position 127 (the ratio-128
// row) and across many wraps of the 16-row window.
TEST(CudaDs4Spec, ForcedDraftGreedyEqualsPlainAndCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(test::write_ds4(dir, "deepseek4-micro", "f32", seed));
  StageConfig c = spec_config(1, false);
  c.n_ctx = 320;
  c.max_batch = 8;
  auto gpu = make_stage_runner(Backend::Cuda, f, c);
  auto cpu = make_stage_runner(Backend::Cpu, f, c);
  ASSERT_EQ(gpu->backend(), Backend::Cuda);
  for (size_t len : {5, 61, 99}) {
    SCOPED_TRACE(testing::Message() << "prompt of " << len);
    const auto p = random_tokens(seed + len, len, gpu->n_vocab());
    const std::vector<int32_t> want = plain_greedy(*cpu, p, 48);
    ASSERT_EQ(plain_greedy(*gpu, p, 48), want) << "CUDA plain greedy vs CPU";
    expect_drafted_equals(*gpu, p, want, seed + len);
  }
}

// (c) on deepseek4-tiny Q2: the drafted runs equal the CUDA plain greedy
// tokens, all 16 of each prompt, in every forced mode (row invariance: a
// near-tie falls the same way in both); the CPU's equal them over the
// leading tokens whose plain margin is clear on both backends.
TEST(CudaDs4Spec, ForcedDraftGreedyOnTinyEqualsPlain) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", seed));
  auto gpu = make_stage_runner(Backend::Cuda, f, spec_config(1, false));
  auto cpu = make_stage_runner(Backend::Cpu, f, spec_config(1, false));
  int vs_cpu = 0;
  // Eight prompts crossing the ratio-4 window ends, the window's wraps and
  // the ratio-128 row at 127.
  for (size_t len : {30, 45, 60, 75, 91, 105, 120, 135}) {
    SCOPED_TRACE(testing::Message() << "prompt of " << len);
    const auto p = random_tokens(seed + 3 * len, len, gpu->n_vocab());
    std::vector<double> gm, cm;
    const std::vector<int32_t> g = plain_greedy(*gpu, p, 16, &gm);
    const std::vector<int32_t> c = plain_greedy(*cpu, p, 16, &cm);
    expect_drafted_equals(*gpu, p, g, seed + len);
    // The leading tokens whose margins are clear on both backends (token 0
    // comes from the prompt's logits).
    size_t n = 0;
    while (n < g.size() && cm[n] > 2 * kDecodeTol && (n == 0 || gm[n] > 2 * kDecodeTol)) ++n;
    EXPECT_EQ(std::vector<int32_t>(c.begin(), c.begin() + std::ptrdiff_t(n)),
              std::vector<int32_t>(g.begin(), g.begin() + std::ptrdiff_t(n)))
        << "CUDA plain greedy vs CPU";
    vs_cpu += int(n);
  }
  std::printf("tiny: 128 drafted tokens against CUDA plain, %d leading tokens with clear margins against the CPU\n",
              vs_cpu);
}

// (d) Captured rows of the prompt's chunks and of a verify forward against
// the CPU's, row by row (each token's capture-layer row of n_embd floats).
TEST(CudaDs4Spec, CapturedRowsMatchCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  const GgufFile f = GgufFile::open(write_tiny(dir, "q2", seed));
  CudaDs4Stage gpu(f, spec_config(1, true));
  Stage cpu(f, spec_config(1, true));
  const int64_t E = gpu.arch().dims().n_embd, nc = int64_t(kCapture.size());
  const auto p = random_tokens(seed + 5, 150, gpu.n_vocab());
  RowErrors err;
  auto compare = [&](std::span<const int32_t> t, const ForwardOptions& o) {
    const ForwardRows g = gpu.forward_rows(0, t, o);
    const std::vector<float> gh(g.hidden.begin(), g.hidden.end());
    const ForwardRows c = cpu.forward_rows(0, t, o);
    ASSERT_EQ(gh.size(), t.size() * size_t(nc * E));
    ASSERT_EQ(c.hidden.size(), gh.size());
    for (size_t r = 0; r < t.size() * size_t(nc); ++r) {
      err.add(rel_err(std::span<const float>(gh).subspan(r * size_t(E), size_t(E)),
                      c.hidden.subspan(r * size_t(E), size_t(E))));
    }
  };
  ForwardOptions prompt;
  prompt.capture = true;
  for (size_t at = 0; at < p.size(); at += 64) {
    compare(std::span<const int32_t>(p).subspan(at, std::min<size_t>(64, p.size() - at)), prompt);
  }
  ForwardOptions verify = verify_options();
  verify.capture = true;
  const auto block = random_tokens(seed + 6, kVerify, gpu.n_vocab());
  compare(block, verify);
  gpu.truncate_seq(0, int64_t(p.size()) + 2);
  cpu.truncate_seq(0, int64_t(p.size()) + 2);
  compare(std::span<const int32_t>(block).first(1), prompt);  // one row, queued (not the graph)
  err.report("captured rows vs CPU");
  EXPECT_LT(err.quantile(0.5), kTypical);
  EXPECT_LE(err.over(kOutlier), kOutlierShare);
}

}  // namespace
}  // namespace baton
