// DeepSeek V4 compressor on the GPU: the gated pooling of every `ratio`
// tokens into one compressed KV row (the attention's and the indexer's), as
// the CPU code of engine/arch/deepseek4*.cpp (docs/DEEPSEEK4.md).
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, explicit
// stream, no allocation (scratch is the caller's workspace), bad arguments
// throw std::invalid_argument before anything is queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ds4_rows.cuh"

namespace baton::cuda {

// One compressor (the attention's or the indexer's) over a batch of
// consecutive tokens at positions pos0 .. pos0 + n_tokens - 1. Every `ratio`
// tokens one row: per feature d < dim, softmax over the window's slots of
// (gate + ape) weighting kv (lanes == 2: the previous window's lane 0, then
// this window's lane 1; lanes == 1: this window), then RMSNorm(norm) and
// RoPE (adjacent pairs) of the last rope_dim dims at the window's first
// position. The state keeps the last lanes * ratio tokens for later calls:
// rows [0, R) the kv projections, rows [R, 2R) gate + ape, R = lanes * ratio,
// lanes * dim floats each, position p at row p % R (the layout of the CPU
// KV stream kCompState / kIdxState).
struct Ds4CompressParams {
  int ratio = 0;
  int lanes = 0;        // 1 or 2
  int64_t dim = 0;      // row width, <= 1024
  int rope_dim = 0;     // even, <= dim
  float eps = 0;        // RMS norm epsilon
  const float* kv = nullptr;    // n_tokens rows of lanes * dim, `stride` floats apart
  const float* gate = nullptr;  // likewise
  int64_t stride = 0;
  MatrixView ape;               // F32 or F16: ratio rows of lanes * dim
  const float* norm = nullptr;  // [dim]
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float* state = nullptr;       // 2 * lanes * ratio rows of lanes * dim
  float* rows = nullptr;        // output row w at rows + w * dim
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  // Captured decode graphs: the first position is read from this device
  // int32 when the kernels run, and pos0 above is only its upper bound
  // (grids are sized for it). Null: pos0 is the position.
  const int32_t* pos0_dev = nullptr;
  // t) is one token of sequence batch.seq[t], whose state and rows are
  // batch.seq_stride floats per sequence on from those given.
  Ds4Rows batch;
};
void ds4_compress(const Ds4CompressParams& p, cudaStream_t stream);

}  // namespace baton::cuda
