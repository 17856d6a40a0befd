// Small-batch tensor-core matmul over quantized weights (matmul_small.cuh).
//
// Q4_K (the files people run) has a kernel of its own that never puts W in
// shared memory: each warp owns 16 rows of W, loads its Q4_K blocks straight
// into registers (lane c of a row group owns qs bytes [32c, 32c + 32): the
// whole of sub-blocks 2c and 2c + 1, so two scale pairs per row), turns the
// nibbles into the F16 A fragments of mma.m16n8k16 in registers, and takes
// x from shared memory in an order permuted to match (x_to_half_q4k). The
// dot product's k order does not matter as long as A and B agree, so the
// permutation costs nothing at run time. The next tile's weights are loaded
// while the current one is multiplied.
//
// The other dtypes: 8 warps, 128 rows of W (warp w owns rows [16w, 16w +
// 16)), all NT token rows of x (NT = 16, 32 or 64), a range of 256-column
// tiles, each in four passes of 64 columns: the block dequantizes its 128 x
// 64 slice of W to F16 in shared memory, copies the NT x 64 slice of x
// (already F16 in the workspace), then each warp runs 4 k-steps of WMMA over
// its rows and every 16-token group. Shared rows are padded by 8 halves:
// rows start 4 banks apart, and WMMA needs only 32-byte aligned tiles and a
// stride that is a multiple of 8 halves.
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/matmul_small.cuh"

#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace baton::cuda {
namespace {

using namespace detail;
namespace wmma = nvcuda::wmma;

constexpr int kWarps = 8;
constexpr int kRows = 16 * kWarps;  // rows of W per block
constexpr int kTileK = 256;         // columns per tile: a whole block of every K-quant
constexpr int kSubK = 64;           // columns multiplied per pass over shared memory
constexpr int kLd = kSubK + 8;      // shared row stride in halves (144 bytes: rows start 4 banks apart)
constexpr int kQ4KBytes = 144;      // one Q4_K block: a tile's row
// Split K until about this many blocks run. The Q4_K kernel wants more
// (bench_cuda_kernels matmul: 28672 x 4096 at 8 rows took 53 us in 2 splits,
// 41 in 4): a block has few warps, each bound by its loads' latency.
constexpr int kTargetBlocks = 256, kTargetBlocksQ4K = 1024;
constexpr int kMaxSplits = 8;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t row_blocks(int64_t rows) { return (rows + kRows - 1) / kRows; }

// K tiles per split and the split count: enough blocks to fill the GPU,
// each split at least one tile.
int splits_for(int64_t rows, int64_t cols, int target) {
  const int64_t tiles = cols / kTileK;
  const int64_t want = (target + row_blocks(rows) - 1) / row_blocks(rows);
  return int(std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxSplits, tiles)));
}

int token_tile(int64_t n_tokens) { return n_tokens <= 16 ? 16 : n_tokens <= 32 ? 32 : 64; }

// Tiles per split as launched, and the split count that follows from it.
int64_t tiles_per_split(int64_t rows, int64_t cols, int target) {
  const int64_t tiles = cols / kTileK;
  const int splits = splits_for(rows, cols, target);
  return (tiles + splits - 1) / splits;
}
int launched_splits(int64_t rows, int64_t cols, int target) {
  const int64_t per = tiles_per_split(rows, cols, target);
  return int((cols / kTileK + per - 1) / per);
}

// The dtypes it is built for: those of the llama-family files people run.
template <class Q>
constexpr bool kSmallType = std::is_same_v<Q, DqQ8_0> || std::is_same_v<Q, DqQ4_0> || std::is_same_v<Q, DqQ4_K> ||
                            std::is_same_v<Q, DqQ5_K> || std::is_same_v<Q, DqQ6_K>;

template <class Fn>
bool dispatch_small(DType t, Fn&& fn) {
  bool taken = false;
  dispatch_dtype(t, [&](auto q) {
    if constexpr (kSmallType<decltype(q)>) {
      taken = true;
      fn(q);
    }
  });
  return taken;
}

__global__ void x_to_half_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n_tokens, int64_t cols,
                                 int64_t nt, __half* __restrict__ out) {
  const int64_t total = nt * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / cols, c = i % cols;
    out[i] = __float2half_rn(t < n_tokens ? x[t * x_stride + c] : 0.0f);
  }
}

// Partials [split][NT][rows_pad] floats; block (bx, s) writes its 128 rows of
// every token row of split s.
template <class Q, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    small_matmul_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                        const __half* __restrict__ xh, int tiles_per_split, float* __restrict__ partial,
                        int64_t rows_pad) {
  static_assert(Q::kStep == 32, "runs of 32 values");
  constexpr int kRuns = kRows * (kSubK / 32) / (kWarps * 32);
  extern __shared__ __align__(128) unsigned char smem[];
  __half* ws = reinterpret_cast<__half*>(smem);  // kRows x kLd
  __half* xs = ws + kRows * kLd;                 // NT x kLd
  const int warp = threadIdx.x >> 5;
  const int64_t r0 = int64_t(blockIdx.x) * kRows;
  const int64_t tiles = cols / kTileK;
  const int64_t t_begin = int64_t(blockIdx.y) * tiles_per_split;
  const int64_t t_end = t_begin + tiles_per_split < tiles ? t_begin + tiles_per_split : tiles;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NT / 16];
#pragma unroll
  for (int j = 0; j < NT / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);

  for (int64_t tile = t_begin; tile < t_end; ++tile) {
    const int64_t k0 = tile * kTileK;
    // The tile in passes of kSubK columns, so that the F16 slices of W
    // and x in shared memory stay small and 4-5 blocks share an SM (the
    // kernel is bound by latency: more warps hide it).
    for (int sub = 0; sub < kTileK / kSubK; ++sub) {
      const int64_t ks = k0 + sub * kSubK;
      // W: kRows x kSubK values in runs of 32 (a sub-block or a small
      // block: the header is decoded once per run).
#pragma unroll
      for (int u = 0; u < kRuns; ++u) {
        const int i = threadIdx.x + u * kWarps * 32;
        const int r = i / (kSubK / 32), jj = i % (kSubK / 32);
        const int j = sub * (kSubK / 32) + jj;  // run of the tile
        uint4* dst = reinterpret_cast<uint4*>(ws + r * kLd + 32 * jj);
        const int64_t c = k0 + 32 * j;
        const uint8_t* blk = w + uint64_t(r0 + r) * row_bytes + uint64_t(c / Q::kQK) * Q::kBytes;
        float v[32];
        if (r0 + r < rows) {
          Q::dequant(blk, int(c % Q::kQK) / 8, v);
        } else {
#pragma unroll
          for (int k = 0; k < 32; ++k) v[k] = 0.0f;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          __align__(16) __half2 h[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[8 * q + 2 * k], v[8 * q + 2 * k + 1]);
          dst[q] = *reinterpret_cast<const uint4*>(h);
        }
      }
      // x: NT x kSubK halves, 16 bytes a step.
      for (int i = threadIdx.x; i < NT * (kSubK / 8); i += blockDim.x) {
        const int t = i / (kSubK / 8), e = (i % (kSubK / 8)) * 8;
        *reinterpret_cast<uint4*>(xs + t * kLd + e) = *reinterpret_cast<const uint4*>(xh + int64_t(t) * cols + ks + e);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kSubK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::load_matrix_sync(a, ws + warp * 16 * kLd + kk, kLd);
#pragma unroll
        for (int jt = 0; jt < NT / 16; ++jt) {
          // B(k, t) = x[t][k]: column-major with the shared row stride.
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
          wmma::load_matrix_sync(b, xs + jt * 16 * kLd + kk, kLd);
          wmma::mma_sync(acc[jt], a, b, acc[jt]);
        }
      }
      __syncthreads();
    }
  }
  // C(r, t) at partial[(split * NT + t) * rows_pad + r]: column-major, ld rows_pad.
  float* dst = partial + int64_t(blockIdx.y) * NT * rows_pad + r0 + warp * 16;
#pragma unroll
  for (int j = 0; j < NT / 16; ++j) {
    wmma::store_matrix_sync(dst + int64_t(j) * 16 * rows_pad, acc[j], unsigned(rows_pad), wmma::mem_col_major);
  }
}

// ---- Q4_K: weights in registers, mma.m16n8k16 ------------------------------
//
// Lane (g, c) = (lane / 4, lane % 4) of a warp feeds rows g and g + 8 of the
// warp's 16 rows, from its 32 bytes qs[32c, 32c + 32) of each row's block.
// In k-step s (0..15) it supplies bytes b = 4(s / 2) + s % 2 and b + 2 of
// its 32: their low nibbles (sub-block 2c) as fragment columns 2c, 2c + 1
// and their high nibbles (sub-block 2c + 1) as columns 2c + 8, 2c + 9
// (bytes two apart, so one mask of the word picks both). The x value that
// meets weight k = 64c + 32h + b + 2e of the block is stored by
// x_to_half_q4k at slot (4s + c) * 4 + 2h + e of the token's 256 halves, so
// a lane's B fragment for step s is the 8 bytes at slot (4s + c) * 4.
constexpr int kQ4KXStride = kTileK + 16;  // shared halves per token: 136 words, rows start 8 banks apart

__global__ void x_to_half_q4k_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n_tokens, int64_t cols,
                                     int nt, __half* __restrict__ out) {
  const int64_t total = int64_t(nt) * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tile = i / (int64_t(nt) * kTileK);
    const int t = int(i / kTileK % nt), p = int(i % kTileK);
    const int s = p / 16, c = (p / 4) % 4, h = (p / 2) % 2, e = p % 2;
    const int64_t k = tile * kTileK + 64 * c + 32 * h + 4 * (s / 2) + s % 2 + 2 * e;
    out[i] = __float2half_rn(t < n_tokens ? x[t * x_stride + k] : 0.0f);
  }
}

struct Q4KRegs {
  uint4 hdr[2];    // rows g, g + 8: d, dmin, scales
  uint4 qs[2][2];  // rows g, g + 8: this lane's 32 bytes of quants
};

__device__ __forceinline__ void q4k_load(Q4KRegs& r, const uint8_t* row0, const uint8_t* row1, int64_t tile, int c) {
  const uint8_t* b[2] = {row0 + tile * kQ4KBytes, row1 + tile * kQ4KBytes};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    r.hdr[i] = ld_u128(b[i]);
    r.qs[i][0] = ld_u128(b[i] + 16 + 32 * c);
    r.qs[i][1] = ld_u128(b[i] + 32 + 32 * c);
  }
}

__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The nibbles at bits 0-3 and 16-19 of w (mask 0x000f000f) or at bits 4-7
// and 20-23 (mask 0x00f000f0) as the halves d * q + m. One LOP3 puts them
// under the exponent of 1024 (0x6400): the halves are 1024 + q, or 1024 +
// 16q for the high nibbles; the offset goes exactly (a subtraction, or a
// multiply-add by 1/16 that leaves q), then one fused multiply-add applies
// the scale and the minimum.
template <bool kHigh>
__device__ __forceinline__ uint32_t q4k_pair(uint32_t w, __half2 d2, __half2 m2) {
  // (w & mask) | magic as one LOP3: written in C the compiler splits it in
  // two, as LOP3 takes a single immediate.
  uint32_t p;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(p) : "r"(w), "r"(kHigh ? 0x00f000f0u : 0x000f000fu), "r"(0x64006400u));
  const __half2 h = *reinterpret_cast<const __half2*>(&p);
  const __half2 q = kHigh ? __hfma2(h, __float2half2_rn(0.0625f), __float2half2_rn(-64.0f))
                          : __hsub2(h, __float2half2_rn(1024.0f));
  const __half2 v = __hfma2(q, d2, m2);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// One tile of x (NT tokens x 256 halves, permuted) into a shared buffer,
// asynchronously: 16 bytes per thread per pass, thread i taking token
// i / 32 + 8 * pass, piece i % 32 (256 threads).
template <int NT>
__device__ __forceinline__ void q4k_stage_x(__half* xs, const __half* __restrict__ xh, int64_t tile) {
  static_assert(NT % 8 == 0 && kWarps * 32 == 256, "whole passes");
  const __half* src = xh + tile * NT * kTileK + (threadIdx.x >> 5) * kTileK + (threadIdx.x & 31) * 8;
  __half* dst = xs + (threadIdx.x >> 5) * kQ4KXStride + (threadIdx.x & 31) * 8;
#pragma unroll
  for (int pass = 0; pass < NT / 8; ++pass) cp_async16(dst + pass * 8 * kQ4KXStride, src + pass * 8 * kTileK);
  cp_async_commit();
}

template <int NT>
constexpr size_t q4k_smem_bytes() {
  return size_t(2) * NT * kQ4KXStride * sizeof(__half);
}

// The scale and min of sub-block j (any of 0..7) without a branch on j:
// lanes of one warp ask for different halves of the table.
__device__ __forceinline__ void q4k_scale_min(const uint4& hdr, int j, float& sc, float& m) {
  const int k = 8 * (j & 3);
  const uint32_t a = hdr.y >> k, b = hdr.z >> k, c = hdr.w >> k;
  const uint32_t lo_sc = a & 63, lo_m = b & 63;
  const uint32_t hi_sc = (c & 15) | ((a >> 2) & 0x30), hi_m = ((c >> 4) & 15) | ((b >> 2) & 0x30);
  sc = float(j < 4 ? lo_sc : hi_sc);
  m = float(j < 4 ? lo_m : hi_m);
}

// One 256-column tile of a warp's 16 rows against the NT tokens of xs.
template <int NT>
__device__ __forceinline__ void q4k_tile(const Q4KRegs& r, const __half* xs, int g, int c, float (&acc)[NT / 8][4]) {
  __half2 d2[2][2], m2[2][2];  // [row][sub-block 2c + h]
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float d = half_bits_to_float(r.hdr[i].x & 0xffffu), dmin = half_bits_to_float(r.hdr[i].x >> 16);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sc, m;
      q4k_scale_min(r.hdr[i], 2 * c + h, sc, m);
      d2[i][h] = __float2half2_rn(d * sc);
      m2[i][h] = __float2half2_rn(-dmin * m);
    }
  }
  const __half* xg = xs + g * kQ4KXStride + 4 * c;
#pragma unroll
  for (int wi = 0; wi < 8; ++wi) {  // quant word wi: k-steps 2wi (bytes 0, 2), 2wi + 1 (bytes 1, 3)
    uint32_t v[2][2];  // [row][step]: the word, and the word shifted down a byte
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4& q = r.qs[i][wi >> 2];
      v[i][0] = (wi & 3) == 0 ? q.x : (wi & 3) == 1 ? q.y : (wi & 3) == 2 ? q.z : q.w;
      v[i][1] = v[i][0] >> 8;
    }
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      const int s = 2 * wi + o;
      const uint32_t a0 = q4k_pair<false>(v[0][o], d2[0][0], m2[0][0]);
      const uint32_t a1 = q4k_pair<false>(v[1][o], d2[1][0], m2[1][0]);
      const uint32_t a2 = q4k_pair<true>(v[0][o], d2[0][1], m2[0][1]);
      const uint32_t a3 = q4k_pair<true>(v[1][o], d2[1][1], m2[1][1]);
#pragma unroll
      for (int j = 0; j < NT / 8; ++j) {
        const uint2 b = *reinterpret_cast<const uint2*>(xg + j * 8 * kQ4KXStride + 16 * s);
        mma_16816(acc[j], a0, a1, a2, a3, b.x, b.y);
      }
    }
  }
}

// x goes through two shared buffers (cp.async): tile i + 1's copy is in
// flight while tile i is multiplied. Weights go through two register sets
// used in turn, so that a set is refilled right after its tile and the
// loads are never waited for by a register copy.
template <int NT>
__global__ void __launch_bounds__(kWarps * 32)
    small_matmul_q4k_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows,
                            const __half* __restrict__ xh, int64_t tiles, int tiles_per_split,
                            float* __restrict__ partial, int64_t rows_pad) {
  extern __shared__ __align__(128) unsigned char smem[];
  __half* xbuf = reinterpret_cast<__half*>(smem);  // [2][NT * kQ4KXStride]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t r0 = int64_t(blockIdx.x) * kRows + warp * 16;
  const int64_t t_begin = int64_t(blockIdx.y) * tiles_per_split;
  const int64_t t_end = t_begin + tiles_per_split < tiles ? t_begin + tiles_per_split : tiles;
  // Rows past the matrix read row 0 and are never stored.
  const uint8_t* row0 = w + uint64_t(r0 + g < rows ? r0 + g : 0) * row_bytes;
  const uint8_t* row1 = w + uint64_t(r0 + g + 8 < rows ? r0 + g + 8 : 0) * row_bytes;

  float acc[NT / 8][4];
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  // Waits for tile t's x (staging t + 1's first), then multiplies.
  auto step = [&](const Q4KRegs& r, int64_t t) {
    __syncthreads();  // every warp is done with the buffer the next copy overwrites
    if (t + 1 < t_end) {
      q4k_stage_x<NT>(xbuf + ((t + 1 - t_begin) & 1) * NT * kQ4KXStride, xh, t + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile t's x has landed for every thread
    q4k_tile<NT>(r, xbuf + ((t - t_begin) & 1) * NT * kQ4KXStride, g, c, acc);
  };
  Q4KRegs ra, rb;
  if (t_begin < t_end) {
    q4k_stage_x<NT>(xbuf, xh, t_begin);
    q4k_load(ra, row0, row1, t_begin, c);
  }
  if (t_begin + 1 < t_end) q4k_load(rb, row0, row1, t_begin + 1, c);
  for (int64_t t = t_begin; t < t_end; t += 2) {
    step(ra, t);
    if (t + 2 < t_end) q4k_load(ra, row0, row1, t + 2, c);
    if (t + 1 < t_end) {
      step(rb, t + 1);
      if (t + 3 < t_end) q4k_load(rb, row0, row1, t + 3, c);
    }
  }
  // acc[j]: (row g, tokens 8j + 2c, 8j + 2c + 1), (row g + 8, the same).
  float* dst = partial + int64_t(blockIdx.y) * NT * rows_pad + r0 + g;
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = j * 8 + 2 * c + (q & 1);
      dst[int64_t(t) * rows_pad + 8 * (q >> 1)] = acc[j][q];
    }
  }
}

// out[t][r] = sum over splits, in split order.
__global__ void sum_splits_kernel(const float* __restrict__ partial, int splits, int nt, int64_t rows_pad,
                                  int64_t n_tokens, int64_t rows, float* __restrict__ out, int64_t out_stride) {
  const int64_t total = n_tokens * rows;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / rows, r = i % rows;
    float s = 0.0f;
    for (int k = 0; k < splits; ++k) s += partial[(int64_t(k) * nt + t) * rows_pad + r];
    out[t * out_stride + r] = s;
  }
}

unsigned grid_for(int64_t work, int threads) {
  return unsigned(std::clamp<int64_t>((work + threads - 1) / threads, 1, int64_t(sm_count()) * 16));
}

template <class Q>
size_t smem_bytes(int nt) {
  return size_t(kRows + nt) * kLd * sizeof(__half);
}

// More than 48 KiB of shared memory needs the opt-in, once per kernel and device.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  int dev = 0;
  BATON_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (done.insert({reinterpret_cast<const void*>(kernel), dev}).second) {
    BATON_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  }
}

template <class Q, int NT>
void launch(const MatrixView& w, const __half* xh, float* partial, int64_t rows_pad, cudaStream_t stream) {
  const int per = int(tiles_per_split(w.rows, w.cols, kTargetBlocks));
  const size_t smem = smem_bytes<Q>(NT);
  auto kernel = small_matmul_kernel<Q, NT>;
  allow_smem(kernel, smem);
  const dim3 grid(unsigned(row_blocks(w.rows)), unsigned(launched_splits(w.rows, w.cols, kTargetBlocks)));
  kernel<<<grid, kWarps * 32, smem, stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, xh,
                                              per, partial, rows_pad);
  check_launch("small_matmul_kernel");
}

// Q4_K's token tiles: multiples of 8 (one mma n-tile).
int q4k_token_tile(int64_t n_tokens) { return n_tokens <= 8 ? 8 : token_tile(n_tokens); }

template <int NT>
void launch_q4k(const MatrixView& w, const __half* xh, float* partial, int64_t rows_pad, cudaStream_t stream) {
  const dim3 grid(unsigned(row_blocks(w.rows)), unsigned(launched_splits(w.rows, w.cols, kTargetBlocksQ4K)));
  auto kernel = small_matmul_q4k_kernel<NT>;
  allow_smem(kernel, q4k_smem_bytes<NT>());
  kernel<<<grid, kWarps * 32, q4k_smem_bytes<NT>(), stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes,
                                                                 w.rows, xh, w.cols / kTileK,
                                                                 int(tiles_per_split(w.rows, w.cols, kTargetBlocksQ4K)), partial,
                                                                 rows_pad);
  check_launch("small_matmul_q4k_kernel");
}

}  // namespace

bool small_matmul_supported(const MatrixView& w) {
  return dispatch_small(w.type, [](auto) {}) && w.cols > 0 && w.cols % kTileK == 0;
}

size_t small_matmul_workspace_bytes(int64_t rows, int64_t cols, int64_t n_tokens) {
  if (rows < 1 || cols < kTileK || cols % kTileK != 0) return 0;
  const int nt = token_tile(std::min(n_tokens, kSmallMatmulMaxTokens));
  const int64_t rows_pad = row_blocks(rows) * kRows;
  return align_up(size_t(nt) * size_t(cols) * 2) +
         align_up(size_t(std::max(launched_splits(rows, cols, kTargetBlocks),
                                  launched_splits(rows, cols, kTargetBlocksQ4K))) *
                  size_t(nt) * size_t(rows_pad) * sizeof(float));
}

void small_matmul(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* out,
                  int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  validate_matrix(w, "small_matmul");
  if (!small_matmul_supported(w)) {
    throw std::invalid_argument(std::string("small_matmul: dtype ") + dtype_name(w.type) + " with " +
                                std::to_string(w.cols) + " columns is not supported");
  }
  if (n_tokens < 1 || n_tokens > kSmallMatmulMaxTokens) {
    throw std::invalid_argument("small_matmul: 1.." + std::to_string(kSmallMatmulMaxTokens) + " tokens, got " +
                                std::to_string(n_tokens));
  }
  if (!x || !out || x_stride < w.cols || out_stride < w.rows) {
    throw std::invalid_argument("small_matmul: null x or out, or a stride below one row");
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0 ||
      workspace_bytes < small_matmul_workspace_bytes(w.rows, w.cols, n_tokens)) {
    throw std::invalid_argument("small_matmul: workspace too small or not 256-byte aligned");
  }
  const int64_t rows_pad = row_blocks(w.rows) * kRows;
  auto* xh = static_cast<__half*>(workspace);
  auto* partial = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) +
                                           align_up(size_t(token_tile(n_tokens)) * size_t(w.cols) * 2));
  if (w.type == DType::Q4_K) {
    const int nt = q4k_token_tile(n_tokens);
    x_to_half_q4k_kernel<<<grid_for(nt * w.cols, 256), 256, 0, stream>>>(x, x_stride, n_tokens, w.cols, nt, xh);
    check_launch("x_to_half_q4k_kernel");
    if (nt == 8) launch_q4k<8>(w, xh, partial, rows_pad, stream);
    else if (nt == 16) launch_q4k<16>(w, xh, partial, rows_pad, stream);
    else if (nt == 32) launch_q4k<32>(w, xh, partial, rows_pad, stream);
    else launch_q4k<64>(w, xh, partial, rows_pad, stream);
    sum_splits_kernel<<<grid_for(n_tokens * w.rows, 256), 256, 0, stream>>>(
        partial, launched_splits(w.rows, w.cols, kTargetBlocksQ4K), nt, rows_pad, n_tokens, w.rows, out, out_stride);
    check_launch("sum_splits_kernel");
    return;
  }
  const int nt = token_tile(n_tokens);
  x_to_half_kernel<<<grid_for(nt * w.cols, 256), 256, 0, stream>>>(x, x_stride, n_tokens, w.cols, nt, xh);
  check_launch("x_to_half_kernel");
  dispatch_small(w.type, [&](auto q) {
    using Q = decltype(q);
    if (nt == 16) launch<Q, 16>(w, xh, partial, rows_pad, stream);
    else if (nt == 32) launch<Q, 32>(w, xh, partial, rows_pad, stream);
    else launch<Q, 64>(w, xh, partial, rows_pad, stream);
  });
  sum_splits_kernel<<<grid_for(n_tokens * w.rows, 256), 256, 0, stream>>>(
      partial, launched_splits(w.rows, w.cols, kTargetBlocks), nt, rows_pad, n_tokens, w.rows, out, out_stride);
  check_launch("sum_splits_kernel");
}

}  // namespace baton::cuda
