// The decode-step sections of the CUDA kernel micro-benchmark
// (bench/cuda_kernels.cu): the small kernels of one llama-8b layer and the
// DeepSeek V4 Flash decode kernels.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cuda_bench.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/ds4_attention.cuh"
#include "kernels/cuda/ds4_compressor.cuh"
#include "kernels/cuda/ds4_hc.cuh"
#include "kernels/cuda/ds4_indexer.cuh"
#include "kernels/cuda/ds4_norm_rope.cuh"
#include "kernels/cuda/ds4_router.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe_xq.cuh"
#include "kernels/cuda/moe_xq_impl.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace baton::cuda {

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

}  // namespace baton::cuda
