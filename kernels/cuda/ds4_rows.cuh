// Decode rows of several sequences in one launch of the DeepSeek V4 kernels
// that read a sequence's own streams (compressor, indexer, attention, window
// ring). Plain C++ header.
#pragma once

#include <cstdint>

namespace baton::cuda {

// Rows of several sequences, one token each: row t is position pos[t] of
// sequence seq[t], whose KV streams lie seq[t] * seq_stride floats after the
// stream pointers a kernel is given (sequence 0's). Device arrays. With seq
// null (the default) the rows are consecutive tokens of one sequence from
// pos0. With seq set, pos0 is only the largest position of the rows, which
// sizes the grids.
struct Ds4Rows {
  const int32_t* seq = nullptr;
  const int32_t* pos = nullptr;
  int64_t seq_stride = 0;
};

}  // namespace baton::cuda
