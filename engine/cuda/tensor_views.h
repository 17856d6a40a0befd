// A loaded tensor as the CUDA kernels take it, for every CUDA user of a
// Model's device views (the stages, the DSpark drafter): one place for the
// view, the stacked-expert view, the decode kernels' refusal and the
// hyper-connection shape of a deepseek4 block.
//
// Only compiled when the build has CUDA.
#pragma once

#include <fmt/format.h>

#include <stdexcept>

#include "engine/model/deepseek4_shape.h"
#include "engine/model/model.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ds4_hc.cuh"
#include "kernels/cuda/moe.cuh"

namespace baton {

inline cuda::MatrixView matrix_view(const Tensor& t) { return {t.type, t.data, t.rows(), t.ne[0], t.row_bytes}; }

// A stacked expert tensor ([cols, rows per expert, n_expert]).
inline cuda::ExpertMatrix expert_matrix(const Tensor& t) {
  cuda::ExpertMatrix e;
  e.w = matrix_view(t);
  e.n_expert = t.ne[2];
  return e;
}

// Throws std::runtime_error naming the tensor unless the decode kernels
// (matvec, get_rows) read it: a dtype they have, rows they take.
inline void check_decode_matrix(const Tensor& t) {
  if (!cuda::device_dtype_supported(t.type)) {
    throw std::runtime_error(fmt::format("tensor {} has dtype {}, which the CUDA backend has no kernel for", t.name,
                                         dtype_name(t.type)));
  }
  try {
    cuda::validate_matrix(matrix_view(t), "matvec");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("tensor {} cannot run on the CUDA backend: {}", t.name, e.what()));
  }
}

inline cuda::Ds4HcShape ds4_hc_shape(const Deepseek4Shape& s) {
  cuda::Ds4HcShape h;
  h.n_hc = s.n_hc;
  h.n_embd = s.n_embd;
  h.sinkhorn_iters = s.hc_sinkhorn_iters;
  h.hc_eps = float(s.hc_eps);
  h.rms_eps = float(s.rms_eps);
  return h;
}

}  // namespace baton
