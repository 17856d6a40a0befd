// The build without CUDA: no device network (engine/cuda/dspark_drafter.cpp
// defines these otherwise).
#include "engine/dspark/dspark_device.h"

#include <fmt/format.h>

#include <stdexcept>

namespace baton {

std::string dspark_device_room(const StageRunner& target, uint64_t bytes) {
  const DeviceMemoryReport m = target.device_memory();
  if (m.total == 0) return "the target is not on a GPU";
  const uint64_t need = bytes + kDrafterDeviceMargin;
  if (need <= m.free_after) return "";
  constexpr double kGiB = double(uint64_t(1) << 30);
  return fmt::format("the drafter's {:.2f} GiB (and {:.0f} GiB spare) do not fit in the {:.2f} GiB the model left "
                     "free on the {}",
                     double(bytes) / kGiB, double(kDrafterDeviceMargin) / kGiB, double(m.free_after) / kGiB,
                     m.device.empty() ? std::string("GPU") : m.device);
}

std::string dspark_limit_room(Backend b, const MemoryPlan& without, const MemoryPlan& with, uint64_t limit) {
  if (!memory_limit_problem(b, without, limit).empty() || memory_limit_problem(b, with, limit).empty()) return "";
  return "it does not fit beside the model under --mem-limit";
}

}  // namespace baton

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
