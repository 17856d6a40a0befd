// A build without NCCL: no link can use it, and the coordinator is told so
// in HELLO (caps.nccl false), so every stage link is TCP.
#include "net/nccl_allreduce.h"
#include "net/nccl_link.h"

#include <cstdlib>

namespace baton::net {

bool nccl_built() { return false; }

void disable_nvls() { setenv("NCCL_NVLS_ENABLE", "0", 1); }

NcclProbe probe_nccl(int) {
  disable_nvls();  // the same contract as with NCCL: probing sets it
  NcclProbe p;
  p.why_not = "this build has no NCCL";
  return p;
}

std::vector<uint8_t> nccl_unique_id() { throw NcclLinkError("this build has no NCCL"); }

struct NcclLink::Impl {};

NcclLink::NcclLink(const std::vector<uint8_t>&, int, NcclLinkConfig config) : config_(std::move(config)) {
  throw NcclLinkError(config_.name + ": this build has no NCCL");
}
NcclLink::~NcclLink() = default;
void NcclLink::wait_ready() {}
void NcclLink::send(const float*, uint64_t, void*) { throw NcclLinkError(config_.name + ": this build has no NCCL"); }
void NcclLink::recv(float*, uint64_t) { throw NcclLinkError(config_.name + ": this build has no NCCL"); }
void NcclLink::abort(const std::string&) { broken_ = true; }

struct NcclAllReduce::Impl {};

NcclAllReduce::NcclAllReduce(const std::vector<uint8_t>&, NcclAllReduceConfig config) : config_(std::move(config)) {
  throw NcclLinkError(config_.name + ": this build has no NCCL");
}
NcclAllReduce::~NcclAllReduce() = default;
void NcclAllReduce::wait_ready() {}
void NcclAllReduce::sum(float*, size_t) { throw NcclLinkError(config_.name + ": this build has no NCCL"); }
void NcclAllReduce::gather(const float*, size_t, float*) {
  throw NcclLinkError(config_.name + ": this build has no NCCL");
}
void NcclAllReduce::abort(const std::string&) { broken_ = true; }

}  // namespace baton::net
