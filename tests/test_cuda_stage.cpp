// The CUDA stage against the CPU stage: logits after a prompt, greedy
// generation through the captured decode graph, prefill through cuBLAS, the
// pinned staging ring, device memory against the plan, and boundary rows
// passed between stages on the device. Plan-only tests run everywhere; the
// rest skip without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "engine/cuda/stages/llama.h"
#include "engine/gguf/file.h"
#include "engine/model/loader.h"
#include "engine/model/model.h"
#include "engine/runtime/stage.h"
#include "gguf_split/synth.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int32_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return t;
}

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

using test::rel_err;

std::string write_synth(const test::TempDir& dir, DType type, uint64_t seed, int n_layer = 2) {
  SynthConfig sc;
  sc.n_layer = n_layer;
  sc.n_embd = 256;  // a whole K-quant block per row
  sc.n_head = 4;
  sc.n_head_kv = 2;
  sc.n_ff = 512;
  sc.n_ctx = 512;
  sc.weight_type = type;
  sc.seed = seed;
  const std::string path =
      dir.file(std::string("synth-") + dtype_name(type) + "-" + std::to_string(n_layer) + "l.gguf");
  write_synthetic_model(path, sc);
  return path;
}

// Prompt logits and 100 greedy steps on both backends. Each step feeds
// the CPU's greedy id to both (teacher forcing) and compares the device's own
// greedy id (graph replay, argmax on the device) with the CPU's. With
// tie_tol = 0 they must be equal; Q8_0 and Q4_K decode through the
// integer-dot matvec, whose 16-bit activations move the logits by about 1e-4
// of their scale (docs/CUDA.md), so there the device may pick another id only
// where the CPU's own logits of the two ids are within tie_tol of each other.
void expect_same_generation(const std::string& path, const std::vector<int32_t>& prompt, double logit_tol,
                            double tie_tol = 0.0) {
  GgufFile f = GgufFile::open(path);
  StageConfig sc;
  sc.n_ctx = 160;
  sc.max_batch = 8;
  sc.n_threads = 2;
  Stage cpu(f, sc);
  CudaStage gpu(f, sc);

  auto lc = cpu.forward(0, prompt);
  std::vector<float> cpu_logits(lc.begin(), lc.end());
  auto lg = gpu.forward(0, prompt);
  ASSERT_EQ(lg.size(), cpu_logits.size());
  EXPECT_LE(rel_err(lg, cpu_logits), logit_tol);

  // A differing pick is acceptable only as a near-tie on the CPU's logits.
  int flips = 0;
  auto check_pick = [&](std::span<const float> cpu_row, int32_t got, int step) {
    const int32_t want = argmax(cpu_row);
    if (got == want) return;
    ++flips;
    double scale = 0;
    for (float v : cpu_row) scale = std::max(scale, std::fabs(double(v)));
    EXPECT_LE(double(cpu_row[size_t(want)]) - double(cpu_row[size_t(got)]), tie_tol * scale)
        << "step " << step << ": device picked " << got << ", the CPU " << want;
  };
  check_pick(cpu_logits, argmax(lg), -1);
  int32_t next = argmax(cpu_logits);
  for (int i = 0; i < 100; ++i) {
    auto lc = cpu.forward(0, std::span<const int32_t>(&next, 1));
    const std::vector<float> row(lc.begin(), lc.end());
    const int32_t got = gpu.forward_greedy(0, std::span<const int32_t>(&next, 1));
    check_pick(row, got, i);
    next = argmax(row);
  }
  if (tie_tol == 0.0) {
    EXPECT_EQ(flips, 0);
  }
  EXPECT_EQ(gpu.position(0), cpu.position(0));
}

TEST(CudaStage, PlanHasExactDeviceLines) {
  const std::string path = test::model_path("stories260K.gguf");
  GgufFile f = GgufFile::open(path);
  StageConfig sc;
  sc.n_ctx = 100;
  const MemoryPlan cpu = Stage::plan(f, sc);
  const MemoryPlan gpu = CudaStage::plan(f, sc);
  // The same weights and cache as the CPU; its own workspace and host lines.
  EXPECT_EQ(gpu.bytes(PlanLine::Weights), cpu.bytes(PlanLine::Weights));
  EXPECT_EQ(gpu.bytes(PlanLine::KvCache), cpu.bytes(PlanLine::KvCache));
  EXPECT_GT(gpu.bytes(PlanLine::Workspace), 0u);
  EXPECT_GT(gpu.bytes(PlanLine::PinnedIo), 0u);
  LoadOptions lo;
  lo.slots = 3;
  lo.slot_bytes = 1 << 20;
  EXPECT_EQ(CudaStage::plan(f, sc, lo).bytes(PlanLine::LoadStaging), 3u << 20);
}

TEST(CudaStage, Stories260KMatchesCpu) {
  BATON_REQUIRE_CUDA();
  const std::string path = test::model_path("stories260K.gguf");
  // BOS + "Once upon a time" (shared/models/README.md).
  expect_same_generation(path, {1, 403, 407, 261, 378}, 1e-4);
}

class CudaStageTypes : public ::testing::TestWithParam<DType> {};

TEST_P(CudaStageTypes, SyntheticMatchesCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + dtype_name(GetParam()));
  test::TempDir dir;
  const std::string path = write_synth(dir, GetParam(), seed);
  GgufFile f = GgufFile::open(path);
  const auto vocab = int32_t(f.find_tensor("token_embd.weight")->ne[1]);
  // Decode: F16 runs the float matvec, Q8_0 and Q4_K the integer-dot one.
  // The 6-token prompt: F16 and Q8_0 the same matvecs, Q4_K small_matmul
  // (from 2 rows, docs/CUDA.md), whose activations are rounded to F16.
  const bool xq = GetParam() == DType::Q8_0 || GetParam() == DType::Q4_K;
  const double prompt_tol = GetParam() == DType::Q4_K ? 3e-3 : xq ? 5e-4 : 1e-4;  // Q4_K: 1.4e-3 seen
  expect_same_generation(path, random_tokens(seed, 6, vocab), prompt_tol, xq ? 5e-4 : 0.0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaStageTypes, ::testing::Values(DType::F16, DType::Q8_0, DType::Q4_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// More than 8 tokens per forward go through cuBLAS (F32: a float32 GEMM;
// quantized: F16 tiles, x rounded to F16), with logits for every token.
TEST(CudaStage, PrefillGemmMatchesCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  for (DType type : {DType::F32, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(type));
    GgufFile f = GgufFile::open(write_synth(dir, type, seed + 1));
    const auto vocab = int32_t(f.find_tensor("token_embd.weight")->ne[1]);
    StageConfig sc;
    sc.n_ctx = 128;
    sc.max_batch = 32;
    sc.all_logits = true;
    sc.n_threads = 2;
    Stage cpu(f, sc);
    CudaStage gpu(f, sc);
    const auto prompt = random_tokens(seed + 2, 70, vocab);
    for (size_t at = 0; at < prompt.size(); at += 32) {
      const size_t n = std::min<size_t>(32, prompt.size() - at);
      std::span<const int32_t> chunk(prompt.data() + at, n);
      auto lc = cpu.forward(0, chunk);
      std::vector<float> want(lc.begin(), lc.end());
      auto lg = gpu.forward(0, chunk);
      ASSERT_EQ(lg.size(), want.size());
      for (size_t r = 0; r < n; ++r) {
        const size_t V = size_t(vocab);
        EXPECT_LE(rel_err(lg.subspan(r * V, V), std::span<const float>(want).subspan(r * V, V)),
                  type == DType::F32 ? 1e-4 : 2e-2)
            << "chunk at " << at << ", row " << r;
      }
    }
  }
}

// Whole-prompt prefill, one token at a time through the graph, and chunks of
// 3 give the same logits: the cache, positions and graph parameters line up.
TEST(CudaStage, GraphDecodeEqualsPrefill) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  GgufFile f = GgufFile::open(write_synth(dir, DType::Q4_K, seed + 3));
  const auto vocab = int32_t(f.find_tensor("token_embd.weight")->ne[1]);
  const auto tokens = random_tokens(seed + 4, 8, vocab);
  StageConfig sc;
  sc.n_ctx = 64;
  sc.max_batch = 8;
  sc.n_seq = 2;
  CudaStage gpu(f, sc);
  auto whole = gpu.forward(0, tokens);
  const std::vector<float> want(whole.begin(), whole.end());

  std::vector<float> step;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto l = gpu.forward(1, std::span<const int32_t>(&tokens[i], 1));
    step.assign(l.begin(), l.end());
  }
  // One token at a time runs the Q4_K integer-dot matvec (16-bit
  // activations), the 8-token forward small_matmul (activations rounded to
  // F16, docs/CUDA.md): the agreement is that of F16 rounding (1.2e-3 seen
  // on the H200).
  EXPECT_LE(rel_err(step, want), 3e-3);

  gpu.reset(0);
  std::vector<float> chunked;
  for (size_t at = 0; at < tokens.size(); at += 3) {
    const size_t n = std::min<size_t>(3, tokens.size() - at);
    auto l = gpu.forward(0, std::span<const int32_t>(tokens.data() + at, n));
    chunked.assign(l.begin(), l.end());
  }
  EXPECT_LE(rel_err(chunked, want), 1e-5);
  EXPECT_EQ(gpu.position(0), 8);
  EXPECT_EQ(gpu.position(1), 8);

  // The device's greedy id is the argmax of the logits it returns.
  const int32_t next = argmax(want);
  gpu.reset(0);
  gpu.forward(0, tokens);
  const int32_t id = gpu.forward_greedy(0, std::span<const int32_t>(&next, 1));
  gpu.reset(1);
  gpu.forward(1, tokens);
  EXPECT_EQ(id, argmax(gpu.forward(1, std::span<const int32_t>(&next, 1))));

  // Refused before anything runs: a bad id, a sequence slot, the context.
  const int32_t bad = vocab;
  EXPECT_THROW(gpu.forward(0, std::span<const int32_t>(&bad, 1)), std::out_of_range);
  EXPECT_THROW(gpu.forward(2, std::span<const int32_t>(&next, 1)), std::out_of_range);
  EXPECT_EQ(gpu.position(0), 9);
  for (int i = 9; i < 64; ++i) gpu.forward_greedy(0, std::span<const int32_t>(&next, 1));
  EXPECT_THROW(gpu.forward(0, std::span<const int32_t>(&next, 1)), std::out_of_range);
}

// "" when a and b hold the same floats bit for bit; else where they first
// differ and by how much at most.
std::string bit_difference(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return fmt::format("{} floats against {}", a.size(), b.size());
  if (std::memcmp(a.data(), b.data(), a.size_bytes()) == 0) return "";
  size_t first = a.size();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    first = std::min(first, i);
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  }
  return fmt::format("first differing float {} ({} vs {}), max |diff| {}", first, a[first], b[first], worst);
}

std::vector<float> device_to_host(const StageRunner::DeviceRows& d) {
  std::vector<float> h(size_t(d.n_floats));
  BATON_CUDA_CHECK(cudaMemcpy(h.data(), d.data, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// Moves `from`'s last output rows into `to`'s device input, as a stage link
// would, and runs `to` on them. cudaMemcpy between device buffers may return
// before the copy is done, so the device is synchronized before the forward:
// the input contract of engine/runtime/backend.h.
std::vector<float> forward_from_device(CudaStage& from, CudaStage& to, int seq, int64_t n) {
  const StageRunner::DeviceRows d = from.device_output();
  EXPECT_NE(d.data, nullptr);
  EXPECT_NE(d.stream, nullptr);
  EXPECT_EQ(d.n_floats, n * from.arch().boundary_elems_per_token());
  float* in = to.device_input(n);
  EXPECT_NE(in, nullptr);
  if (!d.data || !in) return {};
  BATON_CUDA_CHECK(cudaMemcpy(in, d.data, uint64_t(d.n_floats) * sizeof(float), cudaMemcpyDeviceToDevice));
  BATON_CUDA_CHECK(cudaDeviceSynchronize());
  auto y = to.forward_device_input(seq, n);
  return {y.begin(), y.end()};
}

// Three stages of one model (layers 0 | 1 | 2: embedding, middle, head) pass
// their boundary rows device to device through device_output() and
// device_input(): prefill through cuBLAS (12 tokens), a 3-token matvec chunk,
// and 8 decode steps through the captured graph. The logits are bit-identical
// to the same stages fed through the host and to the whole model on one
// stage: the same kernels run on the same numbers (the stage boundary's
// residual add is the same single float addition as the fused add + norm).
// The middle stage's input room is its own output buffer, so this also
// checks that reusing it step after step is sound.
TEST(CudaStage, DeviceBoundaryRowsMatchHostPathAndWholeModel) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  std::printf("seed %llu (BATON_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  for (DType type : {DType::F16, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(type));
    GgufFile f = GgufFile::open(write_synth(dir, type, seed + 7, /*n_layer=*/3));
    const auto vocab = int32_t(f.find_tensor("token_embd.weight")->ne[1]);
    StageConfig sc;
    sc.n_ctx = 64;
    sc.max_batch = 16;
    sc.n_seq = 2;  // seq 0: the host path; seq 1: the device path
    StageConfig ca = sc, cm = sc, cb = sc;
    ca.last_layer = 0;
    ca.head = false;
    cm.first_layer = cm.last_layer = 1;
    cm.embedding = cm.head = false;
    cb.first_layer = 2;
    cb.embedding = false;
    CudaStage whole(f, sc), a(f, ca), m(f, cm), b(f, cb);
    EXPECT_EQ(m.device_output().data, nullptr) << "no rows before the first forward";

    std::vector<int32_t> tokens = random_tokens(seed + 8, 12, vocab);
    const std::vector<int64_t> steps = {12, 3, 1, 1, 1, 1, 1, 1, 1, 1};
    for (size_t i = 0; i < steps.size(); ++i) {
      const int64_t n = steps[i];
      SCOPED_TRACE(fmt::format("step {} ({} tokens)", i, n));
      ASSERT_EQ(tokens.size(), size_t(n));
      auto lw = whole.forward(0, tokens);
      const std::vector<float> want(lw.begin(), lw.end());

      auto ya = a.forward(0, tokens);
      const std::vector<float> ha(ya.begin(), ya.end());
      auto ym = m.forward(0, ha, n);
      const std::vector<float> hm(ym.begin(), ym.end());
      auto yb = b.forward(0, hm, n);
      const std::vector<float> host(yb.begin(), yb.end());

      auto da = a.forward(1, tokens);
      EXPECT_EQ(bit_difference(da, ha), "") << "stage A, host rows of the device path";
      const std::vector<float> dm = forward_from_device(a, m, 1, n);
      EXPECT_EQ(bit_difference(dm, hm), "") << "middle stage, device input against host input";
      const std::vector<float> dev = forward_from_device(m, b, 1, n);

      EXPECT_EQ(bit_difference(dev, host), "") << "logits: device boundary against host boundary";
      EXPECT_EQ(bit_difference(dev, want), "") << "logits: device boundary against the whole model";
      EXPECT_EQ(bit_difference(host, want), "") << "logits: host boundary against the whole model";
      // The head stage's device output is its logits.
      EXPECT_EQ(bit_difference(device_to_host(b.device_output()), dev), "") << "head stage device_output()";
      // The next step's tokens: the greedy pick, then random ones up to its size.
      if (i + 1 < steps.size()) {
        tokens = random_tokens(seed + 9 + i, steps[i + 1], vocab);
        tokens[0] = argmax(want);
      }
    }
    EXPECT_EQ(b.position(1), whole.position(0));
    EXPECT_EQ(m.position(1), m.position(0));

    // Refused before anything is written or run.
    EXPECT_THROW(m.device_input(0), std::invalid_argument);
    EXPECT_THROW(m.device_input(sc.max_batch + 1), std::invalid_argument);
    EXPECT_THROW(a.device_input(1), std::logic_error);
    EXPECT_THROW(a.forward_device_input(1, 1), std::logic_error);
    EXPECT_NE(m.device_input(sc.max_batch), nullptr);
  }
}

TEST(CudaStage, DeviceMemoryIsThePlan) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  GgufFile f = GgufFile::open(write_synth(dir, DType::Q8_0, seed + 5));
  StageConfig sc;
  sc.n_ctx = 256;
  sc.max_batch = 64;
  CudaStage gpu(f, sc);
  const MemoryPlan& plan = gpu.memory_plan();
  const DeviceMemoryReport m = gpu.device_memory();
  EXPECT_EQ(m.planned, plan.bytes(PlanLine::Weights) + plan.bytes(PlanLine::KvCache) + plan.bytes(PlanLine::Workspace));
  EXPECT_EQ(m.allocated, m.planned);
  // The allocator hands out whole 2 MiB pages: three allocations may round.
  const double slack = 3.0 * double(2 << 20) + 0.02 * double(m.planned);
  EXPECT_LE(std::fabs(double(m.measured) - double(m.planned)), slack) << m.measured << " vs " << m.planned;
  uint64_t tensor_bytes = 0;
  for (const auto& t : f.tensors()) tensor_bytes += t.nbytes;
  EXPECT_EQ(gpu.load_stats().bytes, tensor_bytes);
}

// The pinned ring with a tiny slot size: every tensor lands byte for byte
// where the layout puts it, and progress only grows.
TEST(CudaStage, PinnedRingLoadsEveryByte) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  GgufFile f = GgufFile::open(write_synth(dir, DType::Q4_K, seed + 6));
  auto arch = Arch::from_gguf(f);
  const WeightLayout wl = Model::plan(f, *arch, {{0, arch->dims().n_layer - 1}, true, true});
  DeviceBuffer dev(wl.bytes, "weights");
  BATON_CUDA_CHECK(cudaMemset(dev.data(), 0xff, dev.size()));
  LoadOptions lo;
  lo.slots = 2;
  lo.slot_bytes = 64 << 10;
  uint64_t last = 0, calls = 0;
  bool monotonic = true;
  lo.progress = [&](const LoadProgress& p) {
    monotonic = monotonic && p.done >= last && p.done <= p.total;
    last = p.done;
    ++calls;
  };
  const auto items = load_items(wl);
  PinnedStagingSink sink(dev.data(), dev.size(), lo.slots, lo.slot_bytes);
  const LoadStats st = load_staged(f, items, sink, lo);
  EXPECT_TRUE(monotonic);
  EXPECT_EQ(last, st.bytes);
  EXPECT_GT(calls, 2u);
  EXPECT_EQ(st.staging_bytes, 2u * (64u << 10));
  std::vector<uint8_t> host(dev.size());
  BATON_CUDA_CHECK(cudaMemcpy(host.data(), dev.data(), host.size(), cudaMemcpyDeviceToHost));
  for (const auto& it : items) {
    const GgufTensorInfo* t = f.find_tensor(it.name);
    ASSERT_NE(t, nullptr);
    std::vector<uint8_t> want(t->nbytes);
    f.read_tensor(*t, want.data());
    EXPECT_EQ(std::memcmp(host.data() + it.dst_offset, want.data(), want.size()), 0) << it.name;
  }
}

}  // namespace
}  // namespace baton
