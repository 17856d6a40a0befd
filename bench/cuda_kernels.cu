// CUDA kernel micro-benchmark: measures the device's copy and read bandwidth,
// then the decode matvecs (GB/s of weights against those ceilings), the
// prefill matmul (TFLOP/s, and the share of dequantization), attention and
// sampling. Weights are realistic random blocks, rotated over enough copies
// that the working set is several times the L2 cache, and matvecs are timed
// as CUDA graph replays so launch gaps do not count. Prints a table.
//
//   bench_cuda_kernels            all sections
//   bench_cuda_kernels matvec     one section (matvec, xq, decode, ds4, moe, variants, matmul, attention, sampling)
//   bench_cuda_kernels ds4 once   each kernel of the section once, untimed (for a profiler)
//
// The `variants` section times the matvec kernel's other configurations
// (step width, rows per block, load order, factored scales; see
// matvec_impl.cuh) against the
// one matvec.cu picks, after checking that each computes the same result.
// The decode-step sections (decode, ds4) live in cuda_kernels_decode.cu, the
// helpers every section uses in cuda_bench.cuh.
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

#include "bench/cuda_bench.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matmul_small.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/matvec_impl.cuh"
#include "kernels/cuda/matvec_xq_impl.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/quant.h"

namespace baton::cuda {
namespace {

__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads alive
}

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
  // Crossover of a batch's projections: the matvecs read the weights once
  // per 8 tokens, the matmul once (plus its F16 tile); the batched decode
  // (engine/cuda/stages/llama_forward.cpp) picks by these figures.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4096, 4096}, {28672, 4096}, {4096, 14336}}) {
    std::printf("\nmatvec vs integer-dot matvec vs small_matmul vs matmul, Q4_K %lldx%lld (us per call)\n"
                "%5s %10s %10s %12s %10s\n",
                (long long)rows, (long long)cols, "T", "matvec", "matvec_xq", "small_matmul", "matmul");
    const std::vector<uint8_t> host = host_matrix(DType::Q4_K, rows, cols, 19);
    DeviceCopies copies(host);
    for (int64_t T : {int64_t(1), int64_t(8), int64_t(16), int64_t(24), int64_t(32), int64_t(48), int64_t(64),
                      int64_t(96), int64_t(128)}) {
      const std::vector<float> hx = random_floats(size_t(T * cols), 23);
      Buf x(hx.size() * 4), out(size_t(T * rows) * 4), xq(size_t(T) * xq_row_bytes(cols));
      BATON_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
      quantize_xq(x.as<float>(), cols, T, cols, xq.p, s);
      const size_t wsb = std::max(matmul_workspace_bytes(DType::Q4_K, cols, T, rows),
                                  small_matmul_workspace_bytes(rows, cols, std::min<int64_t>(T, kSmallMatmulMaxTokens)));
      Buf ws(wsb);
      auto view = [&](int i) {
        return MatrixView{DType::Q4_K, copies.ptrs[size_t(i) % copies.ptrs.size()], rows, cols,
                          *dtype_bytes(DType::Q4_K, cols)};
      };
      const double mv = time_calls(s, 20, 7, [&](int i) { matvec(view(i), x.as<float>(), T, cols, out.as<float>(), rows, s); });
      const double mq = time_calls(s, 20, 7, [&](int i) { matvec_xq(view(i), xq.p, T, out.as<float>(), rows, s); });
      const double mm = time_calls(s, 20, 7, [&](int i) {
        matmul(h, view(i), x.as<float>(), T, cols, out.as<float>(), rows, ws.p, wsb, s);
      });
      double sm = 0;
      if (T <= kSmallMatmulMaxTokens) {
        sm = time_calls(s, 20, 7, [&](int i) { small_matmul(view(i), x.as<float>(), T, cols, out.as<float>(), rows, ws.p, wsb, s); });
      }
      std::printf("%5lld %10.1f %10.1f %12.1f %10.1f\n", (long long)T, mv * 1e3, mq * 1e3, sm * 1e3, mm * 1e3);
    }
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
    if (only.empty() || only == "moe") bench_moe_grouped(s, c);
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
