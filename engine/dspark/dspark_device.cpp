// The build without CUDA: no device network (engine/cuda/dspark_drafter.cpp
// defines it otherwise).
#include "engine/dspark/dspark_device.h"

#ifndef BATON_HAVE_CUDA
namespace baton {

std::unique_ptr<DsparkNetwork> dspark_device_network(const StageRunner&, const GgufFile&, const DsparkShape&,
                                                     const LoadOptions&) {
  return nullptr;
}

}  // namespace baton
#endif
