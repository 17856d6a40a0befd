// The per-node memory plan: llama-family numbers equal Stage::plan's, the
// DeepSeek V4 tensor table and KV formulas against the published figures,
// plan lines for stages of a synthetic deepseek4 file, and refusals.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "engine/model/registry.h"
#include "engine/runtime/backend.h"
#include "engine/model/deepseek4_shape.h"
#include "engine/gguf/file.h"
#include "engine/runtime/kv_cache.h"
#include "engine/plan/node_plan.h"
#include "engine/sampling/sampler.h"
#include "engine/runtime/stage.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

constexpr double kGiB = double(uint64_t(1) << 30);
constexpr uint64_t kMiB = uint64_t(1) << 20;

uint64_t spec_bytes(const Ds4TensorSpec& s, const Ds4Types& t) {
  uint64_t n = 1;
  for (int64_t d : s.shape) n *= uint64_t(d);
  return *dtype_bytes(t.of(s.role), n);
}

uint64_t model_bytes(const Deepseek4Shape& s, const Ds4Types& t) {
  uint64_t total = 0;
  for (const auto& spec : s.embedding_tensors()) total += spec_bytes(spec, t);
  for (const auto& spec : s.head_tensors()) total += spec_bytes(spec, t);
  for (int l = 0; l < s.n_layer; ++l) {
    for (const auto& spec : s.layer_tensors(l)) total += spec_bytes(spec, t);
  }
  return total;
}

uint64_t expert_bytes(const Deepseek4Shape& s, const Ds4Types& t, int layer) {
  uint64_t total = 0;
  for (const auto& spec : s.layer_tensors(layer)) {
    if (spec.role == Ds4Role::ExpertGateUp || spec.role == Ds4Role::ExpertDown) total += spec_bytes(spec, t);
  }
  return total;
}

TEST(Deepseek4Shape, FlashTensorTableMatchesThePublishedFiles) {
  const Deepseek4Shape flash = Deepseek4Shape::flash();
  // Experts: 43 x 1728 MiB in the Q2 file, 43 x 3456 MiB in the Q4 file.
  for (int l = 0; l < flash.n_layer; ++l) {
    EXPECT_EQ(expert_bytes(flash, Ds4Types::q2(), l), 1728 * kMiB) << "layer " << l;
    EXPECT_EQ(expert_bytes(flash, Ds4Types::q4(), l), 3456 * kMiB) << "layer " << l;
  }
  EXPECT_NEAR(double(model_bytes(flash, Ds4Types::q2())) / kGiB, 80.76, 0.005);
  const double q4 = double(model_bytes(flash, Ds4Types::q4())) / kGiB;
  EXPECT_GT(q4, 152.5);
  EXPECT_LT(q4, 153.5);
  // Layer kinds of Flash: sliding 0-1, ratio 4 (indexer) on even >= 2, ratio 128 on odd >= 3; hash 0-2.
  auto has = [&](int layer, const std::string& suffix) {
    for (const auto& s : flash.layer_tensors(layer)) {
      if (s.name == "blk." + std::to_string(layer) + "." + suffix) return true;
    }
    return false;
  };
  EXPECT_FALSE(has(1, "attn_compressor_kv.weight"));
  EXPECT_TRUE(has(2, "indexer.attn_q_b.weight"));
  EXPECT_TRUE(has(2, "ffn_gate_tid2eid.weight"));
  EXPECT_FALSE(has(3, "indexer.attn_q_b.weight"));
  EXPECT_TRUE(has(3, "attn_compressor_kv.weight"));
  EXPECT_FALSE(has(3, "ffn_gate_tid2eid.weight"));
  EXPECT_TRUE(has(42, "indexer_compressor_norm.weight"));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& s : flash.layer_tensors(4)) shapes[s.name] = s.shape;
  EXPECT_EQ(shapes["blk.4.attn_compressor_ape.weight"], (std::vector<int64_t>{1024, 4}));
  EXPECT_EQ(shapes["blk.4.attn_output_a.weight"], (std::vector<int64_t>{4096, 8192}));
  EXPECT_EQ(shapes["blk.4.hc_attn_fn.weight"], (std::vector<int64_t>{16384, 24}));
  EXPECT_EQ(shapes["blk.4.ffn_down_exps.weight"], (std::vector<int64_t>{2048, 4096, 256}));
}

TEST(Deepseek4Shape, KvPerTokenMatchesThePublishedFigure) {
  const Deepseek4Shape flash = Deepseek4Shape::flash();
  double f32 = 0, packed = 0;
  for (int l = 0; l < flash.n_layer; ++l) {
    f32 += flash.kv_bytes_per_token(l, Ds4KvStorage::F32);
    packed += flash.kv_bytes_per_token(l, Ds4KvStorage::Packed);
  }
  // 21 ratio-4 layers x (2048 + 512) / 4 + 20 ratio-128 layers x 2048 / 128.
  EXPECT_DOUBLE_EQ(f32, 13760.0);
  EXPECT_NEAR(f32 / 1024, 13.4, 0.05);  // "about 13.4 KiB per token"
  // Packed: (448 FP8 + 7 scales + 128 bf16) per KV row, (64 FP4 + 4 scales) per index row.
  EXPECT_DOUBLE_EQ(packed, 21 * (583.0 + 68.0) / 4 + 20 * 583.0 / 128);
  uint64_t at_1m = 0;
  for (int l = 0; l < flash.n_layer; ++l) at_1m += flash.kv_bytes(l, 1 << 20, Ds4KvStorage::F32);
  EXPECT_NEAR(double(at_1m) / kGiB, 13.44, 0.05);  // "1M tokens is ~13 GiB"

  // The window is fixed: a sliding-only layer costs the same at any context past it.
  EXPECT_EQ(flash.kv_bytes(0, 128, Ds4KvStorage::F32), flash.kv_bytes(0, 1 << 20, Ds4KvStorage::F32));
  EXPECT_EQ(flash.kv_bytes(0, 128, Ds4KvStorage::F32), 128u * 2048u);
  EXPECT_LT(flash.kv_bytes(0, 16, Ds4KvStorage::F32), flash.kv_bytes(0, 128, Ds4KvStorage::F32));
  // Compressed rows: 4096 more tokens add 4096/4 KV and index rows (ratio 4), 4096/128 rows (ratio 128).
  EXPECT_EQ(flash.kv_bytes(2, 8192, Ds4KvStorage::F32) - flash.kv_bytes(2, 4096, Ds4KvStorage::F32),
            1024u * (2048u + 512u));
  EXPECT_EQ(flash.kv_bytes(3, 8192, Ds4KvStorage::F32) - flash.kv_bytes(3, 4096, Ds4KvStorage::F32), 32u * 2048u);
}

TEST(Deepseek4Shape, KeysRoundTripThroughAFile) {
  test::TempDir dir;
  Deepseek4Shape tiny = Deepseek4Shape::tiny();
  tiny.n_vocab = 300;
  GgufWriter w;
  tiny.write_keys(w);
  w.write(dir.file("keys.gguf"));
  const Deepseek4Shape back = Deepseek4Shape::from_gguf(GgufFile::open(dir.file("keys.gguf")));
  EXPECT_EQ(back.n_layer, tiny.n_layer);
  EXPECT_EQ(back.n_embd, tiny.n_embd);
  EXPECT_EQ(back.n_vocab, 300);
  EXPECT_EQ(back.compress_ratios, tiny.compress_ratios);
  EXPECT_EQ(back.swiglu_clamp, tiny.swiglu_clamp);
  EXPECT_EQ(back.idx_top_k, tiny.idx_top_k);
  EXPECT_EQ(back.n_hash_layers, tiny.n_hash_layers);
  EXPECT_EQ(back.o_groups, tiny.o_groups);
  EXPECT_EQ(back.n_ff_exp, tiny.n_ff_exp);
  EXPECT_EQ(back.yarn_orig_ctx, tiny.yarn_orig_ctx);
  EXPECT_FLOAT_EQ(float(back.compress_rope_base), float(tiny.compress_rope_base));
  EXPECT_EQ(back.describe(), tiny.describe());

  // A ratio list of the wrong length is refused by name.
  GgufWriter bad;
  tiny.write_keys(bad);
  bad.set("deepseek4.attention.compress_ratios",
          GgufValue::of_array(GgufType::UINT32, {GgufValue::of_u32(0), GgufValue::of_u32(4)}));
  bad.write(dir.file("bad.gguf"));
  try {
    Deepseek4Shape::from_gguf(GgufFile::open(dir.file("bad.gguf")));
    FAIL() << "a short compress_ratios was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("compress_ratios"), std::string::npos) << e.what();
  }
}

TEST(NodePlan, LlamaNumbersEqualStagePlan) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  ModelPlanner planner(f);
  ASSERT_EQ(planner.n_layer(), 5);
  Rng rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng.uniform() * double(hi - lo + 1)); };
  for (int trial = 0; trial < 40; ++trial) {
    StageRequest r;
    const int a = int(pick(0, 4));
    r.layers = {a, int(pick(a, 4))};
    r.embedding = trial == 0 || rng.uniform() < 0.5;
    r.head = trial == 0 || rng.uniform() < 0.5;
    r.n_ctx = pick(1, 4096);
    r.micro_batch = pick(1, 8);
    r.prefill_chunk = pick(1, 512);
    r.n_seq = int(pick(1, 3));
    r.n_threads = int(pick(1, 4));
    SCOPED_TRACE(fmt::format("trial {}: layers {}-{} emb {} head {} ctx {} mb {} chunk {} seq {} threads {}", trial,
                             r.layers.first, r.layers.last, r.embedding, r.head, r.n_ctx, r.micro_batch,
                             r.prefill_chunk, r.n_seq, r.n_threads));
    const MemoryPlan stage = Stage::plan(f, stage_config(r));
    const MemoryPlan plan = planner.plan(r);
    for (PlanLine line : {PlanLine::Weights, PlanLine::KvCache, PlanLine::Workspace}) {
      EXPECT_EQ(plan.bytes(line), stage.bytes(line)) << plan_line_name(line);
      EXPECT_GT(plan.bytes(line), 0u) << plan_line_name(line);
    }
    const uint64_t link = align_up(uint64_t(r.rows()) * 64 * 4);
    EXPECT_EQ(plan.bytes(PlanLine::LinkBuffers), uint64_t((r.embedding ? 0 : 2) + (r.head ? 0 : 2)) * link);
    EXPECT_EQ(plan.bytes(PlanLine::Backend), 0u);
    EXPECT_EQ(plan.bytes(PlanLine::OptionalCaches), 0u);
    EXPECT_EQ(planner.bytes(r).total(), plan.total());
  }
  // The line order is the plan's contract.
  StageRequest whole{{0, 4}};
  whole.backend = Backend::Cuda;
  whole.optional_caches = 12345;
  const MemoryPlan p = planner.plan(whole);
  std::vector<std::string> names;
  for (const auto& l : p.lines()) names.push_back(l.name());
  EXPECT_EQ(names, (std::vector<std::string>{"weights", "kv cache", "workspace", "link buffers", "backend",
                                             "load staging", "optional caches"}));
  EXPECT_EQ(p.bytes(PlanLine::Backend), kCudaContextBytes);
  EXPECT_EQ(p.bytes(PlanLine::LoadStaging), 0u);  // host memory beside a discrete device
  StageRequest unified = whole;
  unified.unified = true;
  EXPECT_EQ(planner.plan(unified).bytes(PlanLine::LoadStaging), uint64_t(4 * 64) << 20);
  EXPECT_EQ(p.bytes(PlanLine::OptionalCaches), 12345u);
  EXPECT_EQ(plan_stage(f, whole).total(), p.total());
}

TEST(NodePlan, Deepseek4StagesFromASyntheticFile) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthOptions o;
  o.shape = "deepseek4-tiny";
  o.seed = seed;
  write_synth_model(dir.file("tiny.gguf"), o);
  const GgufFile f = GgufFile::open(dir.file("tiny.gguf"));
  ModelPlanner planner(f);
  const Deepseek4Shape shape = Deepseek4Shape::from_gguf(f);
  ASSERT_EQ(planner.n_layer(), 5);

  uint64_t all = 0;
  for (const auto& t : f.tensors()) all += align_up(t.nbytes);
  StageRequest whole{{0, 4}};
  whole.n_ctx = 1000;
  whole.prefill_chunk = 64;
  EXPECT_EQ(planner.plan(whole).bytes(PlanLine::Weights), all);
  // Two stages hold every tensor exactly once (no tensor outside the layers,
  // embedding and head in this model).
  Rng rng(seed);
  const int cut = 1 + int(rng.uniform() * 4);  // stage 1: [0, cut-1], stage 2: [cut, 4]
  SCOPED_TRACE("cut " + std::to_string(cut));
  StageRequest first = whole, second = whole;
  first.layers = {0, cut - 1};
  first.head = false;
  second.layers = {cut, 4};
  second.embedding = false;
  const MemoryPlan p1 = planner.plan(first), p2 = planner.plan(second);
  EXPECT_EQ(p1.bytes(PlanLine::Weights) + p2.bytes(PlanLine::Weights), all);
  uint64_t kv1 = 0, kv2 = 0;
  for (int l = 0; l < 5; ++l) (l < cut ? kv1 : kv2) += shape.kv_bytes(l, 1000, Ds4KvStorage::F32);
  EXPECT_EQ(p1.bytes(PlanLine::KvCache), kv1);
  EXPECT_EQ(p2.bytes(PlanLine::KvCache), kv2);
  EXPECT_EQ(planner.plan(whole).bytes(PlanLine::KvCache), kv1 + kv2);
  // What crosses the cut is the HC state (4 x 256 floats per token), both ways double-buffered.
  const uint64_t link = 2 * align_up(64 * 4 * 256 * 4);
  EXPECT_EQ(p1.bytes(PlanLine::LinkBuffers), link);
  EXPECT_EQ(p2.bytes(PlanLine::LinkBuffers), link);
  EXPECT_EQ(planner.plan(whole).bytes(PlanLine::LinkBuffers), 0u);
  // Sequences multiply the cache.
  StageRequest two = whole;
  two.n_seq = 2;
  EXPECT_EQ(planner.plan(two).bytes(PlanLine::KvCache), 2 * (kv1 + kv2));

  // The indexer's score matrix grows the workspace with the context, only on
  // ranges that hold an indexed layer (2 and 4 here).
  auto workspace = [&](LayerRange layers, int64_t ctx) {
    StageRequest r = whole;
    r.layers = layers;
    r.head = false;
    r.n_ctx = ctx;
    return planner.plan(r).bytes(PlanLine::Workspace);
  };
  EXPECT_EQ(workspace({0, 1}, 4096), workspace({0, 1}, 8192));
  EXPECT_GE(workspace({2, 2}, 8192) - workspace({2, 2}, 4096), 64u * 1024u * 4u);
  // The head's logits are in the workspace.
  StageRequest head_only = second;
  StageRequest no_head = second;
  no_head.head = false;
  EXPECT_GE(planner.plan(head_only).bytes(PlanLine::Workspace), planner.plan(no_head).bytes(PlanLine::Workspace));
  // Packed KV storage is smaller.
  StageRequest packed = whole;
  packed.ds4_kv = Ds4KvStorage::Packed;
  EXPECT_LT(planner.plan(packed).bytes(PlanLine::KvCache), planner.plan(whole).bytes(PlanLine::KvCache));
}

TEST(NodePlan, Refusals) {
  const GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  ModelPlanner planner(f);
  StageRequest r{{3, 7}};
  EXPECT_THROW(planner.plan(r), std::invalid_argument);
  r.layers = {0, 4};
  r.n_ctx = 0;
  EXPECT_THROW(planner.plan(r), std::invalid_argument);
  r.n_ctx = 16;
  r.prefill_chunk = 0;
  EXPECT_THROW(planner.plan(r), std::invalid_argument);

  const GgufFile gpt2 = GgufFile::open(test::shared_dir() + "/models/vocab/ggml-vocab-gpt-2.gguf");
  try {
    ModelPlanner p(gpt2);
    FAIL() << "gpt2 was planned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'gpt2'"), std::string::npos) << e.what();
  }
}

// One registry: the forward, the planner and the error messages list the same
// architectures, in the same order.
TEST(NodePlan, OneRegistryOfArchitectures) {
  const std::vector<std::string> names = {"llama", "qwen2", "qwen3", "deepseek4"};
  EXPECT_EQ(Arch::known(), names);
  EXPECT_EQ(ModelPlanner::known(), names);
  EXPECT_EQ(arch_names(), "llama, qwen2, qwen3, deepseek4");
  for (const std::string& n : names) {
    const ArchEntry* e = find_arch(n);
    ASSERT_NE(e, nullptr) << n;
    EXPECT_EQ(e->name, n);
#ifdef BATON_HAVE_CUDA
    ASSERT_NE(e->cuda, nullptr) << n;
    EXPECT_EQ(e->cuda->plans_workspace, n != "deepseek4") << n;
#else
    EXPECT_EQ(e->cuda, nullptr) << n;
#endif
  }
  EXPECT_EQ(find_arch("gpt2"), nullptr);
}

// A line grows by kind; whether it is host memory is its kind's property,
// which the device memory cap reads.
TEST(NodePlan, PlanLinesByKind) {
  MemoryPlan p;
  p.add(PlanLine::Weights, 100, "a");
  p.add(PlanLine::PinnedIo, 10);
  p.add(PlanLine::LoadStaging, 1000);
  p.add(PlanLine::Workspace, 5);
  p.add(PlanLine::Weights, 1, "b");
  ASSERT_EQ(p.lines().size(), 4u);
  EXPECT_EQ(std::string(p.lines()[0].name()), "weights");
  EXPECT_EQ(p.lines()[0].detail, "a; b");
  EXPECT_EQ(p.bytes(PlanLine::Weights), 101u);
  EXPECT_EQ(p.bytes(PlanLine::KvCache), 0u);
  EXPECT_EQ(std::string(p.lines()[1].name()), "pinned io");
  EXPECT_EQ(std::string(p.lines()[2].name()), "load staging");
  EXPECT_TRUE(plan_line_is_host(PlanLine::PinnedIo));
  EXPECT_TRUE(plan_line_is_host(PlanLine::LoadStaging));
  EXPECT_FALSE(plan_line_is_host(PlanLine::Workspace));
  EXPECT_EQ(plan_bytes_under_limit(Backend::Cuda, p), 106u);
  EXPECT_EQ(plan_bytes_under_limit(Backend::Cpu, p), 1116u);
  EXPECT_EQ(memory_limit_problem(Backend::Cuda, p, 106), "");
  EXPECT_NE(memory_limit_problem(Backend::Cuda, p, 105), "");
}

TEST(NodePlan, NodeUsableMemory) {
  NodeSpec spark{"spark", 128000000000ull, true, std::nullopt, 0, Backend::Cuda};
  EXPECT_EQ(spark.usable_bytes(), 128000000000ull - kDefaultUnifiedReserve);
  EXPECT_DOUBLE_EQ(spark.effective_bandwidth(), kUnifiedBandwidth);
  spark.reserve_bytes = 1ull << 30;
  EXPECT_EQ(spark.usable_bytes(), 128000000000ull - (1ull << 30));
  NodeSpec rtx{"rtx", 97887ull << 20, false, std::nullopt, 0, Backend::Cuda};
  EXPECT_EQ(rtx.usable_bytes(), 97887ull << 20);
  EXPECT_DOUBLE_EQ(rtx.effective_bandwidth(), kDiscreteBandwidth);
  rtx.reserve_bytes = 100ull << 30;  // more than it has
  EXPECT_EQ(rtx.usable_bytes(), 0u);
}

}  // namespace
}  // namespace baton
