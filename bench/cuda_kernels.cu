// CUDA kernel micro-benchmark: measures the device's copy and read bandwidth,
// then the decode matvecs (GB/s of weights against those ceilings), the
// prefill matmul (TFLOP/s, and the share of dequantization), attention and
// sampling. Weights are realistic random blocks, rotated over enough copies
// that the working set is several times the L2 cache, and matvecs are timed
// as CUDA graph replays so launch gaps do not count. Prints a table.
//
//   bench_cuda_kernels            all sections
//   bench_cuda_kernels matvec     one section (matvec, xq, decode, ds4, variants, matmul, attention, sampling)
//   bench_cuda_kernels ds4 once   each kernel of the section once, untimed (for a profiler)
//
// The `variants` section times the matvec kernel's other configurations
// (step width, rows per block, load order, factored scales; see
// matvec_impl.cuh) against the
// one matvec.cu picks, after checking that each computes the same result.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cuda/stage_ops.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/ds4_ops.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_xq.cuh"
#include "kernels/cuda/moe_xq_impl.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/matvec_impl.cuh"
#include "kernels/cuda/matvec_xq_impl.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/quant.h"

namespace baton::cuda {
namespace {

constexpr size_t kRotateBytes = size_t(512) << 20;  // > 8x the H200's 60 MB L2

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) : size(n) { BATON_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  size_t size = 0;
  size_t bytes() const { return size; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of one call of fn, timed with events around `inner`
// calls, after two warm-up rounds.
double time_calls(cudaStream_t s, int inner, int reps, const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  BATON_CUDA_CHECK(cudaEventCreate(&a));
  BATON_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    BATON_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < inner; ++i) fn(i);
    BATON_CUDA_CHECK(cudaEventRecord(b, s));
    BATON_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BATON_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 2) ms.push_back(double(t) / inner);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

// Same, but the `inner` calls are captured once into a CUDA graph and the
// graph is replayed: no launch gaps between the kernels.
// `bench_cuda_kernels SECTION once`: every timed call runs once and nothing
// is timed, so a profiler (ncu -k ...) sees each kernel of the section once.
bool g_once = false;

double time_graph(cudaStream_t s, int inner, int reps, const std::function<void(int)>& fn) {
  fn(0);  // first-call setup (cached attributes) outside the capture
  BATON_CUDA_CHECK(cudaStreamSynchronize(s));
  if (g_once) return 1.0;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BATON_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < inner; ++i) fn(i);
  BATON_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  BATON_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = time_calls(s, 1, reps, [&](int) { BATON_CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms / inner;
}

__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads alive
}

struct Ceilings {
  double copy_gbs = 0;  // device-to-device copy, bytes read + written
  double read_gbs = 0;  // streaming read kernel
};

Ceilings measure_ceilings(cudaStream_t s) {
  const size_t bytes = size_t(1) << 30;
  Buf a(bytes), b(bytes), sink(64);
  BATON_CUDA_CHECK(cudaMemset(a.p, 1, bytes));
  Ceilings c;
  const double copy_ms =
      time_calls(s, 5, 7, [&](int) { BATON_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, s)); });
  c.copy_gbs = 2.0 * double(bytes) / (copy_ms * 1e6);
  int sms = 0;
  BATON_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double read_ms = time_calls(s, 5, 7, [&](int) {
    read_kernel<<<sms * 8, 256, 0, s>>>(a.as<uint4>(), bytes / 16, sink.as<unsigned>());
  });
  c.read_gbs = double(bytes) / (read_ms * 1e6);
  std::printf("device copy  : %.0f GB/s (read + write, 1 GiB, cudaMemcpyAsync D2D)\n", c.copy_gbs);
  std::printf("device read  : %.0f GB/s (streaming 16-byte loads, 1 GiB)\n", c.read_gbs);
  return c;
}

// A rows x cols matrix of realistic random blocks: a pool of up to 64
// distinct rows repeated (quantizing all rows on the CPU would take seconds).
std::vector<uint8_t> host_matrix(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  const uint64_t row_bytes = *dtype_bytes(t, uint64_t(cols));
  const int64_t pool = std::min<int64_t>(rows, 64);
  std::vector<uint8_t> m(size_t(row_bytes * uint64_t(rows)));
  random_blocks(t, m.data(), int64_t(uint64_t(pool) * row_bytes / dtype_info(t).block_bytes), seed);
  for (int64_t r = pool; r < rows; ++r) {
    std::memcpy(m.data() + uint64_t(r) * row_bytes, m.data() + uint64_t(r % pool) * row_bytes, row_bytes);
  }
  return m;
}

// n copies of one matrix on the device, enough to exceed kRotateBytes.
struct DeviceCopies {
  std::vector<void*> ptrs;
  size_t bytes = 0;
  DeviceCopies(const std::vector<uint8_t>& host, size_t min_copies = 2) : bytes(host.size()) {
    const size_t n = std::max(min_copies, (kRotateBytes + bytes - 1) / bytes);
    for (size_t i = 0; i < n; ++i) {
      void* p;
      BATON_CUDA_CHECK(cudaMalloc(&p, bytes));
      BATON_CUDA_CHECK(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
      ptrs.push_back(p);
    }
  }
  ~DeviceCopies() {
    for (void* p : ptrs) cudaFree(p);
  }
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float((double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  return v;
}

void bench_matvec(cudaStream_t s, const Ceilings& c) {
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"attn 4096x4096", 4096, 4096},
                          {"ffn up 14336x4096", 14336, 4096},
                          {"ffn down 4096x14336", 4096, 14336}};
  const DType types[] = {DType::F16, DType::BF16, DType::Q8_0, DType::Q6_K, DType::Q4_K, DType::Q2_K, DType::IQ2_XXS};
  std::printf("\nmatvec (decode), graph replays of 64 launches over rotating copies\n");
  std::printf("%-8s %-26s %3s %9s %8s %7s %7s\n", "type", "shape", "T", "us", "GB/s", "%copy", "%read");
  Buf x(sizeof(float) * 14336 * 8), out(sizeof(float) * 14336 * 8);
  const std::vector<float> hx = random_floats(14336 * 8, 7);
  BATON_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  auto run = [&](DType t, const char* name, int64_t rows, int64_t cols, const std::vector<int>& tokens) {
    const std::vector<uint8_t> host = host_matrix(t, rows, cols, 11);
    DeviceCopies copies(host);
    for (int T : tokens) {
      const double ms = time_graph(s, 64, 9, [&](int i) {
        const MatrixView w{t, copies.ptrs[size_t(i) % copies.ptrs.size()], rows, cols, *dtype_bytes(t, cols)};
        matvec(w, x.as<float>(), T, cols, out.as<float>(), rows, s);
      });
      const double bytes = double(copies.bytes) + 4.0 * double(T) * double(cols + rows);
      const double gbs = bytes / (ms * 1e6);
      std::printf("%-8s %-26s %3d %9.2f %8.0f %6.0f%% %6.0f%%\n", dtype_name(t), name, T, ms * 1e3, gbs,
                  100.0 * gbs / c.copy_gbs, 100.0 * gbs / c.read_gbs);
    }
  };
  for (const Shape& sh : shapes) {
    for (DType t : types) run(t, sh.name, sh.rows, sh.cols, {1});
  }
  // DeepSeek V4 Flash Q2 experts: IQ2_XXS gate/up (2048 x 4096), Q2_K down
  // (4096 x 2048); alone and as the 6 routed experts of a token in one matrix.
  run(DType::IQ2_XXS, "expert gate 2048x4096", 2048, 4096, {1});
  run(DType::IQ2_XXS, "6 experts 12288x4096", 12288, 4096, {1});
  run(DType::Q2_K, "expert down 4096x2048", 4096, 2048, {1});
  // Small batches share each weight read.
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_K, DType::IQ2_XXS}) {
    run(t, "ffn up 14336x4096", 14336, 4096, {2, 4, 8});
  }
}

// --- integer-dot matvec (quantized activations) ------------------------------

using XqLaunchFn = void (*)(const MatrixView&, const void*, uint64_t, int, float*, int64_t, cudaStream_t);

template <class K>
std::vector<std::pair<const char*, XqLaunchFn>> xq_variants() {
  using namespace detail;
  return {{"xq R1", &launch_matvec_xq<K, 1, 1>},
          {"xq R2", &launch_matvec_xq<K, 2, 1>},
          {"xq R4", &launch_matvec_xq<K, 4, 1>},
          {"xq R8", &launch_matvec_xq<K, 8, 1>},
          {"xq R1 unpiped", &launch_matvec_xq_bounded<K, 1, false, 0>},
          {"xq R2 unpiped", &launch_matvec_xq_bounded<K, 2, false, 0>},
          {"xq R4 piped", &launch_matvec_xq_bounded<K, 4, true, 0>},
          {"xq R4 piped mb4", &launch_matvec_xq_bounded<K, 4, true, 4>},
          {"xq R4 piped mb6", &launch_matvec_xq_bounded<K, 4, true, 6>},
          {"xq R4 mb8", &launch_matvec_xq_bounded<K, 4, false, 8>},
          {"xq R4 mb6", &launch_matvec_xq_bounded<K, 4, false, 6>},
          {"xq R8 piped", &launch_matvec_xq_bounded<K, 8, true, 0>},
          {"xq R8 piped mb3", &launch_matvec_xq_bounded<K, 8, true, 3>},
          {"xq R8 mb4", &launch_matvec_xq_bounded<K, 8, false, 4>}};
}

// Q4_K with 32 bytes of quants per thread (XqQ4_K32) against the default 16.
std::vector<std::pair<const char*, XqLaunchFn>> q4k32_variants() {
  using namespace detail;
  using K = XqQ4_K32;
  return {{"q4k32 R1", &launch_matvec_xq<K, 1, 1>},
          {"q4k32 R2", &launch_matvec_xq<K, 2, 1>},
          {"q4k32 R4", &launch_matvec_xq<K, 4, 1>},
          {"q4k32 R8", &launch_matvec_xq<K, 8, 1>},
          {"q4k32 R2 unpiped", &launch_matvec_xq_bounded<K, 2, false, 0>},
          {"q4k32 R2 piped mb4", &launch_matvec_xq_bounded<K, 2, true, 4>},
          {"q4k32 R2 mb4", &launch_matvec_xq_bounded<K, 2, false, 4>},
          {"q4k32 R4 piped", &launch_matvec_xq_bounded<K, 4, true, 0>},
          {"q4k32 R4 piped mb2", &launch_matvec_xq_bounded<K, 4, true, 2>},
          {"q4k32 R4 mb4", &launch_matvec_xq_bounded<K, 4, false, 4>},
          {"q4k32 R8 mb2", &launch_matvec_xq_bounded<K, 8, false, 2>}};
}

// One token: the float matvec, quantize_xq alone, matvec_xq (the default)
// and its rows-per-block variants, each checked against the float result.
void bench_xq(cudaStream_t s, const Ceilings& c) {
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"attn 4096x4096", 4096, 4096},
                          {"qkv 6144x4096", 6144, 4096},
                          {"ffn gate|up 28672x4096", 28672, 4096},
                          {"ffn down 4096x14336", 4096, 14336},
                          {"head 128256x4096", 128256, 4096},
                          // DeepSeek V4 Flash's Q8_0 projections of a decode step.
                          {"ds4 q_a 1024x4096", 1024, 4096},
                          {"ds4 q_b 32768x1024", 32768, 1024},
                          {"ds4 out_b 4096x8192", 4096, 8192},
                          {"ds4 shexp g|u 4096x4096", 4096, 4096},
                          {"ds4 shexp down 4096x2048", 4096, 2048}};
  std::printf("\ninteger-dot matvec, one token (us, GB/s of weights + x + out, %% of copy; diff vs float matvec)\n");
  std::printf("%-6s %-24s %-16s %9s %8s %6s %9s\n", "type", "shape", "kernel", "us", "GB/s", "%copy", "rel diff");
  Buf x(sizeof(float) * 14336), out(sizeof(float) * 128256), ref(sizeof(float) * 128256), xq(xq_row_bytes(14336));
  const std::vector<float> hx = random_floats(14336, 53);
  BATON_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  for (const Shape& sh : shapes) {
    for (DType t : {DType::Q8_0, DType::Q4_K}) {
      const std::vector<uint8_t> host = host_matrix(t, sh.rows, sh.cols, 59);
      DeviceCopies copies(host);
      const uint64_t row_bytes = *dtype_bytes(t, uint64_t(sh.cols));
      auto view = [&](int i) { return MatrixView{t, copies.ptrs[size_t(i) % copies.ptrs.size()], sh.rows, sh.cols, row_bytes}; };
      const double bytes = double(copies.bytes) + 4.0 * double(sh.cols + sh.rows);
      auto line = [&](const char* kernel, double ms, const char* diff) {
        std::printf("%-6s %-24s %-16s %9.2f %8.0f %5.0f%% %9s\n", dtype_name(t), sh.name, kernel, ms * 1e3,
                    bytes / (ms * 1e6), 100.0 * bytes / (ms * 1e6) / c.copy_gbs, diff);
      };
      matvec(view(0), x.as<float>(), 1, sh.cols, ref.as<float>(), sh.rows, s);
      std::vector<float> want(size_t(sh.rows)), got(size_t(sh.rows));
      BATON_CUDA_CHECK(cudaStreamSynchronize(s));
      BATON_CUDA_CHECK(cudaMemcpy(want.data(), ref.p, want.size() * 4, cudaMemcpyDeviceToHost));
      float scale = 0;
      for (float v : want) scale = std::max(scale, std::fabs(v));
      auto diff_of = [&](char* buf) {
        BATON_CUDA_CHECK(cudaStreamSynchronize(s));
        BATON_CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 4, cudaMemcpyDeviceToHost));
        float d = 0;
        for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::fabs(got[i] - want[i]));
        std::snprintf(buf, 32, "%.1e%s", double(d / scale), d <= 1e-3f * scale ? "" : " BAD");
      };
      line("float matvec", time_graph(s, 64, 9, [&](int i) { matvec(view(i), x.as<float>(), 1, sh.cols, out.as<float>(), sh.rows, s); }), "");
      const double q_ms = time_graph(s, 64, 9, [&](int) { quantize_xq(x.as<float>(), sh.cols, 1, sh.cols, xq.p, s); });
      std::printf("%-6s %-24s %-16s %9.2f\n", dtype_name(t), sh.name, "quantize_xq", q_ms * 1e3);
      char diff[32];
      matvec_xq(view(0), xq.p, 1, out.as<float>(), sh.rows, s);
      diff_of(diff);
      line("matvec_xq", time_graph(s, 64, 9, [&](int i) { matvec_xq(view(i), xq.p, 1, out.as<float>(), sh.rows, s); }), diff);
      detail::set_pdl_enabled(false);
      line("matvec_xq no PDL", time_graph(s, 64, 9, [&](int i) { matvec_xq(view(i), xq.p, 1, out.as<float>(), sh.rows, s); }), diff);
      detail::set_pdl_enabled(true);
      auto variants = t == DType::Q8_0 ? xq_variants<detail::XqQ8_0>() : xq_variants<detail::XqQ4_K>();
      if (t == DType::Q4_K) {
        const auto wide = q4k32_variants();
        variants.insert(variants.end(), wide.begin(), wide.end());
      }
      for (const auto& [name, fn] : variants) {
        fn(view(0), xq.p, xq_row_bytes(sh.cols), 1, out.as<float>(), sh.rows, s);
        diff_of(diff);
        line(name, time_graph(s, 64, 9, [&](int i) { fn(view(i), xq.p, xq_row_bytes(sh.cols), 1, out.as<float>(), sh.rows, s); }), diff);
      }
    }
  }
}

// --- the small kernels of one llama-8b decode layer ---------------------------

// Each of the non-matvec kernels a decode step runs per layer, at the llama 3
// 8B sizes, timed as graph replays on L2-resident buffers (as in the decode
// graph, where they follow each other on data just written). Attention reads
// its position from device memory with the split count of a 4224-position
// cache, as the bench's decode graph does.
void bench_decode_ops(cudaStream_t s) {
  const int64_t E = 4096, F = 14336, V = 128256, kw = 1024, qkvw = 4096 + 2 * kw;
  const int n_head = 32, n_head_kv = 8, d = 128, n_ctx = 4224;
  std::printf("\ndecode-step kernels of one llama-8b layer (us per launch, graph replays of 64)\n");
  Buf x(E * 4), y(E * 4), xn(E * 4), w(E * 4), qkv(qkvw * 4), gu(2 * F * 4), ffh(F * 4), xq(xq_row_bytes(F)),
      freqs(64 * 4), pos(16), kc(size_t(n_ctx) * kw * 4), vc(size_t(n_ctx) * kw * 4), att(E * 4),
      aws(attention_workspace_bytes(1, n_head, d)), logits(V * 4), ids(16);
  const std::vector<float> hx = random_floats(size_t(2 * F), 61);
  for (const Buf* b : {&x, &y, &w, &qkv, &att}) BATON_CUDA_CHECK(cudaMemcpy(b->p, hx.data(), E * 4, cudaMemcpyHostToDevice));
  BATON_CUDA_CHECK(cudaMemcpy(gu.p, hx.data(), 2 * F * 4, cudaMemcpyHostToDevice));
  BATON_CUDA_CHECK(cudaMemcpy(logits.p, hx.data(), 2 * F * 4, cudaMemcpyHostToDevice));
  BATON_CUDA_CHECK(cudaMemcpy(freqs.p, hx.data(), 64 * 4, cudaMemcpyHostToDevice));
  BATON_CUDA_CHECK(cudaMemset(pos.p, 0, 16));  // position 0 until the attention cases set theirs
  BATON_CUDA_CHECK(cudaMemset(kc.p, 0, size_t(n_ctx) * kw * 4));
  BATON_CUDA_CHECK(cudaMemset(vc.p, 0, size_t(n_ctx) * kw * 4));
  // Each kernel with programmatic dependent launch (the decode graph's
  // setting, kernels/cuda/pdl.cuh) and without.
  std::printf("%-40s %8s %8s\n", "kernel", "PDL", "no PDL");
  auto line = [&](const char* name, const std::function<void(int)>& fn) {
    const bool was = detail::pdl_enabled();
    detail::set_pdl_enabled(true);
    const double on = time_graph(s, 64, 9, fn);
    detail::set_pdl_enabled(false);
    const double off = time_graph(s, 64, 9, fn);
    detail::set_pdl_enabled(was);
    std::printf("%-40s %8.2f %8.2f\n", name, on * 1e3, off * 1e3);
  };
  line("add_rmsnorm 4096", [&](int) { add_rmsnorm(x.as<float>(), E, y.as<float>(), E, w.as<float>(), xn.as<float>(), E, 1, E, 1e-5f, s); });
  line("add_rmsnorm 4096 + quantize", [&](int) {
    add_rmsnorm(x.as<float>(), E, y.as<float>(), E, w.as<float>(), xn.as<float>(), E, 1, E, 1e-5f, s, xq.p);
  });
  line("add_rmsnorm 4095 (scalar kernel)", [&](int) {
    add_rmsnorm(x.as<float>(), E, y.as<float>(), E, w.as<float>(), xn.as<float>(), E, 1, E - 1, 1e-5f, s);
  });
  line("rope q+k (40 heads x 128)", [&](int) {
    rope(qkv.as<float>(), 1, qkvw, n_head + n_head_kv, d, d, pos.as<int32_t>(), freqs.as<float>(), RopeMode::Normal, s);
  });
  line("rope q+k + kv append (fused)", [&](int) {
    RopeAppend app;
    app.first_k_head = n_head;
    app.v = qkv.as<float>() + 4096 + kw;
    app.vw = kw;
    app.k_cache = kc.as<float>();
    app.v_cache = vc.as<float>();
    app.pos0 = pos.as<int32_t>();
    rope(qkv.as<float>(), 1, qkvw, n_head + n_head_kv, d, d, pos.as<int32_t>(), freqs.as<float>(), RopeMode::Normal, app, s);
  });
  line("kv_append 1024 + 1024", [&](int) {
    kv_append(qkv.as<float>() + 4096, qkv.as<float>() + 4096 + kw, qkvw, 1, kw, kw, kc.as<float>(), vc.as<float>(),
              pos.as<int32_t>(), s);
  });
  for (int32_t p : {511, 4095}) {
    BATON_CUDA_CHECK(cudaMemcpy(pos.p, &p, 4, cudaMemcpyHostToDevice));
    AttentionParams ap;
    ap.n_head = n_head;
    ap.n_head_kv = n_head_kv;
    ap.head_dim_k = ap.head_dim_v = d;
    ap.scale = 0.088f;
    ap.q = qkv.as<float>();
    ap.q_stride = qkvw;
    ap.n_tokens = 1;
    ap.pos0 = n_ctx - 1;
    ap.pos0_device = pos.as<int32_t>();
    ap.k_cache = kc.as<float>();
    ap.v_cache = vc.as<float>();
    ap.out = att.as<float>();
    ap.out_stride = E;
    // The default split minimum and two others (AttentionParams::min_split_positions).
    for (const int64_t min_pos : {int64_t(8), int64_t(16), int64_t(64)}) {
      ap.min_split_positions = min_pos;
      const std::string name = "attention + merge, position " + std::to_string(p) +
                               (min_pos == 8 ? std::string() : ", splits of " + std::to_string(min_pos) + "+");
      line(name.c_str(), [&](int) { attention(ap, aws.p, attention_workspace_bytes(1, n_head, d), s); });
    }
  }
  BATON_CUDA_CHECK(cudaMemset(pos.p, 0, 16));
  line("quantize_xq 4096", [&](int) { quantize_xq(att.as<float>(), E, 1, E, xq.p, s); });
  line("swiglu 14336", [&](int) { swiglu_rows(gu.as<float>(), gu.as<float>() + F, 2 * F, ffh.as<float>(), 1, F, s); });
  line("swiglu 14336 + quantize", [&](int) {
    swiglu_rows(gu.as<float>(), gu.as<float>() + F, 2 * F, ffh.as<float>(), 1, F, s, xq.p);
  });
  line("argmax 128256", [&](int) { argmax(logits.as<float>(), 1, V, V, ids.as<int32_t>(), s); });
}

// --- the DeepSeek V4 Flash decode kernels ------------------------------------

// The non-projection kernels of one Flash decode layer at full shape (hidden
// 4096, 4 HC streams, 64 heads of 512, window 128, ratio-4 compressor with a
// 64-head indexer of 128 and top-k 512, 256 experts of 2048, top 6), at
// position 2111 as in the bench's ctx-2048 decode: graph replays of 64
// launches with programmatic launch, us per launch. The routed experts
// rotate over 24 distinct experts (170 MB, several times the L2) so their
// weights come from memory as in a real step; the rest is L2-resident, as
// in the decode graph, where each kernel reads what the one before wrote.
void bench_ds4_ops(cudaStream_t s, const Ceilings& c) {
  const int64_t E = 4096, HC = 4 * E, MIX = 24, H = 64, hd = 512, ff = 2048, NE = 256, K = 6, ctx = 4096;
  const int64_t id = 128, ih = 64, top_k = 512, window = 128, n_pool = 24;
  const int32_t pos = 2111;
  std::printf("\nDeepSeek V4 Flash decode kernels, one layer, position %d (us per launch, graph replays of 64)\n", pos);
  const std::vector<float> hr = random_floats(size_t(2 * HC), 71);
  auto filled = [&](size_t floats) {
    auto b = std::make_unique<Buf>(floats * 4);
    std::vector<float> v(floats);
    for (size_t i = 0; i < floats; ++i) v[i] = hr[i % hr.size()];
    BATON_CUDA_CHECK(cudaMemcpy(b->p, v.data(), floats * 4, cudaMemcpyHostToDevice));
    return b;
  };
  auto x = filled(HC), y = filled(E), mix = filled(MIX), h = filled(E), base = filled(MIX), norm = filled(E);
  auto scale3 = filled(3), part = filled(size_t(HC / 128 + 1) * (MIX + 1) * 8);
  Buf posb(16), xq(xq_row_bytes(E)), ids(64 * 4), wts(64 * 4);
  BATON_CUDA_CHECK(cudaMemcpy(posb.p, &pos, 4, cudaMemcpyHostToDevice));
  quantize_xq(h->as<float>(), E, 1, E, xq.p, s);
  const std::vector<uint8_t> hfn = host_matrix(DType::F16, MIX, HC, 73);
  DeviceCopies fn(hfn);
  auto line = [&](const char* name, double ms, double bytes) {
    if (bytes > 0) {
      std::printf("%-44s %8.2f %8.0f GB/s %5.0f%% of copy\n", name, ms * 1e3, bytes / (ms * 1e6),
                  100.0 * bytes / (ms * 1e6) / c.copy_gbs);
    } else {
      std::printf("%-44s %8.2f\n", name, ms * 1e3);
    }
  };
  Ds4HcShape hs;
  hs.n_hc = 4, hs.n_embd = E, hs.sinkhorn_iters = 20, hs.hc_eps = 1e-6f, hs.rms_eps = 1e-6f;
  line("hc_pre_split (mix partials + weights, h)", time_graph(s, 64, 9, [&](int i) {
    const MatrixView w{DType::F16, fn.ptrs[size_t(i) % fn.ptrs.size()], MIX, HC, uint64_t(HC) * 2};
    ds4_hc_pre_split(hs, w, x->as<float>(), 1, scale3->as<float>(), base->as<float>(), norm->as<float>(),
                     mix->as<float>(), h->as<float>(), part->p, part->bytes(), s);
  }), double(hfn.size()));
  line("hc_post", time_graph(s, 64, 9, [&](int) {
    ds4_hc_post(hs, x->as<float>(), y->as<float>(), mix->as<float>(), 1, x->as<float>(), s);
  }), 0);
  // Router over 256 experts (top 6 of the biased scores).
  auto logits = filled(NE), bias = filled(NE);
  Ds4RouterParams rp;
  rp.n_expert = int(NE), rp.n_used = int(K), rp.norm = true, rp.scale = 1.5f, rp.bias = bias->as<float>();
  line("router (256 experts, top 6)", time_graph(s, 64, 9, [&](int) {
    ds4_router(rp, logits->as<float>(), 1, ids.as<int32_t>(), wts.as<float>(), s);
  }), 0);
  // Routed experts: IQ2_XXS gate/up, Q2_K down, n_pool experts, 6 per step.
  {
    const std::vector<uint8_t> g = host_matrix(DType::IQ2_XXS, n_pool * ff, E, 79);
    const std::vector<uint8_t> d = host_matrix(DType::Q2_K, n_pool * E, ff, 83);
    Buf gate(g.size()), up(g.size()), down(d.size()), out(E * 4);
    for (Buf* b : {&gate, &up}) BATON_CUDA_CHECK(cudaMemcpy(b->p, g.data(), g.size(), cudaMemcpyHostToDevice));
    BATON_CUDA_CHECK(cudaMemcpy(down.p, d.data(), d.size(), cudaMemcpyHostToDevice));
    MoeWeights m;
    m.gate = {{DType::IQ2_XXS, gate.p, n_pool * ff, E, *dtype_bytes(DType::IQ2_XXS, uint64_t(E))}, n_pool};
    m.up = {{DType::IQ2_XXS, up.p, n_pool * ff, E, *dtype_bytes(DType::IQ2_XXS, uint64_t(E))}, n_pool};
    m.down = {{DType::Q2_K, down.p, n_pool * E, ff, *dtype_bytes(DType::Q2_K, uint64_t(ff))}, n_pool};
    m.clamp = 10.0f;
    const size_t wsb = moe_xq_workspace_bytes(m, 1, int(K));
    Buf mws(wsb);
    // 4 id sets of 6 distinct experts, so consecutive launches read other experts.
    std::vector<int32_t> hid(4 * K);
    for (int i = 0; i < 4 * K; ++i) hid[size_t(i)] = int32_t(i % n_pool);
    Buf idsets(hid.size() * 4);
    BATON_CUDA_CHECK(cudaMemcpy(idsets.p, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));
    const std::vector<float> hw(size_t(K), 1.0f / float(K));
    BATON_CUDA_CHECK(cudaMemcpy(wts.p, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    const double bytes = double(K) * (2.0 * double(ff) * double(m.gate.w.row_bytes) + double(E) * double(m.down.w.row_bytes));
    line("moe_decode_xq (gate|up + down, 6 experts)", time_graph(s, 64, 9, [&](int i) {
      moe_decode_xq(m, xq.p, 1, idsets.as<int32_t>() + (i % 4) * K, wts.as<float>(), int(K), out.as<float>(), E, mws.p,
                    wsb, s);
    }), bytes);
    // The gate/up configurations (warps x rows, grid and sign lookups), each
    // checked against moe_decode_xq's output.
    std::vector<float> want(static_cast<size_t>(E)), got(static_cast<size_t>(E));
    moe_decode_xq(m, xq.p, 1, idsets.as<int32_t>(), wts.as<float>(), int(K), out.as<float>(), E, mws.p, wsb, s);
    BATON_CUDA_CHECK(cudaStreamSynchronize(s));
    BATON_CUDA_CHECK(cudaMemcpy(want.data(), out.p, want.size() * 4, cudaMemcpyDeviceToHost));
    using MoeFn = void (*)(const MoeWeights&, const void*, int64_t, const int32_t*, const float*, int, float*, int64_t,
                           void*, cudaStream_t);
    using namespace detail;
    const std::pair<const char*, MoeFn> moe_variants[] = {
        {"  16 warps x 2, shared grid + sign table", &launch_moe_decode_xq<16, 2, Iq2Lookup<true, true>>},
        {"  16 warps x 2, shared grid, signs computed", &launch_moe_decode_xq<16, 2, Iq2Lookup<true, false>>},
        {"  8 warps x 4, shared grid + sign table", &launch_moe_decode_xq<8, 4, Iq2Lookup<true, true>>},
        {"  8 warps x 4, shared grid, signs computed", &launch_moe_decode_xq<8, 4, Iq2Lookup<true, false>>},
        {"  8 warps x 4, cached grid, signs computed", &launch_moe_decode_xq<8, 4, Iq2Lookup<false, false>>},
        {"  4 warps x 8, cached grid, signs computed", &launch_moe_decode_xq<4, 8, Iq2Lookup<false, false>>},
        {"  16 warps x 2, cached grid, signs computed", &launch_moe_decode_xq<16, 2, Iq2Lookup<false, false>>},
    };
    for (const auto& [name, fn] : moe_variants) {
      fn(m, xq.p, 1, idsets.as<int32_t>(), wts.as<float>(), int(K), out.as<float>(), E, mws.p, s);
      BATON_CUDA_CHECK(cudaStreamSynchronize(s));
      BATON_CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 4, cudaMemcpyDeviceToHost));
      bool same = true;
      for (size_t i = 0; i < got.size(); ++i) same = same && got[i] == want[i];
      std::string label = std::string(name) + (same ? "" : " DIFFERS");
      line(label.c_str(), time_graph(s, 64, 9, [&](int i) {
        fn(m, xq.p, 1, idsets.as<int32_t>() + (i % 4) * K, wts.as<float>(), int(K), out.as<float>(), E, mws.p, s);
      }), bytes);
    }
  }
  // Compressor (ratio 4, two lanes of 512) at a position that completes a
  // window, and the indexer's (two lanes of 128).
  {
    auto kvg = filled(size_t(4 * hd)), ape = filled(size_t(4 * 2 * hd)), cnorm = filled(size_t(hd)), freqs = filled(32);
    auto state = filled(size_t(16 * 2 * hd)), rows = filled(size_t(ctx / 4 * hd));
    for (int64_t dim : {hd, id}) {
      Ds4CompressParams cp;
      cp.ratio = 4, cp.lanes = 2, cp.dim = dim, cp.rope_dim = 64, cp.eps = 1e-6f;
      cp.kv = kvg->as<float>(), cp.gate = kvg->as<float>() + 2 * dim, cp.stride = 4 * dim;
      cp.ape = MatrixView{DType::F32, ape->p, 4, 2 * dim, uint64_t(2 * dim) * 4};
      cp.norm = cnorm->as<float>(), cp.inv_freq = freqs->as<float>();
      cp.state = state->as<float>(), cp.rows = rows->as<float>();
      cp.pos0 = ctx - 1, cp.n_tokens = 1, cp.pos0_dev = posb.as<int32_t>();
      line(dim == hd ? "compress ratio 4 x 512 (pool + store)" : "compress ratio 4 x 128 (indexer)",
           time_graph(s, 64, 9, [&](int) { ds4_compress(cp, s); }), 0);
    }
  }
  // Indexer at 528 complete rows (more than top-k 512): scores and top-k.
  {
    auto iq = filled(size_t(ih * id)), iw = filled(size_t(ih)), irows = filled(size_t(ctx / 4 * id));
    Buf scores(size_t(ctx / 4) * 4), itop(size_t(top_k) * 4);
    Ds4IndexerParams ip;
    ip.n_head = int(ih), ip.head_dim = int(id), ip.ratio = 4, ip.top_k = int(top_k);
    ip.q = iq->as<float>(), ip.w = iw->as<float>(), ip.rows = irows->as<float>();
    ip.pos0 = ctx - 1, ip.n_tokens = 1, ip.scores = scores.as<float>(), ip.score_stride = ctx / 4;
    ip.itop = itop.as<int32_t>(), ip.pos0_dev = posb.as<int32_t>();
    line("indexer scores + top-k (528 rows)", time_graph(s, 64, 9, [&](int) { ds4_indexer_select(ip, s); }), 0);
    line("indexer top-k alone", time_graph(s, 64, 9, [&](int) { ds4_indexer_topk(ip, s); }), 0);
    // Attention: 64 heads of 512 over the 128 window rows and 512 picked rows.
    auto q = filled(size_t(H * hd)), kvn = filled(size_t(hd)), ring = filled(size_t(window * hd)),
         crows = filled(size_t(ctx / 4 * hd)), sinks = filled(size_t(H));
    Buf att(size_t(H * hd) * 4);
    ds4_indexer_select(ip, s);  // itop holds a valid pick
    Ds4AttentionParams ap;
    ap.n_head = int(H), ap.head_dim = int(hd), ap.scale = 0.044f, ap.q = q->as<float>(), ap.q_stride = H * hd;
    ap.kv_new = kvn->as<float>(), ap.ring = ring->as<float>(), ap.window = window, ap.comp_rows = crows->as<float>();
    ap.ratio = 4, ap.itop = itop.as<int32_t>(), ap.top_k = int(top_k), ap.sinks = sinks->as<float>();
    ap.pos0 = ctx - 1, ap.n_tokens = 1, ap.out = att.as<float>(), ap.out_stride = H * hd, ap.pos0_dev = posb.as<int32_t>();
    const size_t aw = ds4_attention_workspace_bytes(ap);
    Buf aws(std::max<size_t>(aw, 16));
    line("attention split + merge (640 rows)", time_graph(s, 64, 9, [&](int) { ds4_attention(ap, aws.p, aw, s); }), 0);
    line("norm + rope, 64 heads of 512", time_graph(s, 64, 9, [&](int) {
      ds4_norm_rope(q->as<float>(), 1, H * hd, int(H), int(hd), 64, nullptr, 1e-6f, posb.as<int32_t>(),
                    sinks->as<float>(), s);
    }), 0);
  }
}

// --- matvec configuration sweep ----------------------------------------------

using LaunchFn = void (*)(const MatrixView&, const float*, int, int64_t, float*, int64_t, cudaStream_t);
struct Variant {
  const char* name;
  LaunchFn fn;
};

template <class Q, int T>
std::vector<Variant> variants() {
  using namespace detail;
  std::vector<Variant> v = {
      {"narrow R4 rows-first", &launch_matvec<Q, T, 4, false, true, false>},
      {"narrow R4 rows-first fact", &launch_matvec<Q, T, 4, false, true, true>},
      {"narrow R4 x-first fact", &launch_matvec<Q, T, 4, false, false, true>},
      {"narrow R2 rows-first fact", &launch_matvec<Q, T, 2, false, true, true>},
      {"narrow R8 rows-first fact", &launch_matvec<Q, T, 8, false, true, true>},
  };
  if constexpr (Q::kStep == 32) {
    v.push_back({"wide R4 x-first", &launch_matvec<Q, T, 4, true, false, false>});
    v.push_back({"wide R4 rows-first", &launch_matvec<Q, T, 4, true, true, false>});
    v.push_back({"wide R8 x-first", &launch_matvec<Q, T, 8, true, false, false>});
  }
  return v;
}

template <class Q, int T>
void sweep(cudaStream_t s, const Ceilings& c, const char* shape, int64_t rows, int64_t cols, const DeviceCopies& copies,
           const Buf& x, const Buf& out, const Buf& ref) {
  const uint64_t row_bytes = *dtype_bytes(Q::kType, uint64_t(cols));
  auto view = [&](int i) { return MatrixView{Q::kType, copies.ptrs[size_t(i) % copies.ptrs.size()], rows, cols, row_bytes}; };
  // The configuration matvec() picks, as the reference result.
  matvec(view(0), x.as<float>(), T, cols, ref.as<float>(), rows, s);
  BATON_CUDA_CHECK(cudaStreamSynchronize(s));  // s does not sync with the legacy stream
  std::vector<float> want(size_t(T * rows)), got(size_t(T * rows));
  BATON_CUDA_CHECK(cudaMemcpy(want.data(), ref.p, want.size() * 4, cudaMemcpyDeviceToHost));
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  const double bytes = double(copies.bytes) + 4.0 * double(T) * double(cols + rows);
  const double base_ms = time_graph(s, 64, 9, [&](int i) { matvec(view(i), x.as<float>(), T, cols, out.as<float>(), rows, s); });
  std::printf("%-8s %-20s %d %-26s %8.2f %7.0f %5.0f%%\n", dtype_name(Q::kType), shape, T, "(matvec default)", base_ms * 1e3,
              bytes / (base_ms * 1e6), 100.0 * bytes / (base_ms * 1e6) / c.copy_gbs);
  for (const Variant& v : variants<Q, T>()) {
    v.fn(view(0), x.as<float>(), T, cols, out.as<float>(), rows, s);
    BATON_CUDA_CHECK(cudaStreamSynchronize(s));
    BATON_CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 4, cudaMemcpyDeviceToHost));
    float diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::fabs(got[i] - want[i]));
    const bool ok = diff <= 1e-4f * scale;
    const double ms = time_graph(s, 64, 9, [&](int i) { v.fn(view(i), x.as<float>(), T, cols, out.as<float>(), rows, s); });
    std::printf("%-8s %-20s %d %-26s %8.2f %7.0f %5.0f%% %s\n", dtype_name(Q::kType), shape, T, v.name, ms * 1e3,
                bytes / (ms * 1e6), 100.0 * bytes / (ms * 1e6) / c.copy_gbs, ok ? "" : "MISMATCH");
  }
}

void bench_matvec_variants(cudaStream_t s, const Ceilings& c) {
  std::printf("\nmatvec configurations (us, GB/s, %% of copy; MISMATCH = differs from matvec())\n");
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"14336x4096", 14336, 4096}, {"4096x14336", 4096, 14336}, {"4096x2048", 4096, 2048}};
  Buf x(sizeof(float) * 14336 * 2), out(sizeof(float) * 14336 * 2), ref(sizeof(float) * 14336 * 2);
  const std::vector<float> hx = random_floats(14336 * 2, 41);
  BATON_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  for (const Shape& sh : shapes) {
    for (DType t : {DType::F16, DType::Q8_0, DType::Q6_K, DType::Q4_K, DType::Q2_K, DType::IQ2_XXS}) {
      const std::vector<uint8_t> host = host_matrix(t, sh.rows, sh.cols, 43);
      DeviceCopies copies(host);
      detail::dispatch_dtype(t, [&](auto q) {
        using Q = decltype(q);
        sweep<Q, 1>(s, c, sh.name, sh.rows, sh.cols, copies, x, out, ref);
        sweep<Q, 2>(s, c, sh.name, sh.rows, sh.cols, copies, x, out, ref);
      });
    }
  }
}

void bench_matmul(cudaStream_t s) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
  // cuBLAS's own scratch, given up front (32 MiB, as a plan would).
  Buf cublas_ws(size_t(32) << 20);
  cublasSetWorkspace(h, cublas_ws.p, size_t(32) << 20);
  std::printf("\nmatmul (prefill) through cuBLAS, whole matrix per GEMM\n");
  std::printf("%-8s %-12s %5s %10s %8s %12s\n", "type", "rows x cols", "T", "us", "TFLOP/s", "dequant us");
  struct Shape {
    int64_t rows, cols;
  };
  for (Shape sh : {Shape{4096, 4096}, Shape{14336, 4096}}) {
    for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q6_K, DType::Q4_K, DType::IQ2_XXS}) {
      const std::vector<uint8_t> host = host_matrix(t, sh.rows, sh.cols, 13);
      Buf w(host.size());
      BATON_CUDA_CHECK(cudaMemcpy(w.p, host.data(), host.size(), cudaMemcpyHostToDevice));
      const MatrixView mv{t, w.p, sh.rows, sh.cols, *dtype_bytes(t, sh.cols)};
      for (int64_t T : {int64_t(8), int64_t(64), int64_t(512)}) {
        const std::vector<float> hx = random_floats(size_t(T * sh.cols), 17);
        Buf x(hx.size() * 4), out(size_t(T * sh.rows) * 4);
        BATON_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        const size_t wsb = matmul_workspace_bytes(t, sh.cols, T, sh.rows);
        Buf ws(wsb);
        const double ms = time_calls(s, 10, 7, [&](int) {
          matmul(h, mv, x.as<float>(), T, sh.cols, out.as<float>(), sh.rows, ws.p, wsb, s);
        });
        double dq_ms = 0;
        if (t != DType::F16 && t != DType::BF16) {
          dq_ms = time_calls(s, 10, 7, [&](int) { dequantize_rows_f16(mv, 0, sh.rows, ws.as<uint8_t>() + (wsb - size_t(sh.rows * sh.cols) * 2), s); });
        }
        std::printf("%-8s %5lldx%-6lld %5lld %10.1f %8.1f %12.1f\n", dtype_name(t), (long long)sh.rows,
                    (long long)sh.cols, (long long)T, ms * 1e3, 2.0 * sh.rows * sh.cols * T / (ms * 1e9), dq_ms * 1e3);
      }
    }
  }
  // Crossover: at 8 tokens the matvec reads the weights once; past that it
  // reads them once per 8 tokens.
  std::printf("\nmatvec vs matmul, Q4_K 4096x4096 (us per call)\n%5s %10s %10s\n", "T", "matvec", "matmul");
  const std::vector<uint8_t> host = host_matrix(DType::Q4_K, 4096, 4096, 19);
  DeviceCopies copies(host);
  for (int64_t T : {int64_t(1), int64_t(8), int64_t(16), int64_t(32), int64_t(64)}) {
    const std::vector<float> hx = random_floats(size_t(T * 4096), 23);
    Buf x(hx.size() * 4), out(size_t(T * 4096) * 4);
    BATON_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    const size_t wsb = matmul_workspace_bytes(DType::Q4_K, 4096, T, 4096);
    Buf ws(wsb);
    auto view = [&](int i) { return MatrixView{DType::Q4_K, copies.ptrs[size_t(i) % copies.ptrs.size()], 4096, 4096, *dtype_bytes(DType::Q4_K, 4096)}; };
    const double mv = time_calls(s, 20, 7, [&](int i) { matvec(view(i), x.as<float>(), T, 4096, out.as<float>(), 4096, s); });
    const double mm = time_calls(s, 20, 7, [&](int i) {
      matmul(h, view(i), x.as<float>(), T, 4096, out.as<float>(), 4096, ws.p, wsb, s);
    });
    std::printf("%5lld %10.1f %10.1f\n", (long long)T, mv * 1e3, mm * 1e3);
  }
  cublasDestroy(h);
}

void bench_attention(cudaStream_t s, const Ceilings& c) {
  std::printf("\nattention (float32 KV cache)\n%-34s %10s %8s\n", "case", "us", "GB/s KV");
  struct Case {
    const char* name;
    int n_head, n_head_kv, d;
    int64_t n_tokens, pos0;
    bool split;
  };
  const Case cases[] = {{"decode 32/8x128 ctx 4096 split", 32, 8, 128, 1, 4095, true},
                        {"decode 32/8x128 ctx 4096 1-pass", 32, 8, 128, 1, 4095, false},
                        {"decode 32/8x128 ctx 32768 split", 32, 8, 128, 1, 32767, true},
                        {"decode 64/1x512 ctx 4096 split", 64, 1, 512, 1, 4095, true},
                        {"prefill 32/8x128 512 tokens", 32, 8, 128, 512, 0, false},
                        {"prefill 32/8x128 2048 tokens", 32, 8, 128, 2048, 0, false}};
  for (const Case& k : cases) {
    const int64_t n_pos = k.pos0 + k.n_tokens;
    const std::vector<float> hq = random_floats(size_t(k.n_tokens * k.n_head * k.d), 29);
    const std::vector<float> hkv = random_floats(size_t(n_pos * k.n_head_kv * k.d), 31);
    Buf q(hq.size() * 4), kc(hkv.size() * 4), vc(hkv.size() * 4), out(hq.size() * 4);
    BATON_CUDA_CHECK(cudaMemcpy(q.p, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    BATON_CUDA_CHECK(cudaMemcpy(kc.p, hkv.data(), hkv.size() * 4, cudaMemcpyHostToDevice));
    BATON_CUDA_CHECK(cudaMemcpy(vc.p, hkv.data(), hkv.size() * 4, cudaMemcpyHostToDevice));
    AttentionParams p;
    p.n_head = k.n_head;
    p.n_head_kv = k.n_head_kv;
    p.head_dim_k = p.head_dim_v = k.d;
    p.scale = 1.0f / std::sqrt(float(k.d));
    p.q = q.as<float>();
    p.q_stride = int64_t(k.n_head) * k.d;
    p.n_tokens = k.n_tokens;
    p.pos0 = k.pos0;
    p.k_cache = kc.as<float>();
    p.v_cache = vc.as<float>();
    p.out = out.as<float>();
    p.out_stride = p.q_stride;
    const size_t wsb = k.split ? attention_workspace_bytes(k.n_tokens, k.n_head, k.d) : 0;
    Buf ws(wsb);
    const double ms = time_calls(s, 10, 7, [&](int) { attention(p, k.split ? ws.p : nullptr, wsb, s); });
    const double kv_bytes = 2.0 * double(hkv.size()) * 4.0;
    std::printf("%-34s %10.1f %8.0f\n", k.name, ms * 1e3, k.n_tokens == 1 ? kv_bytes / (ms * 1e6) : 0.0);
  }
  (void)c;
}

void bench_sampling(cudaStream_t s) {
  const int64_t n = 129280;
  const std::vector<float> h = random_floats(size_t(n), 37);
  Buf x(size_t(n) * 4), ids(64 * 4), v(64 * 4), p(64 * 4), ws(top_k_workspace_bytes(n, 64));
  BATON_CUDA_CHECK(cudaMemcpy(x.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  std::printf("\nsampling over %lld logits (us, launch included)\n", (long long)n);
  const double am = time_calls(s, 20, 7, [&](int) { argmax(x.as<float>(), 1, n, n, ids.as<int32_t>(), s); });
  std::printf("argmax       %8.1f\n", am * 1e3);
  for (int k : {40, 64}) {
    const double tk = time_calls(s, 20, 7, [&](int) {
      top_k(x.as<float>(), n, k, 0.8f, ids.as<int32_t>(), v.as<float>(), p.as<float>(), ws.p, top_k_workspace_bytes(n, k), s);
    });
    std::printf("top_k k=%-3d  %8.1f\n", k, tk * 1e3);
  }
}

}  // namespace
}  // namespace baton::cuda

int main(int argc, char** argv) {
  using namespace baton::cuda;
  const std::string only = argc > 1 ? argv[1] : "";
  g_once = argc > 2 && std::string(argv[2]) == "once";
  try {
    cudaDeviceProp prop;
    BATON_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);
    cudaStream_t s;
    BATON_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const Ceilings c = measure_ceilings(s);
    if (only.empty() || only == "matvec") bench_matvec(s, c);
    if (only.empty() || only == "xq") bench_xq(s, c);
    if (only.empty() || only == "decode") bench_decode_ops(s);
    if (only.empty() || only == "ds4") bench_ds4_ops(s, c);
    if (only.empty() || only == "variants") bench_matvec_variants(s, c);
    if (only.empty() || only == "matmul") bench_matmul(s);
    if (only.empty() || only == "attention") bench_attention(s, c);
    if (only.empty() || only == "sampling") bench_sampling(s);
    BATON_CUDA_CHECK(cudaStreamSynchronize(s));
    BATON_CUDA_CHECK(cudaGetLastError());
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
