// Device side of the quantized activations read by the integer-dot matvec
// (matvec.cuh: matvec_xq). Device-only: include from .cu files.
//
// One token's row of n activations (n a multiple of 32) is stored as
//   hi[n] int8 | lo[n] int8 | ds[n / 32] float2 (scale d, float sum of the 32)
// where each run of 32 values x is quantized to 16-bit integers
//   q = rint(x / d), d = max|x| / 32512, q = 256 * hi + lo, lo in [-128, 127],
// so that a weight dot product is two dp4a per 4 weights and exact in
// int32: sum w q = 256 * sum w hi + sum w lo. The 16-bit grid keeps the
// error of x at most max|x| / 65024 per element (about 1.5e-5 relative),
// far below that of 8-bit activations, so decode matches the float CPU
// reference to the same tolerances as the float kernels. The float sum
// serves the K-quants' minimum term (dmin * m * sum x) without rounding.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace baton::cuda::detail {

constexpr float kXqMax = 32512.0f;  // 127 * 256: hi stays within int8 after rounding

struct XqRow {
  const int8_t* hi;
  const int8_t* lo;
  const float2* ds;
};

__device__ __forceinline__ XqRow xq_row(const uint8_t* base, int64_t n) {
  return {reinterpret_cast<const int8_t*>(base), reinterpret_cast<const int8_t*>(base + n),
          reinterpret_cast<const float2*>(base + 2 * n)};
}

// The 16-bit integer of value v in a run whose largest magnitude is amax.
__device__ __forceinline__ int xq_quantize(float v, float amax) {
  return amax > 0.0f ? min(max(__float2int_rn(v * (kXqMax / amax)), -32512), 32512) : 0;
}

// q = 256 * hi + lo with lo in [-128, 127]; |q| <= 32512 keeps hi in int8.
__device__ __forceinline__ void xq_split(int q, int& hi, int& lo) {
  hi = (q + 128) >> 8;
  lo = q - hi * 256;
}

// Four consecutive values of a run (one float4) as their hi and lo bytes,
// packed little-endian into one word each.
__device__ __forceinline__ void xq_pack4(float4 v, float amax, uint32_t& hi4, uint32_t& lo4) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  hi4 = lo4 = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    int hi, lo;
    xq_split(xq_quantize(f[k], amax), hi, lo);
    hi4 |= uint32_t(hi & 0xff) << (8 * k);
    lo4 |= uint32_t(lo & 0xff) << (8 * k);
  }
}

// The 32 lanes of a warp hold the 32 values of run `run` of a row of n
// values at `base`; writes the run's hi, lo bytes and (d, sum). Every lane
// of the warp must call it.
__device__ __forceinline__ void xq_store_run(float v, int lane, uint8_t* base, int64_t n, int64_t run) {
  const float amax = warp_max(fabsf(v));
  const float sum = warp_sum(v);
  const float d = amax / kXqMax;
  int hi, lo;
  xq_split(xq_quantize(v, amax), hi, lo);
  const int64_t e = run * 32 + lane;
  base[e] = uint8_t(int8_t(hi));
  base[n + e] = uint8_t(int8_t(lo));
  if (lane == 0) reinterpret_cast<float2*>(base + 2 * n)[run] = make_float2(d, sum);
}

}  // namespace baton::cuda::detail
