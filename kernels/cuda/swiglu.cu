// SwiGLU (swiglu.cuh): one kernel for every variant, the differences
// compile-time flags of a variant struct (named in a graph profile), so each
// launcher runs the code its old kernel ran. Each launcher keeps its grid:
// 256 threads, at most 32 blocks per multiprocessor, or 16 for the rows of
// the llama stage.
#include "kernels/cuda/swiglu.cuh"

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu_act.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

constexpr int kThreads = 256;

// kClamp: DeepSeek's clamp (swiglu_act.cuh). kRows: gate and up rows
// in_stride apart (else contiguous). kXq: quantize each output row. kPdl:
// launched with launch_pdl, in the decode chain.
struct SwigluPlain {
  static constexpr bool kClamp = false, kRows = false, kXq = false, kPdl = false;
};
struct SwigluRows {
  static constexpr bool kClamp = false, kRows = true, kXq = false, kPdl = false;
};
struct SwigluRowsXq {
  static constexpr bool kClamp = false, kRows = true, kXq = true, kPdl = true;
};
struct SwigluClamped {
  static constexpr bool kClamp = true, kRows = false, kXq = false, kPdl = true;
};
struct SwigluClampedXq {
  static constexpr bool kClamp = true, kRows = false, kXq = true, kPdl = true;
};

// Output i of `total` (rows of n; grid-stride, a thread per output): row
// i / n, column i % n. With kXq (n a multiple of 32, blocks of whole warps)
// a warp's 32 outputs are one run of 32 of one row in every step, since the
// loop's stride is a multiple of 32, and the warp quantizes it (xq.cuh);
// the step is the one a warp per run took.
template <class V>
__global__ void swiglu_kernel(const float* gate, const float* up, int64_t in_stride, float* out, int64_t total,
                              int64_t n, float clamp, uint8_t* xq, uint64_t xq_stride) {
  if constexpr (V::kPdl) {
    pdl_trigger();
    pdl_wait();  // gate and up come from the projection before (pdl.cuh)
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;  // not computed when neither kRows nor kXq reads them
    const int64_t src = V::kRows ? r * in_stride + c : i;
    const float v = swiglu_act<V::kClamp>(gate[src], up[src], clamp);
    out[i] = v;
    if constexpr (V::kXq) xq_store_run(v, int(threadIdx.x & 31), xq + uint64_t(r) * xq_stride, n, c / 32);
  }
}

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n < 0) throw std::invalid_argument("swiglu: negative length");
  if (n == 0) return;
  swiglu_kernel<SwigluPlain><<<grid_for(n, kThreads), kThreads, 0, stream>>>(gate, up, n, out, n, n, 0.0f, nullptr,
                                                                                0);
  check_launch("swiglu_kernel");
}

void swiglu_clamped(const float* gate, const float* up, float* out, int64_t n, float clamp, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (gate == nullptr || up == nullptr || out == nullptr))) {
    throw std::invalid_argument("swiglu_clamped: bad buffers");
  }
  if (!(clamp > 0.0f)) throw std::invalid_argument("swiglu_clamped: the clamp must be positive (INFINITY: none)");
  if (n == 0) return;
  launch_pdl("swiglu_clamped_kernel", swiglu_kernel<SwigluClamped>, dim3(grid_for(n, kThreads)), dim3(kThreads), 0,
             stream, gate, up, n, out, n, n, clamp, nullptr, 0);
}

void swiglu_rows(const float* gate, const float* up, int64_t in_stride, float* out, int64_t n_rows, int64_t n,
                 cudaStream_t stream, void* xq) {
  require(gate && up && out && n > 0 && in_stride >= n && n_rows >= 0, "swiglu_rows: bad arguments");
  require(!xq || n % 32 == 0, "swiglu_rows: quantized output needs a row length that is a multiple of 32");
  if (n_rows == 0) return;
  const dim3 grid(grid_for(n_rows * n, kThreads, 16));
  if (xq) {
    launch_pdl("swiglu_xq_kernel", swiglu_kernel<SwigluRowsXq>, grid, dim3(kThreads), 0, stream, gate, up, in_stride,
               out, n_rows * n, n, 0.0f, static_cast<uint8_t*>(xq), xq_row_bytes(n));
    return;
  }
  swiglu_kernel<SwigluRows><<<grid, kThreads, 0, stream>>>(gate, up, in_stride, out, n_rows * n, n, 0.0f, nullptr, 0);
  check_launch("swiglu_rows_kernel");
}

void ds4_swiglu_xq_clamped(const float* gate, const float* up, float* out, int64_t n, int64_t n_rows, float clamp,
                           void* xq, cudaStream_t stream) {
  require(gate && up && out && xq && n > 0 && n % 32 == 0 && n_rows >= 1, "ds4_swiglu_xq_clamped",
          "need buffers, n a positive multiple of 32 and 1+ rows");
  const int64_t total = n * n_rows;
  launch_pdl("swiglu_xq_clamped_kernel", swiglu_kernel<SwigluClampedXq>, dim3(grid_for(total, kThreads)),
             dim3(kThreads), 0, stream, gate, up, n, out, total, n, clamp, static_cast<uint8_t*>(xq),
             xq_row_bytes(n));
}

}  // namespace baton::cuda
