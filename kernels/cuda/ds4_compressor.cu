// DeepSeek V4 compressor (ds4_compressor.cuh).
// Each kernel follows the CPU code of engine/arch/deepseek4*.cpp step by
// step (same reduction orders where the work is per thread), so the tests
// can hold tight tolerances.
#include "kernels/cuda/ds4_compressor.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

__device__ __forceinline__ float ape_at(const MatrixView& a, int64_t r, int64_t f) {
  const uint8_t* row = static_cast<const uint8_t*>(a.data) + uint64_t(r) * a.row_bytes;
  if (a.type == DType::F16) return __half2float(reinterpret_cast<const __half*>(row)[f]);
  return reinterpret_cast<const float*>(row)[f];
}

// Token t's state rows (kv and gate + ape) at slot pos % R, from thread
// threadIdx.x on (the store of compress_store_kernel).
__device__ __forceinline__ void compress_store_token(const Ds4CompressParams& p, int64_t t) {
  const int64_t pos = p.pos0 + t;
  const int64_t W = int64_t(p.lanes) * p.dim, R = int64_t(p.lanes) * p.ratio;
  const int64_t sl = pos % R;
  float* kv_ring = p.state + sl * W;
  float* gate_ring = p.state + (R + sl) * W;
  for (int64_t f = threadIdx.x; f < W; f += blockDim.x) {
    kv_ring[f] = p.kv[t * p.stride + f];
    gate_ring[f] = ape_at(p.ape, pos % p.ratio, f) + p.gate[t * p.stride + f];
  }
}

// Slots of a feature kept in registers by the pooling (two lanes of ratio 4
// take 8); longer windows (ratio 128, once every 128 tokens) read twice.
constexpr int kPoolSlots = 16;

// Block: window w = w_lo + blockIdx.x, complete within this batch.
// With pos0_dev the grid covers the most windows a batch of n_tokens can
// complete and blocks past the real ones return. store_token (decode, one
// token): the block first writes that token's state rows, which no window
// of this batch reads from the state (the token itself is read from the
// batch, and the 2 * ratio positions a window reads are distinct slots), so
// one launch does what compress_store_kernel would do after it.
__global__ void compress_pool_kernel(Ds4CompressParams p, int64_t w_lo, bool store_token) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  extern __shared__ float row[];  // dim floats
  __shared__ float red[32];
  int64_t block = blockIdx.x;
  if (p.batch.seq) {
    // Block b: decode row b, one token of its own sequence.
    const int64_t sq = p.batch.seq[block];
    p.pos0 = p.batch.pos[block];
    p.n_tokens = 1;
    p.kv += block * p.stride;
    p.gate += block * p.stride;
    p.state += sq * p.batch.seq_stride;
    p.rows += sq * p.batch.seq_stride;
    w_lo = p.pos0 / p.ratio;
    block = 0;
  } else if (p.pos0_dev) {
    p.pos0 = *p.pos0_dev;
    w_lo = p.pos0 / p.ratio;
  }
  if (store_token) compress_store_token(p, 0);
  const int64_t w = w_lo + block;
  if (w >= (p.pos0 + p.n_tokens) / p.ratio) return;  // whole block: before any barrier
  const int64_t W = int64_t(p.lanes) * p.dim, R = int64_t(p.lanes) * p.ratio;
  const float* kv_ring = p.state;
  const float* gate_ring = p.state + R * W;
  // (gate + ape, kv) of position pos, feature f: from the batch or the ring.
  auto slot = [&](int64_t pos, int64_t f, float& g, float& k) {
    if (pos >= p.pos0) {
      const int64_t t = pos - p.pos0;
      k = p.kv[t * p.stride + f];
      g = ape_at(p.ape, pos % p.ratio, f) + p.gate[t * p.stride + f];
    } else {
      const int64_t sl = pos % R;
      k = kv_ring[sl * W + f];
      g = gate_ring[sl * W + f];
    }
  };
  // The slots feeding feature d, in the CPU's order: slot i of n_slots.
  const int64_t n_slots = (p.lanes == 2 && w > 0 ? 2 : 1) * int64_t(p.ratio);
  auto slot_i = [&](int64_t i, int64_t d, float& g, float& k) {
    if (p.lanes == 2) {
      if (w > 0 && i < p.ratio) {
        slot((w - 1) * p.ratio + i, d, g, k);
      } else {
        const int64_t j = w > 0 ? i - p.ratio : i;
        slot(w * p.ratio + j, p.dim + d, g, k);
      }
    } else {
      slot(w * p.ratio + i, d, g, k);
    }
  };
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) {
    float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
    if (n_slots <= kPoolSlots) {
      float gs[kPoolSlots], ks[kPoolSlots];
#pragma unroll
      for (int i = 0; i < kPoolSlots; ++i) {  // every load issued before the first use
        gs[i] = -INFINITY, ks[i] = 0.0f;
        if (i < n_slots) slot_i(i, d, gs[i], ks[i]);
      }
#pragma unroll
      for (int i = 0; i < kPoolSlots; ++i) {
        if (i < n_slots) mx = fmaxf(mx, gs[i]);
      }
#pragma unroll
      for (int i = 0; i < kPoolSlots; ++i) {
        if (i < n_slots) {
          const float e = expf(gs[i] - mx);
          sum += e;
          acc += e * ks[i];
        }
      }
    } else {
      float g, k;
      for (int64_t i = 0; i < n_slots; ++i) slot_i(i, d, g, k), mx = fmaxf(mx, g);
      for (int64_t i = 0; i < n_slots; ++i) {
        slot_i(i, d, g, k);
        const float e = expf(g - mx);
        sum += e;
        acc += e * k;
      }
    }
    row[d] = acc / sum;
  }
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) ss = fmaf(row[d], row[d], ss);
  ss = block_sum(ss, red);  // its barriers also publish row[]
  const float sc = float(1.0 / sqrt(double(ss) / double(p.dim) + double(p.eps)));
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) row[d] = row[d] * sc * p.norm[d];
  __syncthreads();
  // RoPE (adjacent pairs) of the last rope_dim dims at the window's first position.
  const double pos = double(w * p.ratio);
  float* tail = row + p.dim - p.rope_dim;
  for (int i = threadIdx.x; i < p.rope_dim / 2; i += blockDim.x) {
    double s, c;
    sincos(pos * double(p.inv_freq[i]), &s, &c);
    const float cf = float(c), sf = float(s);
    const float x0 = tail[2 * i], x1 = tail[2 * i + 1];
    tail[2 * i] = x0 * cf - x1 * sf;
    tail[2 * i + 1] = x0 * sf + x1 * cf;
  }
  __syncthreads();
  float* out = p.rows + w * p.dim;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) out[d] = row[d];
}

// Block b: token n_tokens - n_store + b into its state rows.
__global__ void compress_store_kernel(Ds4CompressParams p, int64_t n_store) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  if (p.pos0_dev) p.pos0 = *p.pos0_dev;
  compress_store_token(p, p.n_tokens - n_store + blockIdx.x);
}

}  // namespace

void ds4_compress(const Ds4CompressParams& p, cudaStream_t stream) {
  const char* who = "ds4_compress";
  require(p.ratio >= 1 && (p.lanes == 1 || p.lanes == 2), who, "ratio >= 1 and 1 or 2 lanes");
  require(p.dim >= 2 && p.dim <= 1024, who, "dim must be 2..1024");
  require(p.rope_dim >= 0 && p.rope_dim % 2 == 0 && p.rope_dim <= p.dim, who, "rope_dim must be even and <= dim");
  require(p.kv && p.gate && p.norm && p.state && p.rows && (p.rope_dim == 0 || p.inv_freq), who, "null buffer");
  require(p.n_tokens >= 1 && p.pos0 >= 0 && (p.n_tokens == 1 || p.stride >= p.lanes * p.dim), who,
          "bad batch or stride");
  require((p.ape.type == DType::F32 || p.ape.type == DType::F16) && p.ape.data && p.ape.rows == p.ratio &&
              p.ape.cols == p.lanes * p.dim && p.ape.row_bytes >= uint64_t(p.ape.cols) * dtype_info(p.ape.type).block_bytes,
          who, "ape must be F32 or F16 with ratio rows of lanes * dim");
  const int64_t w_lo = p.pos0 / p.ratio, w_hi = (p.pos0 + p.n_tokens) / p.ratio;
  if (p.batch.seq) {
    require(p.batch.pos && p.batch.seq_stride > 0 && !p.pos0_dev && p.n_tokens <= 65535 &&
                (p.n_tokens == 1 || p.stride >= p.lanes * p.dim),
            who, "decode rows need positions, a sequence stride and no device pos0");
    const unsigned threads = unsigned(std::max<int64_t>(64, (p.dim + 31) / 32 * 32));
    // Each block stores its row's state and pools the window the row completes.
    launch_pdl("compress_pool_kernel", compress_pool_kernel, dim3(unsigned(p.n_tokens)), dim3(threads),
               size_t(p.dim) * sizeof(float), stream, p, w_lo, true);
    return;
  }
  // A thread per feature (dim <= 1024).
  const unsigned threads = unsigned(std::max<int64_t>(64, (p.dim + 31) / 32 * 32));
  if (p.n_tokens == 1) {
    // Decode: the store and the pooling (when the token completes a window) in one launch.
    launch_pdl("compress_pool_kernel", compress_pool_kernel, dim3(1), dim3(threads), size_t(p.dim) * sizeof(float),
               stream, p, w_lo, true);
    return;
  }
  // Device position: the most windows n_tokens consecutive tokens complete.
  const int64_t blocks = p.pos0_dev ? (p.n_tokens - 1) / p.ratio + 1 : w_hi - w_lo;
  if (blocks > 0) {
    launch_pdl("compress_pool_kernel", compress_pool_kernel, dim3(unsigned(blocks)), dim3(threads),
               size_t(p.dim) * sizeof(float), stream, p, w_lo, false);
  }
  // After the pooling, which still reads the state rows of earlier positions.
  const int64_t n_store = std::min<int64_t>(p.n_tokens, int64_t(p.lanes) * p.ratio);
  launch_pdl("compress_store_kernel", compress_store_kernel, dim3(unsigned(n_store)), dim3(256), 0, stream, p, n_store);
  check_launch("compress_store_kernel");
}

}  // namespace baton::cuda
