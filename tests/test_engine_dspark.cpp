// The DSpark drafter: its tensor table, loading (sidecar and in-model, with
// refusals that name the tensor), and the CPU draft network against the
// float64 reference tests/dspark_reference.py (run with python3) on a small
// synthesized drafter with F32 weights.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "engine/dspark/dspark_device.h"
#include "engine/dspark/dspark_drafter.h"
#include "engine/dspark/dspark_shape.h"
#include "engine/dspark/dspark_source.h"
#include "engine/dspark/dspark_weights.h"
#include "engine/gguf/file.h"
#include "engine/runtime/stage.h"
#include "gguf_split/synth.h"
#include "tests/dspark_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

// A target small enough for the pure-Python reference, with every part the
// drafter uses: 2 heads of 144 (64 FP8 dims + 64 more, 16 RoPE dims), grouped
// output, 4 experts (top 2) + a shared one, a window of 8.
Deepseek4Shape small_target() {
  Deepseek4Shape s = Deepseek4Shape::tiny();
  s.n_layer = 4;
  s.n_embd = 64;
  s.n_vocab = 48;
  s.n_head = 2;
  s.head_dim = 144;
  s.rope_dim = 16;
  s.q_lora_rank = 32;
  s.o_lora_rank = 32;
  s.o_groups = 2;
  s.n_expert = 4;
  s.n_expert_used = 2;
  s.n_expert_shared = 1;
  s.n_ff_exp = 64;
  s.n_hash_layers = 0;
  s.sliding_window = 8;
  s.compress_ratios.assign(4, 0);
  s.swiglu_clamp.assign(4, 10.0f);
  s.yarn_factor = 1;
  s.yarn_orig_ctx = 0;
  return s;
}

DsparkShape small_drafter() {
  DsparkShape d = DsparkShape::for_target(small_target());
  d.markov_rank = 8;
  return d;
}

nlohmann::json reference(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/env", "python3", test::source_path("tests/dspark_reference.py")};
  argv.insert(argv.end(), args.begin(), args.end());
  const test::CommandResult r = test::run_command(argv);
  if (r.exit_code != 0) {
    throw std::runtime_error("tests/dspark_reference.py failed (python3 is required): " + r.err);
  }
  return nlohmann::json::parse(r.out);
}

struct Rig {
  test::TempDir dir;
  DsparkShape shape = small_drafter();
  std::string file = dir.file("drafter.gguf");
  std::unique_ptr<GgufFile> f;
  std::unique_ptr<DsparkWeights> w;
  ThreadPool pool{2};
  std::unique_ptr<DsparkDrafter> drafter;

  explicit Rig(uint64_t seed) {
    write_dspark_file(file, shape, test::ds4_all_f32(), seed, true);
    f = std::make_unique<GgufFile>(GgufFile::open(file));
    w = std::make_unique<DsparkWeights>(*f, shape, std::vector<std::string>{"token_embd.weight", "output.weight"});
    drafter = std::make_unique<DsparkDrafter>(*w, w->get("token_embd.weight"), w->get("output.weight"), pool);
  }
  void append(const std::vector<float>& rows) {
    const int64_t n = int64_t(rows.size()) / shape.feature_width();
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = drafter->n_context() + i;
    drafter->append_context(rows.data(), pos.data(), n);
  }
};

// A GPU drafter CUDA places by default gives way under --mem-limit only
// where it alone tips the plan over; a plan that does not fit without it is
// refused by its own check, and a limit that holds both keeps it.
TEST(DsparkDeviceRoom, DrafterGivesWayOnlyWhereItTipsTheLimit) {
  MemoryPlan without;
  without.add(PlanLine::Weights, 1000);
  MemoryPlan with = without;
  with.add(PlanLine::Drafter, 200);
  EXPECT_EQ(dspark_limit_room(Backend::Cuda, without, with, 1200), "");
  EXPECT_EQ(dspark_limit_room(Backend::Cuda, without, with, 0), "");    // no limit
  EXPECT_EQ(dspark_limit_room(Backend::Cuda, without, with, 999), "");  // the plan's own refusal comes first
  EXPECT_NE(dspark_limit_room(Backend::Cuda, without, with, 1100).find("--mem-limit"), std::string::npos);
}

TEST(DsparkShapeTest, FlashTableHasTheSidecarsTensors) {
  const DsparkShape d = DsparkShape::for_target(Deepseek4Shape::flash());
  const auto t = d.tensors();
  EXPECT_EQ(t.size(), 81u);
  auto shape_of = [&](const std::string& name) {
    for (const auto& s : t) {
      if (s.name == name) return s.shape;
    }
    ADD_FAILURE() << "no tensor " << name;
    return std::vector<int64_t>{};
  };
  EXPECT_EQ(shape_of("mtp.0.main_proj.weight"), (std::vector<int64_t>{12288, 4096}));
  EXPECT_EQ(shape_of("mtp.1.attn_kv.weight"), (std::vector<int64_t>{4096, 512}));
  EXPECT_EQ(shape_of("mtp.2.ffn_gate_exps.weight"), (std::vector<int64_t>{4096, 2048, 256}));
  EXPECT_EQ(shape_of("mtp.2.hc_head_fn.weight"), (std::vector<int64_t>{16384, 4}));
  EXPECT_EQ(shape_of("mtp.2.markov_head.markov_w2.weight"), (std::vector<int64_t>{256, 129280}));
  EXPECT_EQ(shape_of("mtp.2.confidence_head.proj.weight"), (std::vector<int64_t>{4352, 1}));
  EXPECT_EQ(d.target_layer_ids, (std::vector<int>{40, 41, 42}));
  EXPECT_EQ(d.noise_token_id, 128799);
  EXPECT_EQ(d.kv_bytes(), 3u * (128 + DsparkShape::kSpareRows) * 512 * 4);
  // A context's round buffers, planned per slot in serve: about 5.7 MiB,
  // most of it the round's 5 logit rows and the Markov bias.
  EXPECT_GT(d.round_bytes(), uint64_t(6 * 129280 * 4));
  EXPECT_LT(d.round_bytes(), uint64_t(7) << 20);
}

TEST(DsparkLoadTest, SidecarAndInModelLoadAndWrongFilesAreRefusedByName) {
  test::TempDir dir;
  // In the model file (keys deepseek4.dspark.*), then as a sidecar (dspark.*).
  SynthOptions o;
  o.shape = "deepseek4-tiny";
  o.dspark = true;
  o.data = SynthData::Alias;
  write_synth_model(dir.file("model.gguf"), o);
  o.data = SynthData::Sparse;  // header only: the model without a drafter
  o.draft_out = dir.file("side.gguf");
  write_synth_model(dir.file("plain.gguf"), o);
  const GgufFile model = GgufFile::open(dir.file("model.gguf"));
  const GgufFile plain = GgufFile::open(dir.file("plain.gguf"));
  const GgufFile side = GgufFile::open(dir.file("side.gguf"));
  const Deepseek4Shape target = Deepseek4Shape::from_gguf(model);
  auto in_model = dspark_shape_of(model, nullptr, target);
  ASSERT_TRUE(in_model);
  EXPECT_EQ(in_model->target_layer_ids, (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(DsparkWeights(model, *in_model).shape().n_stages, 3);
  EXPECT_FALSE(dspark_shape_of(plain, nullptr, target));
  auto sidecar = dspark_shape_of(plain, &side, target);
  ASSERT_TRUE(sidecar);
  const DsparkWeights w(side, *sidecar);
  EXPECT_NE(w.find("mtp.1.ffn_down_shexp.weight"), nullptr);
  EXPECT_THROW(dspark_shape_of(plain, &plain, target), std::runtime_error);  // no dspark keys

  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  DsparkShape wide = *sidecar;
  wide.markov_rank = 64;  // the file's Markov tables are rank 32
  EXPECT_NE(message([&] { DsparkWeights(side, wide); }).find("mtp.2.markov_head.markov_w1.weight has shape [32, "),
            std::string::npos);
  DsparkShape more = *sidecar;
  more.n_stages = 4;  // the file has stages 0-2
  const std::string missing = message([&] { DsparkWeights(side, more); });
  EXPECT_NE(missing.find("missing"), std::string::npos) << missing;
  EXPECT_NE(missing.find("mtp.3.attn_q_a.weight"), std::string::npos) << missing;
}

TEST(DsparkFp8Test, MatchesTheReference) {
  std::vector<float> v = {0.0f, 1.0f, -3.7f, 100.0f, 1e-3f, -0.0625f, 5.5f, 7e-5f, 448.0f, 12.345f};
  for (int i = 0; i < 70; ++i) v.push_back(float(std::sin(i * 1.7) * (i % 7 + 1) * 0.3));
  std::vector<std::string> args = {"fp8"};
  for (float x : v) args.push_back(fmt::format("{:.9g}", x));
  const nlohmann::json want = reference(args);
  dspark_fp8_round(v.data(), int64_t(v.size()), 64);
  ASSERT_EQ(want.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_DOUBLE_EQ(double(v[i]), want[i].get<double>()) << "value " << i;
}

TEST(DsparkDrafterTest, DraftLogitsMatchTheFloat64Reference) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(seed);
  Rig rig(seed);
  // 30 context rows: more than the ring (8 + spare) holds, so it wraps.
  const int64_t n = 30;
  const std::vector<float> rows = test::random_rows(n, rig.shape.feature_width(), seed + 1);
  rig.append(rows);
  const int32_t bonus = 7;
  const DsparkDraft got = rig.drafter->draft(bonus, n, 0.0f, 99);
  // Without logits the same draft, tokens and confidences only.
  rig.drafter->set_return_logits(false);
  const DsparkDraft bare = rig.drafter->draft(bonus, n, 0.0f, 99);
  rig.drafter->set_return_logits(true);
  EXPECT_TRUE(bare.logits.empty());
  EXPECT_EQ(bare.tokens, got.tokens);
  EXPECT_EQ(bare.confidence, got.confidence);
  // The plan's round bytes are what the drafter holds plus what a round
  // allocates: its logit rows, the Markov bias and the normed rows.
  const uint64_t nv = uint64_t(rig.shape.target.n_vocab), nb = uint64_t(rig.shape.block_size);
  const uint64_t ne = uint64_t(rig.shape.target.n_embd);
  EXPECT_EQ(rig.drafter->buffer_bytes() + (nb * nv + nv + nb * ne) * sizeof(float), rig.shape.round_bytes());
  {
    std::ofstream out(rig.dir.file("rows.f32"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(rows.data()), std::streamsize(rows.size() * sizeof(float)));
  }
  const nlohmann::json want = reference({"draft", rig.file, rig.dir.file("rows.f32"), "7", "0", "99"});
  ASSERT_EQ(got.tokens.size(), size_t(rig.shape.block_size));
  ASSERT_EQ(want["tokens"].size(), got.tokens.size());
  const int64_t V = rig.shape.target.n_vocab;
  double worst = 0, scale = 0;
  for (size_t r = 0; r < got.tokens.size(); ++r) {
    EXPECT_EQ(got.tokens[r], want["tokens"][r].get<int32_t>()) << "row " << r;
    EXPECT_NEAR(got.confidence[r], want["confidence"][r].get<double>(), 1e-4) << "row " << r;
    for (int64_t v = 0; v < V; ++v) {
      const double p = want["logits"][r][size_t(v)].get<double>();
      worst = std::max(worst, std::fabs(double(got.logits[r * size_t(V) + size_t(v)]) - p));
      scale = std::max(scale, std::fabs(p));
    }
  }
  std::printf("largest logit difference %.3g of logits up to %.3g\n", worst, scale);
  EXPECT_GT(scale, 0.1);  // not a comparison of zeros
  EXPECT_LT(worst, 5e-4 * scale) << "largest logit difference " << worst << " of logits up to " << scale;
}

TEST(DsparkDrafterTest, ConfidenceStopsTheDraftAndTruncateRollsBack) {
  Rig rig(test::test_seed() + 11);
  const std::vector<float> rows = test::random_rows(20, rig.shape.feature_width(), 5);
  rig.append(rows);
  const DsparkDraft all = rig.drafter->draft(3, 20, 0.0f, 99);
  ASSERT_EQ(all.tokens.size(), 5u);
  // A threshold just above c_2 stops before row 2 (rows 0 and 1 stay when
  // they pass it); one above every c keeps row 0 alone; max caps the rows.
  const float c2 = all.confidence[2];
  const DsparkDraft cut = rig.drafter->draft(3, 20, std::nextafter(c2, 2.0f), 99);
  size_t expect = 0;
  while (expect < 5 && (expect == 0 || all.confidence[expect] >= std::nextafter(c2, 2.0f))) ++expect;
  EXPECT_EQ(cut.tokens.size(), std::min<size_t>(expect, 5));
  EXPECT_EQ(rig.drafter->draft(3, 20, 2.0f, 99).tokens.size(), 1u);
  EXPECT_EQ(rig.drafter->draft(3, 20, 0.0f, 2).tokens.size(), 2u);
  for (size_t i = 0; i < cut.tokens.size(); ++i) EXPECT_EQ(cut.tokens[i], all.tokens[i]);

  // Three more rows, rolled back: the same draft as before them.
  rig.append(test::random_rows(3, rig.shape.feature_width(), 6));
  EXPECT_NE(rig.drafter->draft(3, 23, 0.0f, 99).logits, all.logits);
  rig.drafter->truncate(20);
  EXPECT_EQ(rig.drafter->draft(3, 20, 0.0f, 99).logits, all.logits);
  EXPECT_THROW(rig.drafter->truncate(20 - DsparkShape::kSpareRows - 1), std::invalid_argument);
  EXPECT_THROW(rig.drafter->draft(3, 19, 0.0f, 99), std::invalid_argument);  // not the next position
}

// Beside a target with no weights in host memory (a CUDA stage) the source
// reads its own copy of the target's embedding and head from the file; it
// drafts exactly as the source that shares a CPU stage's.
TEST(DsparkSourceTest, OwnCopyOfTheTargetEndsDraftsLikeTheShared) {
  test::TempDir dir;
  SynthOptions o;
  o.shape = "deepseek4-micro";
  o.dspark = true;
  o.seed = test::test_seed();
  write_synth_model(dir.file("m.gguf"), o);
  const GgufFile f = GgufFile::open(dir.file("m.gguf"));
  const std::optional<DsparkShape> shape = dspark_find(f, "");
  ASSERT_TRUE(shape);
  StageConfig c;
  c.n_ctx = 256;
  const Stage target(f, c);
  DsparkDraftSource shared(f, *shape, target.model(), 1, 0.0f);
  DsparkDraftSource own(f, *shape, f, 1, 0.0f);
  const uint64_t ends = DsparkDraftSource::target_ends_bytes(f);
  EXPECT_GT(ends, 0u);
  EXPECT_LT(ends, target.memory_plan().bytes(PlanLine::Weights));
  const int64_t n = 12;
  const std::vector<float> rows = test::random_rows(n, shape->feature_width(), 9);
  std::vector<int32_t> tokens(size_t(n), 7);
  for (DsparkDraftSource* s : {&shared, &own}) s->committed(tokens, 0, rows);
  const Draft a = shared.propose(5, n, 4), b = own.propose(5, n, 4);
  ASSERT_FALSE(a.tokens.empty());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.logits, b.logits);
}

}  // namespace
}  // namespace baton
