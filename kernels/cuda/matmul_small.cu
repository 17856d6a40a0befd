// Small-batch tensor-core matmul over quantized weights (matmul_small.cuh).
//
// Layout of one block's work: 8 warps, 128 rows of W (warp w owns rows
// [16w, 16w + 16)), all NT token rows of x (NT = 16, 32 or 64), a range of
// 256-column tiles, each in four passes of 64 columns: the block dequantizes
// its 128 x 64 slice of W to F16 in shared memory, copies the NT x 64 slice
// of x (already F16 in the workspace), then each warp runs 4 k-steps of WMMA
// over its rows and every 16-token group. The kernel is bound by latency
// (ncu: 14 cycles per issued instruction, 25% occupancy with whole 256-column
// slices): small slices let 4-5 blocks share an SM. Dequantization goes a
// 32-value run per call (dequant.cuh's `dequant`; a step of 8 values per call
// ran 25% slower than matmul()'s two passes). Q4_K (the files people run)
// goes through shared memory twice: its raw blocks, copied coalesced once
// per 256-column tile, then decoded in half arithmetic. Shared rows are
// padded by 8 halves: rows start 4 banks apart, and WMMA needs only 32-byte
// aligned tiles and a stride that is a multiple of 8 halves.
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
constexpr int kQ4KRaw = 144;        // bytes of one Q4_K block: a tile's row
constexpr int kTargetBlocks = 256;  // split K until about this many blocks run
constexpr int kMaxSplits = 8;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t row_blocks(int64_t rows) { return (rows + kRows - 1) / kRows; }

// K tiles per split and the split count: enough blocks to fill the GPU,
// each split at least one tile.
int splits_for(int64_t rows, int64_t cols) {
  const int64_t tiles = cols / kTileK;
  const int64_t want = (kTargetBlocks + row_blocks(rows) - 1) / row_blocks(rows);
  return int(std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxSplits, tiles)));
}

int token_tile(int64_t n_tokens) { return n_tokens <= 16 ? 16 : n_tokens <= 32 ? 32 : 64; }

// Tiles per split as launched, and the split count that follows from it.
int64_t tiles_per_split(int64_t rows, int64_t cols) {
  const int64_t tiles = cols / kTileK;
  const int splits = splits_for(rows, cols);
  return (tiles + splits - 1) / splits;
}
int launched_splits(int64_t rows, int64_t cols) {
  const int64_t per = tiles_per_split(rows, cols);
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

// Q4_K's run j (32 values) of block b, as 16 half2, in half arithmetic: a
// nibble q becomes the half 1024 + q by its bits (0x64 above it), 1024 is
// subtracted exactly, then one fused d*sc*q - dmin*m per pair. About five
// instructions per pair where dequant's float path takes about fifteen; the
// values differ from it only by rounding d*sc and dmin*m to half.
// b is the block in shared memory (plain loads, 16-byte aligned).
__device__ __forceinline__ void q4k_run_half(const uint8_t* b, int j, uint4 out[4]) {
  const uint32_t* bw = reinterpret_cast<const uint32_t*>(b);
  const uint32_t dd = bw[0], s0 = bw[1], s1 = bw[2], s2 = bw[3];
  float sc, m;
  k_scale_min_words(s0, s1, s2, j, sc, m);
  const __half2 d2 = __float2half2_rn(half_bits_to_float(dd & 0xffffu) * sc);
  const __half2 m2 = __float2half2_rn(-half_bits_to_float(dd >> 16) * m);
  const __half2 k1024 = __float2half2_rn(1024.0f);
  const uint8_t* qp = b + 16 + 32 * (j >> 1);
  const uint4 qa = *reinterpret_cast<const uint4*>(qp), qb = *reinterpret_cast<const uint4*>(qp + 16);
  const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
  const int shift = 4 * (j & 1);
  uint32_t h[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w = (q[i] >> shift) & 0x0f0f0f0fu;
    const uint32_t p[2] = {__byte_perm(w, 0x64u, 0x4140), __byte_perm(w, 0x64u, 0x4342)};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&p[k]), k1024);
      v = __hfma2(v, d2, m2);
      h[2 * i + k] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = make_uint4(h[4 * k], h[4 * k + 1], h[4 * k + 2], h[4 * k + 3]);
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
  constexpr bool kStaged = std::is_same_v<Q, DqQ4_K>;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* ws = reinterpret_cast<__half*>(smem);  // kRows x kLd
  __half* xs = ws + kRows * kLd;                 // NT x kLd
  uint8_t* raw = reinterpret_cast<uint8_t*>(xs + NT * kLd);  // Q4_K: kRows x 144 bytes of the tile
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
    if constexpr (kStaged) {
      // Q4_K: the tile's raw blocks first, in 16-byte pieces that
      // neighbouring threads take from one row (coalesced, no byte read
      // twice); then each run is decoded from shared memory. Reading the
      // runs straight from global memory, eight threads per block each
      // fetching its header and quants, kept L1 busy at 83% for 9% of DRAM.
      for (int i = threadIdx.x; i < kRows * (kQ4KRaw / 16); i += blockDim.x) {
        const int r = i / (kQ4KRaw / 16), o = (i % (kQ4KRaw / 16)) * 16;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < rows) v = ld_u128(w + uint64_t(r0 + r) * row_bytes + uint64_t(tile) * kQ4KRaw + o);
        *reinterpret_cast<uint4*>(raw + r * kQ4KRaw + o) = v;
      }
      __syncthreads();
    }
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
        if constexpr (kStaged) {
          // Zero rows past the matrix come from the zeroed raw blocks.
          uint4 h[4];
          q4k_run_half(raw + r * kQ4KRaw, j, h);
#pragma unroll
          for (int q = 0; q < 4; ++q) dst[q] = h[q];
        } else {
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
  const size_t raw = std::is_same_v<Q, DqQ4_K> ? size_t(kRows) * kQ4KRaw : 0;
  return size_t(kRows + nt) * kLd * sizeof(__half) + raw;
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
  const int per = int(tiles_per_split(w.rows, w.cols));
  const size_t smem = smem_bytes<Q>(NT);
  auto kernel = small_matmul_kernel<Q, NT>;
  allow_smem(kernel, smem);
  const dim3 grid(unsigned(row_blocks(w.rows)), unsigned(launched_splits(w.rows, w.cols)));
  kernel<<<grid, kWarps * 32, smem, stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, xh,
                                              per, partial, rows_pad);
  check_launch("small_matmul_kernel");
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
         align_up(size_t(launched_splits(rows, cols)) * size_t(nt) * size_t(rows_pad) * sizeof(float));
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
  const int nt = token_tile(n_tokens);
  const int64_t rows_pad = row_blocks(w.rows) * kRows;
  auto* xh = static_cast<__half*>(workspace);
  auto* partial = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + align_up(size_t(nt) * size_t(w.cols) * 2));
  x_to_half_kernel<<<grid_for(nt * w.cols, 256), 256, 0, stream>>>(x, x_stride, n_tokens, w.cols, nt, xh);
  check_launch("x_to_half_kernel");
  dispatch_small(w.type, [&](auto q) {
    using Q = decltype(q);
    if (nt == 16) launch<Q, 16>(w, xh, partial, rows_pad, stream);
    else if (nt == 32) launch<Q, 32>(w, xh, partial, rows_pad, stream);
    else launch<Q, 64>(w, xh, partial, rows_pad, stream);
  });
  sum_splits_kernel<<<grid_for(n_tokens * w.rows, 256), 256, 0, stream>>>(
      partial, launched_splits(w.rows, w.cols), nt, rows_pad, n_tokens, w.rows, out, out_stride);
  check_launch("sum_splits_kernel");
}

}  // namespace baton::cuda
