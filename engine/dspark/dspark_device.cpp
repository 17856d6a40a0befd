// The build without CUDA: no device network (engine/cuda/dspark_drafter.cpp
// defines these otherwise).
#include "engine/dspark/dspark_device.h"

#include <stdexcept>

#ifndef BATON_HAVE_CUDA
namespace baton {

std::shared_ptr<const DsparkDeviceWeights> dspark_device_weights(const StageRunner&, const GgufFile&,
                                                                 const DsparkShape&, const LoadOptions&) {
  return nullptr;
}

std::unique_ptr<DsparkNetwork> dspark_device_network(std::shared_ptr<const DsparkDeviceWeights>) {
  throw std::logic_error("dspark_device_network: this build has no CUDA backend");
}

std::unique_ptr<DsparkNetwork> dspark_device_network(const StageRunner&, const GgufFile&, const DsparkShape&,
                                                     const LoadOptions&) {
  return nullptr;
}

}  // namespace baton
#endif
