// Device-only helpers for the .cu files: reductions, read-only loads at the
// alignments GGUF blocks give us, and cheap byte-to-float conversion.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace baton::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum (or max) over the whole block, returned to every thread. `red` is
// shared scratch of 32 floats; the leading barrier lets callers reuse it for
// consecutive reductions. Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return warp_sum(lane < n_warps ? red[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return warp_max(lane < n_warps ? red[lane] : -INFINITY);
}

// --- loads -------------------------------------------------------------------
// Blocks of 34, 18, 66 and 210 bytes are only 2-byte aligned inside a row, so
// their fields are read as 16-bit halves; Q2_K (84 bytes) allows 32 bits and
// Q4_K/Q5_K (144/176 bytes) 64 bits. All weight bytes are read-only for the
// kernel's lifetime, hence __ldg.

__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return __ldg(p); }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
// 4 bytes at a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint2 ld_u64(const uint8_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
__device__ __forceinline__ uint4 ld_u128(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// N consecutive 32-bit words starting at a 2-byte aligned address, read as N
// aligned words (from the address rounded down) plus, when the address is
// not 4-byte aligned, one 16-bit tail, then realigned with funnel shifts.
// Reads stay inside [p - 2, p + 4N): never past the end of the range, and
// when p is 2 mod 4 the two bytes before it still belong to the matrix
// (whose start is 16-byte aligned), so an exactly sized allocation is never
// overrun.
template <int N>
__device__ __forceinline__ void ld_words_a2(const uint8_t* p, uint32_t* out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const unsigned* base = reinterpret_cast<const unsigned*>(a & ~uintptr_t(3));
  const unsigned shift = unsigned(a & 2u) * 8u;  // 0 or 16
  uint32_t w[N];
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __ldg(base + i);
  const uint32_t tail = shift ? ld_u16(p + 4 * N - 2) : 0u;
#pragma unroll
  for (int i = 0; i + 1 < N; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], shift);
  out[N - 1] = __funnelshift_r(w[N - 1], tail, shift);
}

__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}
__device__ __forceinline__ float bf16_bits_to_float(uint32_t h) { return __uint_as_float((h & 0xffffu) << 16); }

// --- byte -> float -------------------------------------------------------------
// Integer-to-float conversion runs at a quarter of the FMA rate or less, too
// slow when a matvec must turn 30+ weights per clock per SM into floats. The
// bit pattern 0x4B0000bb is the float 2^23 + bb exactly, so one byte permute
// and one subtraction convert a byte; `bias` folds an offset into the
// subtraction (2^23 + 128 for bytes that hold int8 + 128, 2^23 + 32 for Q6_K).
template <int kByte>
__device__ __forceinline__ float byte_to_float(uint32_t word, float bias) {
  return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | kByte)) - bias;
}

// The four bytes of `word`, in order, as floats minus (bias - 2^23).
__device__ __forceinline__ void bytes_to_floats(uint32_t word, float bias, float* out) {
  out[0] = byte_to_float<0>(word, bias);
  out[1] = byte_to_float<1>(word, bias);
  out[2] = byte_to_float<2>(word, bias);
  out[3] = byte_to_float<3>(word, bias);
}

constexpr float kMagic = 8388608.0f;  // 2^23: bytes_to_floats(w, kMagic) gives the plain byte values

}  // namespace baton::cuda::detail
