// The integer-dot matvec kernel and its launcher (device-only; include from
// .cu files). matvec_xq.cu picks the configuration per dtype; the
// micro-benchmark instantiates others to compare them.
//
// Activations come quantized (xq.cuh): per run of 32, int8 planes hi and lo
// with q = 256 hi + lo, a scale d and the float sum. A weight block is
// split between kLanes neighbouring threads that each own 16 bytes of its
// quants, so a warp reads whole blocks with 16-byte loads, neighbouring
// threads neighbouring bytes. Each thread loads its piece of R rows first
// (all loads in flight together), then the matching x piece once per token,
// and takes two dp4a per 4 weights (one with hi, one with lo), exact in
// int32; the block scales turn the integer sums into float per 16 or 32
// weights. Partial sums are reduced per warp with shuffles, then across
// warps through shared memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda::detail {

constexpr int kXqThreads = 128;

__device__ __forceinline__ uint4 ld_x128(const int8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// sum_k w[k] . x[k] over 4 words of 4 signed bytes.
__device__ __forceinline__ int dot16(const uint32_t* w, uint4 x) {
  int s = __dp4a(int(w[0]), int(x.x), 0);
  s = __dp4a(int(w[1]), int(x.y), s);
  s = __dp4a(int(w[2]), int(x.z), s);
  return __dp4a(int(w[3]), int(x.w), s);
}

// Q8_0 (34 bytes: f16 d, int8 q[32]): two threads per block, 16 quants
// each. Blocks are 2-byte aligned, so the quants are read as aligned words
// realigned with funnel shifts (ld_words_a2).
struct XqQ8_0 {
  static constexpr DType kType = DType::Q8_0;
  static constexpr int kQK = 32, kBytes = 34, kLanes = 2;
  struct W {
    uint32_t q[4];
    uint32_t d;
  };
  struct X {
    uint4 h, l;
    float d;
  };
  __device__ static W load_w(const uint8_t* b, int c) {
    W w;
    ld_words_a2<4>(b + 2 + 16 * c, w.q);
    w.d = ld_u16(b);
    return w;
  }
  __device__ static X load_x(const XqRow& x, int64_t blk, int c) {
    const int64_t e = blk * 32 + 16 * c;
    return {ld_x128(x.hi + e), ld_x128(x.lo + e), x.ds[blk].x};
  }
  __device__ static float dot(const W& w, const X& x, int) {
    const int t = dot16(w.q, x.h) * 256 + dot16(w.q, x.l);
    return half_bits_to_float(w.d) * x.d * float(t);
  }
};

// Q4_K (144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins,
// qs[128]): eight threads per block. Thread c owns qs[16c, 16c + 16): the
// low nibbles are elements 16h..16h+15 of sub-block 2p, the high nibbles the
// same elements of sub-block 2p + 1 (p = c / 2, h = c % 2). Each thread also
// reads the 16-byte header (the eight threads of a block read the same
// address: one transaction). The minimum term dmin * m * sum x needs the sum
// of a whole sub-block: thread h = 0 adds it for sub-block 2p, h = 1 for 2p + 1.
struct XqQ4_K {
  static constexpr DType kType = DType::Q4_K;
  static constexpr int kQK = 256, kBytes = 144, kLanes = 8;
  struct W {
    uint4 hdr, q;
  };
  struct X {
    uint4 ha, la, hb, lb;
    float2 da, db;
  };
  __device__ static W load_w(const uint8_t* b, int c) { return {ld_u128(b), ld_u128(b + 16 + 16 * c)}; }
  __device__ static X load_x(const XqRow& x, int64_t blk, int c) {
    const int64_t sa = blk * 8 + 2 * (c >> 1);
    const int64_t e = sa * 32 + 16 * (c & 1);
    return {ld_x128(x.hi + e), ld_x128(x.lo + e), ld_x128(x.hi + e + 32), ld_x128(x.lo + e + 32),
            __ldg(x.ds + sa), __ldg(x.ds + sa + 1)};
  }
  // 6-bit scale and min of sub-block j from the packed words at bytes 4-15.
  __device__ static void scale_min(const uint4& hdr, int j, int& sc, int& m) {
    const int k = 8 * (j & 3);
    const uint32_t a = hdr.y >> k, b = hdr.z >> k, c = hdr.w >> k;
    if (j < 4) {
      sc = int(a & 63), m = int(b & 63);
    } else {
      sc = int((c & 15) | ((a >> 2) & 0x30)), m = int(((c >> 4) & 15) | ((b >> 2) & 0x30));
    }
  }
  __device__ static float dot(const W& w, const X& x, int c) {
    const uint32_t lo[4] = {w.q.x & 0x0f0f0f0fu, w.q.y & 0x0f0f0f0fu, w.q.z & 0x0f0f0f0fu, w.q.w & 0x0f0f0f0fu};
    const uint32_t hi[4] = {(w.q.x >> 4) & 0x0f0f0f0fu, (w.q.y >> 4) & 0x0f0f0f0fu, (w.q.z >> 4) & 0x0f0f0f0fu,
                            (w.q.w >> 4) & 0x0f0f0f0fu};
    const int ta = dot16(lo, x.ha) * 256 + dot16(lo, x.la);
    const int tb = dot16(hi, x.hb) * 256 + dot16(hi, x.lb);
    const int j = 2 * (c >> 1);
    int sca, ma, scb, mb;
    scale_min(w.hdr, j, sca, ma);
    scale_min(w.hdr, j + 1, scb, mb);
    const float d = half_bits_to_float(w.hdr.x & 0xffffu), dmin = half_bits_to_float(w.hdr.x >> 16);
    const float mins = (c & 1) ? float(mb) * x.db.y : float(ma) * x.da.y;
    return fmaf(d, fmaf(float(sca * ta), x.da.x, float(scb * tb) * x.db.x), -dmin * mins);
  }
};

// Q4_K with four threads per block: thread c owns qs[32c, 32c + 32), the
// whole of sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles), so the
// header's scales, the conversions and the minimum terms are paid once per
// 32 bytes of quants instead of once per 16 (XqQ4_K), at the price of twice
// the registers per row.
struct XqQ4_K32 {
  static constexpr DType kType = DType::Q4_K;
  static constexpr int kQK = 256, kBytes = 144, kLanes = 4;
  struct W {
    uint4 hdr, q0, q1;
  };
  struct X {
    uint4 ha0, ha1, la0, la1, hb0, hb1, lb0, lb1;
    float2 da, db;
  };
  __device__ static W load_w(const uint8_t* b, int c) {
    return {ld_u128(b), ld_u128(b + 16 + 32 * c), ld_u128(b + 32 + 32 * c)};
  }
  __device__ static X load_x(const XqRow& x, int64_t blk, int c) {
    const int64_t sa = blk * 8 + 2 * c;
    const int64_t e = sa * 32;
    return {ld_x128(x.hi + e),      ld_x128(x.hi + e + 16), ld_x128(x.lo + e),      ld_x128(x.lo + e + 16),
            ld_x128(x.hi + e + 32), ld_x128(x.hi + e + 48), ld_x128(x.lo + e + 32), ld_x128(x.lo + e + 48),
            __ldg(x.ds + sa),       __ldg(x.ds + sa + 1)};
  }
  __device__ static float dot(const W& w, const X& x, int c) {
    const uint32_t q[8] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w, w.q1.x, w.q1.y, w.q1.z, w.q1.w};
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) lo[i] = q[i] & 0x0f0f0f0fu, hi[i] = (q[i] >> 4) & 0x0f0f0f0fu;
    const int ta = (dot16(lo, x.ha0) + dot16(lo + 4, x.ha1)) * 256 + dot16(lo, x.la0) + dot16(lo + 4, x.la1);
    const int tb = (dot16(hi, x.hb0) + dot16(hi + 4, x.hb1)) * 256 + dot16(hi, x.lb0) + dot16(hi + 4, x.lb1);
    int sca, ma, scb, mb;
    XqQ4_K::scale_min(w.hdr, 2 * c, sca, ma);
    XqQ4_K::scale_min(w.hdr, 2 * c + 1, scb, mb);
    const float d = half_bits_to_float(w.hdr.x & 0xffffu), dmin = half_bits_to_float(w.hdr.x >> 16);
    const float mins = fmaf(float(ma), x.da.y, float(mb) * x.db.y);
    return fmaf(d, fmaf(float(sca * ta), x.da.x, float(scb * tb) * x.db.x), -dmin * mins);
  }
};

// Whether output row g (a column of the Q|K|V row) starts a RoPE pair, and
// its angle's cosine and sine: pos * inv_freq in double, as rope() does.
__device__ __forceinline__ bool qkv_rope_angle(const QkvRope& e, int64_t g, float& c, float& s) {
  if (g >= e.q_rows + e.k_rows) return false;
  const int d = int(g % e.head_dim);
  if (d >= e.rot_dim) return false;
  double sn, cs;
  sincos(double(*e.pos) * double(e.inv_freq[d / 2]), &sn, &cs);
  c = float(cs), s = float(sn);
  return true;
}

// The QkvRope epilogue (matvec.cuh) of rows row0 and row0 + 1: an
// interleaved RoPE pair when they are Q or K (rotate), then the output and
// the cache row.
__device__ __forceinline__ void qkv_rope_pair(const QkvRope& e, int64_t row0, float v0, float v1, bool rotate, float c,
                                              float s, float* out) {
  const int64_t g = e.first_row + row0;
  if (rotate) {
    const float x0 = v0, x1 = v1;
    v0 = x0 * c - x1 * s;
    v1 = x0 * s + x1 * c;
  }
  out[row0] = v0;
  out[row0 + 1] = v1;
  const int64_t p = *e.cache_pos;
  if (g >= e.q_rows + e.k_rows) {
    float* dst = e.v_cache + p * e.v_rows + (g - e.q_rows - e.k_rows);
    dst[0] = v0, dst[1] = v1;
  } else if (g >= e.q_rows) {
    float* dst = e.k_cache + p * e.k_rows + (g - e.q_rows);
    dst[0] = v0, dst[1] = v1;
  }
}

// One-token kernels of two rows keep 8 blocks of 128 threads per SM (at
// most 64 registers): a 4096-row matrix is then one wave of 2048 blocks.
// kMinBlocks > 0 sets that bound instead (the micro-benchmark's sweep).
template <class K, int R, int T, bool kRope, bool kPipe, int kMinBlocks = 0>
__global__ void __launch_bounds__(kXqThreads, kMinBlocks > 0 ? kMinBlocks : (R * T <= 2 ? 8 : 1))
    matvec_xq_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                     const uint8_t* __restrict__ xq, uint64_t xq_stride, int n_tokens, float* __restrict__ out,
                     int64_t out_stride, QkvRope rope) {
  static_assert(!kRope || (R % 2 == 0 && T == 1), "the RoPE epilogue takes pairs of rows of one token");
  const int64_t row0 = int64_t(blockIdx.x) * R;
  // Rows past the end and tokens past n_tokens repeat the last valid one;
  // their results are not written.
  const uint8_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + uint64_t(min(row0 + r, rows - 1)) * row_bytes;
  XqRow xr[T];
#pragma unroll
  for (int t = 0; t < T; ++t) xr[t] = xq_row(xq + uint64_t(min(t, n_tokens - 1)) * xq_stride, cols);

  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  }
  const int c = int(threadIdx.x) % K::kLanes;
  const int64_t n_blocks = cols / K::kQK;
  const int64_t step = blockDim.x / K::kLanes;
  int64_t b = threadIdx.x / K::kLanes;
  // The first weights are loaded before pdl_wait(): weights are never written
  // by the kernels of a forward, so under programmatic dependent launch
  // (pdl.cuh) these loads overlap the kernel that produces x, and a 4096-wide
  // Q4_K row (one block per thread) is entirely in registers by then.
  typename K::W wv[R];
  if (b < n_blocks) {
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = K::load_w(wr[r] + uint64_t(b) * K::kBytes, c);
  }
  // The RoPE angles of the block's pairs (a double sincos each, hundreds of
  // cycles) on the last warp, before pdl_wait(): they overlap the kernel
  // before instead of delaying this warp's dot products. The position and
  // the frequencies are not written by any kernel of the step (the step's
  // parameter copy completes before its first kernel starts; pdl.cuh).
  __shared__ float rope_cs[kRope ? R / 2 : 1][3];
  if constexpr (kRope) {
    const int p = int(threadIdx.x) - int(blockDim.x - 32);
    if (p >= 0 && p < R / 2) {
      float cs = 1.0f, sn = 0.0f;
      const bool rotate = qkv_rope_angle(rope, rope.first_row + row0 + 2 * p, cs, sn);
      rope_cs[p][0] = rotate ? 1.0f : 0.0f, rope_cs[p][1] = cs, rope_cs[p][2] = sn;
    }
  }
  pdl_trigger();
  pdl_wait();
  // Rows of several steps per thread (kPipe): the next step's weights are
  // loaded before this step's dot products, two steps of loads in flight.
  if constexpr (kPipe) {
    while (b < n_blocks) {
      const int64_t nb = b + step;
      typename K::W wn[R];
      if (nb < n_blocks) {
#pragma unroll
        for (int r = 0; r < R; ++r) wn[r] = K::load_w(wr[r] + uint64_t(nb) * K::kBytes, c);
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const typename K::X xv = K::load_x(xr[t], b, c);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] += K::dot(wv[r], xv, c);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r] = wn[r];
      b = nb;
    }
  } else {
    while (b < n_blocks) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const typename K::X xv = K::load_x(xr[t], b, c);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] += K::dot(wv[r], xv, c);
      }
      b += step;
      if (b < n_blocks) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r] = K::load_w(wr[r] + uint64_t(b) * K::kBytes, c);
      }
    }
  }

  __shared__ float partial[kXqThreads / 32][R * T];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0) partial[warp][r * T + t] = v;
    }
  }
  __syncthreads();
  if constexpr (kRope) {
    const int p = int(threadIdx.x);
    if (p < R / 2 && row0 + 2 * p < rows) {  // rows is even
      float v0 = 0.0f, v1 = 0.0f;
      for (int k = 0; k < int(blockDim.x >> 5); ++k) v0 += partial[k][2 * p], v1 += partial[k][2 * p + 1];
      qkv_rope_pair(rope, row0 + 2 * p, v0, v1, rope_cs[p][0] != 0.0f, rope_cs[p][1], rope_cs[p][2], out);
    }
    return;
  }
  if (threadIdx.x < R * T) {
    const int r = threadIdx.x / T, t = threadIdx.x % T;
    float v = 0.0f;
    for (int k = 0; k < int(blockDim.x >> 5); ++k) v += partial[k][threadIdx.x];
    if (row0 + r < rows && t < n_tokens) out[int64_t(t) * out_stride + row0 + r] = v;
  }
}

// The threads of a block: short rows get fewer (at least one warp, always
// a multiple of kLanes); each thread takes one kLanes-th of a weight block.
template <class K>
int xq_threads(const MatrixView& w) {
  const int64_t units = w.cols / K::kQK * K::kLanes;
  // XqQ4_K32 takes about 128 registers: 64-thread blocks fit 8 per SM, so
  // that a 1024-block grid (llama-8b's down projection) is one wave.
  const int64_t cap = std::is_same_v<K, XqQ4_K32> ? 64 : kXqThreads;
  return int(std::clamp<int64_t>((units + 31) / 32 * 32, 32, cap));
}

template <class K, int R, int T, bool kRope, bool kPipe, int kMinBlocks = 0>
void launch_xq_kernel(const MatrixView& w, const void* xq, uint64_t xq_stride, int n_tokens, float* out,
                      int64_t out_stride, cudaStream_t stream, const QkvRope& rope) {
  static_assert(R * T <= 32, "the reduction's last step runs on one warp");
  const int64_t blocks = (w.rows + R - 1) / R;
  launch_pdl("matvec_xq_kernel", matvec_xq_kernel<K, R, T, kRope, kPipe, kMinBlocks>, dim3(unsigned(blocks)),
             dim3(xq_threads<K>(w)), 0, stream, static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols,
             static_cast<const uint8_t*>(xq), xq_stride, n_tokens, out, out_stride, rope);
}

// One chunk of n_tokens <= T tokens. Software pipelining only where a
// thread takes more than one step along the row and the second set of
// weight registers is affordable (R * sizeof(W) <= 64 bytes); a one-step row
// would only lose occupancy to it.
template <class K, int R, int T, bool kRope>
void launch_matvec_xq_epilogue(const MatrixView& w, const void* xq, uint64_t xq_stride, int n_tokens, float* out,
                               int64_t out_stride, cudaStream_t stream, const QkvRope& rope) {
  constexpr bool kPipeable = R * sizeof(typename K::W) <= 64;
  if (kPipeable && w.cols / K::kQK * K::kLanes > xq_threads<K>(w)) {
    launch_xq_kernel<K, R, T, kRope, kPipeable>(w, xq, xq_stride, n_tokens, out, out_stride, stream, rope);
  } else {
    launch_xq_kernel<K, R, T, kRope, false>(w, xq, xq_stride, n_tokens, out, out_stride, stream, rope);
  }
}

template <class K, int R, int T>
void launch_matvec_xq(const MatrixView& w, const void* xq, uint64_t xq_stride, int n_tokens, float* out,
                      int64_t out_stride, cudaStream_t stream) {
  launch_matvec_xq_epilogue<K, R, T, false>(w, xq, xq_stride, n_tokens, out, out_stride, stream, QkvRope{});
}

// n_tokens in chunks of at most kMatvecMaxTokens, one launch each:
// fn(K{}, std::integral_constant<int, T>{}, t0, nt) for the chunk of nt
// tokens from t0, K the block type of dtype t (Q8_0 or Q4_K) and T the
// kernel's token count that holds nt (1, 2, 4 or 8).
template <class Fn>
void for_token_chunks(DType t, int64_t n_tokens, Fn&& fn) {
  static_assert(kMatvecMaxTokens == 8, "the token counts below end at 8");
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kMatvecMaxTokens) {
    const int nt = int(std::min<int64_t>(kMatvecMaxTokens, n_tokens - t0));
    auto go = [&](auto k) {
      if (nt == 1) {
        fn(k, std::integral_constant<int, 1>{}, t0, nt);
      } else if (nt == 2) {
        fn(k, std::integral_constant<int, 2>{}, t0, nt);
      } else if (nt <= 4) {
        fn(k, std::integral_constant<int, 4>{}, t0, nt);
      } else {
        fn(k, std::integral_constant<int, 8>{}, t0, nt);
      }
    };
    if (t == DType::Q8_0) go(XqQ8_0{});
    else go(XqQ4_K{});
  }
}

// One token with a chosen pipelining and register bound (kMinBlocks 0: the
// default bound), the micro-benchmark's comparisons.
template <class K, int R, bool kPipe, int kMinBlocks>
void launch_matvec_xq_bounded(const MatrixView& w, const void* xq, uint64_t xq_stride, int n_tokens, float* out,
                              int64_t out_stride, cudaStream_t stream) {
  launch_xq_kernel<K, R, 1, false, kPipe, kMinBlocks>(w, xq, xq_stride, n_tokens, out, out_stride, stream, QkvRope{});
}

}  // namespace baton::cuda::detail
