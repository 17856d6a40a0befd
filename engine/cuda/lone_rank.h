// The lone rank of `baton bench --tp-alone` on a CUDA stage, queued on the
// stage's stream (docs/PERFORMANCE.md, "One tensor-parallel rank alone"):
// sum leaves the rank's partial rows as they are and gather puts its slice
// of the logits in place with zeros in the others', both as work on the
// stream, so the captured decode step stays one graph and the time measured
// is the rank's own reads and kernels. What a group adds to that (the
// network, and for a host group the copies and the synchronisation at each
// exchange) is measured apart: `--tp-exchange host` gives the lone rank of
// the host groups instead (LoneTpRank).
#pragma once

#include <memory>

#include "engine/runtime/tp_comm.h"

namespace baton {

// Defined in CUDA builds only. Throws std::invalid_argument for a rank out of range.
std::unique_ptr<TpComm> make_cuda_lone_rank(int rank, int size);

}  // namespace baton
