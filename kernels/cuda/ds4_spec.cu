// Speculative decoding's copies (ds4_spec.cuh): one block per (ring, row)
// of the checkpoint, grid-stride loops for the capture.
#include "kernels/cuda/ds4_spec.cuh"

#include "kernels/cuda/launch.cuh"

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 128;

// blockIdx.x: the forward's token t, blockIdx.y: the ring.
__global__ void ring_rows_kernel(const RingRows* __restrict__ rings, uint8_t* kv, int seq, int64_t pos0, int64_t n,
                                 int64_t keep, float* saved, bool restore) {
  const int64_t t = blockIdx.x;
  if (restore && t < keep) return;
  const RingRows g = rings[blockIdx.y];
  float* row = reinterpret_cast<float*>(kv + g.offset + uint64_t(seq) * g.seq_stride) + ((pos0 + t) % g.slots) * g.width;
  float* at = saved + g.saved_at * n + t * g.width;
  const float* src = restore ? at : row;
  float* dst = restore ? row : at;
  for (int64_t i = threadIdx.x; i < g.width; i += blockDim.x) dst[i] = src[i];
}

__global__ void hc_mean_kernel(const float* __restrict__ x, int64_t n_tokens, int n_hc, int64_t E, float inv,
                               float* out, int64_t out_stride) {
  const int64_t total = n_tokens * E;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / E, d = i % E;
    const float* xt = x + t * n_hc * E + d;
    float acc = 0;
    for (int s = 0; s < n_hc; ++s) acc += xt[s * E];
    out[t * out_stride + d] = acc * inv;
  }
}

}  // namespace

void ring_rows_copy(const RingRows* rings, int64_t n_rings, uint8_t* kv, int seq, int64_t pos0, int64_t n,
                    int64_t keep, float* saved, bool restore, cudaStream_t stream) {
  require(rings && kv && saved && seq >= 0 && pos0 >= 0 && n >= 0 && keep >= 0 && keep <= n && n_rings >= 0 &&
              n_rings <= 65535,
          "ring_rows_copy: bad arguments");
  if (n == 0 || n_rings == 0 || (restore && keep == n)) return;
  ring_rows_kernel<<<dim3(unsigned(n), unsigned(n_rings)), kThreads, 0, stream>>>(rings, kv, seq, pos0, n, keep,
                                                                                  saved, restore);
  check_launch("ring_rows_kernel");
}

void hc_stream_mean(const float* x, int64_t n_tokens, int n_hc, int64_t E, float* out, int64_t out_stride,
                    cudaStream_t stream) {
  require(x && out && n_tokens >= 0 && n_hc >= 1 && E >= 1 && out_stride >= E, "hc_stream_mean: bad arguments");
  if (n_tokens == 0) return;
  hc_mean_kernel<<<grid_for(n_tokens * E, 256, 16), 256, 0, stream>>>(x, n_tokens, n_hc, E, 1.0f / float(n_hc), out,
                                                                       out_stride);
  check_launch("hc_mean_kernel");
}

}  // namespace baton::cuda
