// The streamed one-token integer-dot matvec (device-only; include from .cu
// files). matvec_xq.cu launches it for one token where the shape allows;
// the micro-benchmark instantiates other configurations to compare them.
//
// Why: a decode token is a chain of dependent kernels, and between two
// matvecs the memory system idles while the small kernels (norm,
// attention, SwiGLU) run and while each grid ramps up and drains. The
// block-per-row-pair kernel (matvec_xq_impl.cuh) can only prefetch what its
// first resident blocks hold in registers. This kernel is persistent (one
// block per SM, each owning a contiguous range of rows) and streams its rows
// through shared memory with bulk copies (bulk_copy.cuh). Before waiting for
// the kernel that produces x (pdl.cuh) every warp already issues the copies
// that fill its buffers, so weights flow while the previous kernels still
// run.
//
// Work split. The warps of a block are independent streams: warp w takes
// the block's groups of G rows w, w + W, w + 2W, ... and walks each group in
// segments of up to seg_cols columns, one (group, segment) item per buffer
// of its own ring of nbuf buffers; its lane 0 issues the G row pieces of an
// item as bulk copies onto the buffer's mbarrier and refills the buffer as
// soon as the warp has consumed it. No block-wide barrier after the start,
// so a slow warp delays only itself. The lanes take the units of a segment
// (a weight block is K::kLanes units of 16 bytes, as in matvec_xq_impl.cuh)
// 32 apart; the activations of a unit come from a copy of the quantized x
// row in shared memory, read once per unit for all G rows. After a group's
// last segment the warp reduces its G sums with shuffles and writes them (a
// RoPE pair per lane with the epilogue, G even).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/matvec_xq_impl.cuh"

namespace baton::cuda::detail {

constexpr int kStreamMaxWarps = 16;
constexpr int kStreamMaxBuffers = 4;   // per warp
constexpr int kStreamRopePairs = 128;  // rot_dim up to 256
constexpr uint32_t kStreamPad = 16;    // Q8_0's realigned loads may read past the last block

// Launch shape of one matrix, computed on the host by stream_geometry().
struct StreamGeom {
  int seg_cols = 0;  // columns per segment (a multiple of the block size)
  int nseg = 0;      // segments per row
  int nbuf = 0;      // buffers per warp
  uint32_t slot_bytes = 0;
  uint32_t x_bytes = 0;  // the quantized x row's bytes in shared memory
  int warps = 0;
  int blocks = 0;
  size_t smem = 0;
};

// Tunables (bench_cuda_kernels xq sweeps them).
struct StreamConfig {
  int warps = 8;
  int seg_cols = 4096;
  int nbuf = 3;
};

template <class K, int G, bool kRope>
__global__ void __launch_bounds__(kStreamMaxWarps * 32, 1)
    matvec_stream_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                         const uint8_t* __restrict__ xq, float* __restrict__ out, QkvRope rope, int seg_cols,
                         int nseg, int nbuf, uint32_t slot_bytes, uint32_t x_bytes) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bars[kStreamMaxWarps][kStreamMaxBuffers];
  __shared__ float2 rope_cs[kRope ? kStreamRopePairs : 1];

  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, n_warps = int(blockDim.x) >> 5;
  // Rows of this block, in pairs (a RoPE pair never straddles two blocks).
  const int64_t pairs = (rows + 1) / 2;
  const int64_t rb = 2 * (int64_t(blockIdx.x) * pairs / gridDim.x);
  const int64_t re = min(rows, 2 * ((int64_t(blockIdx.x) + 1) * pairs / gridDim.x));
  const int64_t groups = (re - rb + G - 1) / G;
  const int64_t my_groups = groups > warp ? (groups - warp + n_warps - 1) / n_warps : 0;
  const int64_t items = my_groups * nseg;
  uint8_t* ring = smem + x_bytes + size_t(warp) * size_t(nbuf) * slot_bytes;
  uint64_t* bar = bars[warp];
  const uint64_t seg_bytes = uint64_t(seg_cols / K::kQK) * K::kBytes;
  const uint64_t data_bytes = uint64_t(cols / K::kQK) * K::kBytes;
  // Item i: group warp + (i / nseg) * n_warps, segment i % nseg.
  auto issue = [&](int64_t i) {
    const int64_t r0 = rb + (warp + (i / nseg) * n_warps) * G;
    const int nr = int(min(int64_t(G), re - r0));
    const uint64_t off = uint64_t(i % nseg) * seg_bytes;
    const uint32_t len = uint32_t(min(seg_bytes, data_bytes - off));
    uint8_t* dst = ring + size_t(i % nbuf) * slot_bytes;
    uint64_t* b = bar + i % nbuf;
    mbar_expect(b, len * uint32_t(nr));
    for (int r = 0; r < nr; ++r) bulk_copy(dst + r * seg_bytes, w + uint64_t(r0 + r) * row_bytes + off, len, b);
  };
  // Weights are never written by the kernels of a forward: the buffers fill
  // before pdl_wait(), overlapping the kernels before this one.
  if (lane == 0) {
    for (int i = 0; i < nbuf; ++i) mbar_init(&bar[i], 1);
    mbar_init_fence();
    for (int64_t i = 0; i < min(int64_t(nbuf), items); ++i) issue(i);
  }
  __syncwarp();
  pdl_trigger();
  pdl_wait();

  // The quantized x row into shared memory, and the RoPE angles of every
  // rotated dimension pair at this position (all heads share them), in
  // double as rope() computes them.
  for (uint32_t o = threadIdx.x * 16; o < x_bytes; o += blockDim.x * 16) {
    *reinterpret_cast<uint4*>(smem + o) = __ldg(reinterpret_cast<const uint4*>(xq + o));
  }
  if constexpr (kRope) {
    if (int(threadIdx.x) < rope.rot_dim / 2) {
      double sn, cs;
      sincos(double(*rope.pos) * double(rope.inv_freq[threadIdx.x]), &sn, &cs);
      rope_cs[threadIdx.x] = make_float2(float(cs), float(sn));
    }
  }
  __syncthreads();
  const XqRow xr = xq_row(smem, cols);
  const int seg_units = seg_cols / K::kQK * K::kLanes;

  float acc[G];
#pragma unroll
  for (int r = 0; r < G; ++r) acc[r] = 0.0f;
  for (int64_t i = 0; i < items; ++i) {
    const int slot = int(i % nbuf);
    const int64_t r0 = rb + (warp + (i / nseg) * n_warps) * G;
    const int nr = int(min(int64_t(G), re - r0));
    const int s = int(i % nseg);
    const int units = int(min(int64_t(seg_units), (cols - int64_t(s) * seg_cols) / K::kQK * K::kLanes));
    mbar_wait(&bar[slot], uint32_t(i / nbuf) & 1u);
    const uint8_t* buf = ring + size_t(slot) * slot_bytes;
#pragma unroll 2
    for (int u = lane; u < units; u += 32) {
      const int c = u % K::kLanes, blk = u / K::kLanes;
      const typename K::X xv = K::load_x_shared(xr, int64_t(s) * (seg_cols / K::kQK) + blk, c);
#pragma unroll
      for (int r = 0; r < G; ++r) {
        if (r < nr) acc[r] += K::dot(K::load_w_shared(buf + r * seg_bytes + uint64_t(blk) * K::kBytes, c), xv, c);
      }
    }
    __syncwarp();  // every lane is done with the buffer
    if (lane == 0 && i + nbuf < items) {
      bulk_fence_reads();
      issue(i + nbuf);
    }
    if (s + 1 < nseg) continue;
    // The group's last segment: reduce and write its rows.
#pragma unroll
    for (int r = 0; r < G; ++r) acc[r] = warp_sum(acc[r]);
    if constexpr (kRope) {
#pragma unroll
      for (int p = 0; p < G / 2; ++p) {
        if (lane == p && 2 * p < nr) {
          const int64_t row = r0 + 2 * p, g = rope.first_row + row;
          const int d = int(g % rope.head_dim);
          const bool rotate = g < rope.q_rows + rope.k_rows && d < rope.rot_dim;
          const float2 cs = rotate ? rope_cs[d / 2] : make_float2(1.0f, 0.0f);
          qkv_rope_pair(rope, row, acc[2 * p], acc[2 * p + 1], rotate, cs.x, cs.y, out);
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < G; ++r) {
        if (lane == r && r < nr) out[r0 + r] = acc[r];
      }
    }
#pragma unroll
    for (int r = 0; r < G; ++r) acc[r] = 0.0f;
  }
}

// Dynamic shared memory the kernel may take on this device: the opt-in
// limit per block less room for its static arrays (about 227 KiB on sm_90,
// 99 KiB on sm_120).
inline size_t stream_smem_limit() {
  static const size_t limit = [] {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      return size_t(0);
    }
    return size_t(std::max(0, optin - (4 << 10)));
  }();
  return limit;
}

// The launch shape for w, or blocks == 0 where the kernel does not apply:
// rows 16-byte aligned and a segment's bytes a multiple of 16 (bulk copies;
// Q8_0 needs columns in multiples of 256), and the buffers and x within the
// device's shared memory.
template <class K, int G>
StreamGeom stream_geometry(const MatrixView& w, const StreamConfig& cfg, int sms) {
  StreamGeom g;
  const int64_t seg_quantum = K::kType == DType::Q8_0 ? 256 : K::kQK;
  if (w.row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 || w.cols % seg_quantum != 0) return g;
  if (cfg.warps < 1 || cfg.warps > kStreamMaxWarps) return g;
  g.seg_cols = int(std::clamp<int64_t>(cfg.seg_cols / seg_quantum * seg_quantum, seg_quantum, w.cols));
  g.nseg = int((w.cols + g.seg_cols - 1) / g.seg_cols);
  g.nbuf = std::clamp(cfg.nbuf, 1, kStreamMaxBuffers);
  g.slot_bytes = uint32_t(uint64_t(G) * uint64_t(g.seg_cols / K::kQK) * K::kBytes + kStreamPad);
  g.x_bytes = uint32_t((uint64_t(w.cols) * 2 + uint64_t(w.cols / 32) * 8 + 15) / 16 * 16);  // xq_row_bytes
  g.warps = cfg.warps;
  g.blocks = int(std::min<int64_t>(sms, (w.rows + 1) / 2));
  // Fewer buffers per warp where shared memory is short (wide x rows, sm_120).
  for (;; --g.nbuf) {
    g.smem = g.x_bytes + size_t(g.warps) * size_t(g.nbuf) * g.slot_bytes;
    if (g.smem <= stream_smem_limit()) return g;
    if (g.nbuf == 2) return StreamGeom{};
  }
}

template <class K, int G, bool kRope>
void launch_stream_kernel(const MatrixView& w, const StreamGeom& g, const void* xq, float* out, const QkvRope& rope,
                          cudaStream_t stream) {
  auto* kernel = matvec_stream_kernel<K, G, kRope>;
  // Above 48 KiB of dynamic shared memory needs the opt-in; the device's
  // limit is set once per instantiation.
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(stream_smem_limit()));
  check(opt_in, "cudaFuncSetAttribute (matvec_stream_kernel)", __FILE__, __LINE__);
  launch_pdl("matvec_stream_kernel", kernel, dim3(unsigned(g.blocks)), dim3(unsigned(g.warps * 32)), g.smem, stream,
             static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, static_cast<const uint8_t*>(xq), out,
             rope, g.seg_cols, g.nseg, g.nbuf, g.slot_bytes, g.x_bytes);
}

// One token through the streamed kernel with groups of G rows. Returns
// false, launching nothing, where the shape does not fit it.
template <class K, int G, bool kRope>
bool launch_matvec_stream(const MatrixView& w, const void* xq, float* out, const QkvRope& rope, cudaStream_t stream,
                          const StreamConfig& cfg) {
  static_assert(G % 2 == 0, "rows go in pairs (the RoPE epilogue)");
  const StreamGeom g = stream_geometry<K, G>(w, cfg, sm_count());
  if (g.blocks == 0) return false;
  launch_stream_kernel<K, G, kRope>(w, g, xq, out, rope, stream);
  return true;
}

}  // namespace baton::cuda::detail
