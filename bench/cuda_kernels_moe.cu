// bench_cuda_kernels moe: the routed experts of one DeepSeek V4 Flash layer
// for a batch of 1 to 64 rows, per (token, expert) pair (moe_decode_xq for
// the Q2 file's IQ2_XXS / Q2_K, moe_decode for the Q4 file's Q4_K) against
// by the expert (moe_grouped), at full shape: 256 experts of 2048 x 4096, top
// 6 of uniform random routing. Four routings are rotated so that consecutive
// calls read other experts (the layer's weights, 1.7 or 3.5 GB, are far
// larger than the L2). Each line gives us per call, the distinct experts the
// batch touches (mean over the four routings), their bytes over the time as
// GB/s and the fraction of the device copy rate, and the largest difference
// between the two paths' outputs relative to the largest output. Then the
// Q2 pair kernel's gate/up shapes and register bounds, and the grouped
// kernels' other splits (warps per 16-row tile in gate/up and down).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "bench/cuda_bench.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/moe_grouped_impl.cuh"
#include "kernels/cuda/moe_xq.cuh"
#include "kernels/cuda/moe_xq_impl.cuh"

namespace baton::cuda {

void bench_moe_grouped(cudaStream_t s, const Ceilings& c) {
  const int64_t E = 4096, ff = 2048, NE = 256, K = 6, max_rows = 64, n_sets = 4;
  std::printf("\nrouted experts of one Flash layer (256 x 2048 x 4096, top 6), us per call, graph replays of 16\n");
  std::printf("%-8s %5s %8s %10s %10s %8s %8s %7s %7s %9s\n", "experts", "rows", "touched", "pairs us", "grouped us",
              "speedup", "GB/s", "% copy", "pairs%", "max diff");
  std::mt19937_64 rng(97);
  Buf x(size_t(max_rows * E) * 4), xq(size_t(xq_row_bytes(E) * max_rows)), out_a(size_t(max_rows * E) * 4),
      out_b(size_t(max_rows * E) * 4), ids(size_t(n_sets * max_rows * K) * 4), wts(size_t(max_rows * K) * 4);
  {
    const std::vector<float> hx = random_floats(size_t(max_rows * E), 101);
    BATON_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    quantize_xq(x.as<float>(), E, max_rows, E, xq.p, s);
    std::vector<float> hw(size_t(max_rows * K));
    for (auto& w : hw) w = 0.05f + float(rng() % 1000) / 4000.0f;
    BATON_CUDA_CHECK(cudaMemcpy(wts.p, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
  }
  std::vector<int32_t> hid(size_t(n_sets * max_rows * K));
  for (int64_t t = 0; t < n_sets * max_rows; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(NE));
    for (int64_t e = 0; e < NE; ++e) all[size_t(e)] = int32_t(e);
    for (int64_t j = 0; j < K; ++j) {
      std::swap(all[size_t(j)], all[size_t(j) + size_t(rng() % uint64_t(NE - j))]);
      hid[size_t(t * K + j)] = all[size_t(j)];
    }
  }
  BATON_CUDA_CHECK(cudaMemcpy(ids.p, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));

  struct Case {
    const char* name;
    DType gate_up, down;
  };
  for (const Case& cs : {Case{"q2", DType::IQ2_XXS, DType::Q2_K}, Case{"q4", DType::Q4_K, DType::Q4_K}}) {
    const std::vector<uint8_t> g = host_matrix(cs.gate_up, NE * ff, E, 79);
    const std::vector<uint8_t> d = host_matrix(cs.down, NE * E, ff, 83);
    Buf gate(g.size()), up(g.size()), down(d.size());
    for (Buf* b : {&gate, &up}) BATON_CUDA_CHECK(cudaMemcpy(b->p, g.data(), g.size(), cudaMemcpyHostToDevice));
    BATON_CUDA_CHECK(cudaMemcpy(down.p, d.data(), d.size(), cudaMemcpyHostToDevice));
    MoeWeights m;
    m.gate = {{cs.gate_up, gate.p, NE * ff, E, *dtype_bytes(cs.gate_up, uint64_t(E))}, NE};
    m.up = {{cs.gate_up, up.p, NE * ff, E, *dtype_bytes(cs.gate_up, uint64_t(E))}, NE};
    m.down = {{cs.down, down.p, NE * E, ff, *dtype_bytes(cs.down, uint64_t(ff))}, NE};
    m.clamp = 10.0f;
    const bool xq_pairs = moe_xq_supported(m);
    const double expert_bytes = 2.0 * double(ff) * double(m.gate.w.row_bytes) + double(E) * double(m.down.w.row_bytes);
    const size_t pair_ws = xq_pairs ? moe_xq_workspace_bytes(m, max_rows, int(K))
                                    : moe_decode_workspace_bytes(m, max_rows, int(K));
    Buf pws(pair_ws), gws(moe_grouped_workspace_bytes(m, max_rows, int(K)));
    // The largest |out_a - out_b| over n rows, relative to the largest |out_a|.
    auto rel_diff = [&](int64_t n) {
      BATON_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<float> a(size_t(n * E)), b(size_t(n * E));
      BATON_CUDA_CHECK(cudaMemcpy(a.data(), out_a.p, a.size() * 4, cudaMemcpyDeviceToHost));
      BATON_CUDA_CHECK(cudaMemcpy(b.data(), out_b.p, b.size() * 4, cudaMemcpyDeviceToHost));
      double amax = 0, diff = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        amax = std::max(amax, double(std::fabs(a[i])));
        diff = std::max(diff, double(std::fabs(a[i] - b[i])));
      }
      return amax > 0 ? diff / amax : diff;
    };
    for (int64_t n : {1, 2, 5, 8, 16, 32, 64}) {
      double touched = 0;
      for (int64_t set = 0; set < n_sets; ++set) {
        const int32_t* p = hid.data() + set * max_rows * K;
        touched += double(std::set<int32_t>(p, p + n * K).size()) / double(n_sets);
      }
      auto id_set = [&](int i) { return ids.as<int32_t>() + (i % n_sets) * max_rows * K; };
      auto pairs = [&](int i, float* o) {
        if (xq_pairs) {
          moe_decode_xq(m, xq.p, n, id_set(i), wts.as<float>(), int(K), o, E, pws.p, pair_ws, s);
        } else {
          moe_decode(m, x.as<float>(), n, E, id_set(i), wts.as<float>(), int(K), o, E, pws.p, pair_ws, s);
        }
      };
      auto grouped = [&](int i, float* o) {
        moe_grouped(m, xq.p, n, id_set(i), wts.as<float>(), int(K), o, E, gws.p, gws.bytes(), s);
      };
      pairs(0, out_a.as<float>());
      grouped(0, out_b.as<float>());
      const double rel = rel_diff(n);
      const double tp = time_graph(s, 16, 5, [&](int i) { pairs(i, out_a.as<float>()); });
      const double tg = time_graph(s, 16, 5, [&](int i) { grouped(i, out_b.as<float>()); });
      const double bytes = touched * expert_bytes;
      std::printf("%-8s %5lld %8.1f %10.1f %10.1f %7.2fx %8.0f %6.1f%% %6.1f%% %9.2e\n", cs.name, (long long)n, touched,
                  tp * 1e3, tg * 1e3, tp / tg, bytes / (tg * 1e6), 100.0 * bytes / (tg * 1e6) / c.copy_gbs,
                  100.0 * bytes / (tp * 1e6) / c.copy_gbs, rel);
    }
    auto pairs_out = [&](int64_t n) {
      if (xq_pairs) {
        moe_decode_xq(m, xq.p, n, ids.as<int32_t>(), wts.as<float>(), int(K), out_a.as<float>(), E, pws.p, pair_ws, s);
      } else {
        moe_decode(m, x.as<float>(), n, E, ids.as<int32_t>(), wts.as<float>(), int(K), out_a.as<float>(), E, pws.p,
                   pair_ws, s);
      }
    };
    using Launch = void (*)(const MoeWeights&, const void*, int64_t, const int32_t*, const float*, int, float*,
                            int64_t, void*, cudaStream_t);
    // Per row count, each launcher's time and its largest difference from
    // the pairs' output; ws: the launchers' workspace.
    auto variant_table = [&](const char* title, std::span<const std::pair<const char*, Launch>> variants, void* ws) {
      std::printf("%s %s, us per call (largest difference from the pairs' output):\n", cs.name, title);
      for (int64_t n : {1, 2, 5, 8, 16, 32, 64}) {
        std::printf("%-8s %5lld", cs.name, (long long)n);
        pairs_out(n);
        for (const auto& v : variants) {
          auto run = [&](int i) {
            v.second(m, xq.p, n, ids.as<int32_t>() + (i % n_sets) * max_rows * K, wts.as<float>(), int(K),
                     out_b.as<float>(), E, ws, s);
          };
          run(0);
          const double diff = rel_diff(n);
          const double t = time_graph(s, 16, 5, run);
          std::printf("  %s %7.1f (%.1e)", v.first, t * 1e3, diff);
        }
        std::printf("\n");
      }
    };
    if (xq_pairs) {
      // The pair kernel's gate/up shapes and register bounds (ncu had the
      // unbounded 8 x 4 at 76 registers: 3 blocks of 256 threads per SM).
      using L = detail::Iq2Lookup<true, false>;
      const std::pair<const char*, Launch> pair_variants[] = {
          {"gu8x4", &detail::launch_moe_decode_xq<8, 4, L>},
          {"gu8x4/4", &detail::launch_moe_decode_xq<8, 4, L, 4>},
          {"gu16x2/2", &detail::launch_moe_decode_xq<16, 2, L, 2>}};
      variant_table("pairs, gate/up warps x rows / min blocks per SM", pair_variants, pws.p);
    }
    const std::pair<const char*, Launch> splits[] = {{"1/1", &detail::launch_moe_grouped<1, 1>},
                                                     {"2/2", &detail::launch_moe_grouped<2, 2>},
                                                     {"4/2", &detail::launch_moe_grouped<4, 2>},
                                                     {"2/4", &detail::launch_moe_grouped<2, 4>},
                                                     {"4/4", &detail::launch_moe_grouped<4, 4>}};
    variant_table("grouped, warps per tile gate|up/down", splits, gws.p);
  }
}

}  // namespace baton::cuda
