// NcclAllReduce with NCCL (builds with BATON_HAVE_NCCL): see
// net/nccl_allreduce.h. The watchdog is NcclLink's (net/nccl_link.cpp): a
// nonblocking communicator, polled with a deadline, aborted on error.
#include "net/nccl_allreduce.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

namespace baton::net {

namespace {
using Clock = std::chrono::steady_clock;
}

struct NcclAllReduce::Impl {
  explicit Impl(NcclAllReduce& s) : self(s) {}
  ~Impl() {
    // Abort rather than destroy: ncclCommDestroy waits for pending work,
    // which a dead rank never completes.
    cudaSetDevice(self.config_.device);
    if (comm && !aborted) ncclCommAbort(comm);
    if (done) cudaEventDestroy(done);
  }

  NcclAllReduce& self;
  ncclComm_t comm = nullptr;
  bool ready = false, aborted = false;
  cudaEvent_t done = nullptr;

  cudaStream_t stream() const { return static_cast<cudaStream_t>(self.config_.stream); }

  [[noreturn]] void fail(const std::string& why) {
    if (comm && !aborted) {
      ncclCommAbort(comm);
      aborted = true;
    }
    self.broken_ = true;
    throw NcclLinkError(self.config_.name + ": " + why);
  }

  void cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
  }

  template <class F>
  void poll(const std::string& what, std::chrono::milliseconds timeout, F finished) {
    const auto deadline = Clock::now() + timeout;
    for (int spin = 0;; ++spin) {
      if (self.broken_) {
        std::string why;
        {
          std::lock_guard lock(self.mu_);
          why = self.abort_reason_;
        }
        fail(what + ": " + (why.empty() ? "the group was aborted" : why));
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) fail(what + ": ncclCommGetAsyncError: " + ncclGetErrorString(r));
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(what + ": " + ncclGetErrorString(state) + " (" + ncclGetLastError(comm) + ")");
      }
      if (state == ncclSuccess && finished()) return;
      if (Clock::now() >= deadline) {
        fail(what + ": no progress within " + std::to_string(timeout.count()) +
             " ms (a rank stopped, died or made another call); the communicator was aborted");
      }
      // A layer's all-reduce takes microseconds: spin first, then sleep.
      if (spin > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void nccl(ncclResult_t r, const std::string& what) {
    if (r == ncclInProgress) return poll(what, self.config_.op_timeout, [] { return true; });
    if (r != ncclSuccess) fail(what + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm) + ")");
  }

  bool event_done() {
    const cudaError_t r = cudaEventQuery(done);
    if (r == cudaSuccess) return true;
    if (r != cudaErrorNotReady) fail(std::string("CUDA: ") + cudaGetErrorString(r));
    return false;
  }

  // Runs after the enqueue: waits for the stream to pass the collective.
  void finish(const char* what) {
    cuda(cudaEventRecord(done, stream()), "cudaEventRecord");
    poll(what, self.config_.op_timeout, [&] { return event_done(); });
  }
};

NcclAllReduce::NcclAllReduce(const std::vector<uint8_t>& id, NcclAllReduceConfig config)
    : config_(std::move(config)), impl_(std::make_unique<Impl>(*this)) {
  disable_nvls();
  if (config_.name.empty()) {
    config_.name = "NCCL all-reduce, rank " + std::to_string(config_.rank) + " of " + std::to_string(config_.size);
  }
  if (id.size() != sizeof(ncclUniqueId)) throw NcclLinkError(config_.name + ": the NCCL unique id has a wrong size");
  if (config_.size < 1 || config_.rank < 0 || config_.rank >= config_.size) {
    throw NcclLinkError(config_.name + ": bad rank or size");
  }
  Impl& m = *impl_;
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  m.cuda(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming), "cudaEventCreate");
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), sizeof uid.internal);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // init and collectives return at once; poll() bounds them
  const ncclResult_t r = ncclCommInitRankConfig(&m.comm, config_.size, uid, config_.rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    m.fail(std::string("ncclCommInitRank: ") + ncclGetErrorString(r) + " (" + ncclGetLastError(m.comm) + ")");
  }
}

NcclAllReduce::~NcclAllReduce() = default;

void NcclAllReduce::wait_ready() {
  Impl& m = *impl_;
  if (m.ready) return;
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  m.poll("NCCL init", config_.init_timeout, [] { return true; });
  m.ready = true;
}

void NcclAllReduce::sum(float* device_data, size_t n) {
  Impl& m = *impl_;
  if (!m.ready) m.fail("sum before the group is ready");
  if (broken_) m.poll("sum", config_.op_timeout, [] { return true; });  // throws the reason
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  m.nccl(ncclAllReduce(device_data, device_data, n, ncclFloat32, ncclSum, m.comm, m.stream()), "ncclAllReduce");
  m.finish("sum");
}

void NcclAllReduce::gather(const float* device_mine, size_t n, float* device_all) {
  Impl& m = *impl_;
  if (!m.ready) m.fail("gather before the group is ready");
  if (broken_) m.poll("gather", config_.op_timeout, [] { return true; });
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  m.nccl(ncclAllGather(device_mine, device_all, n, ncclFloat32, m.comm, m.stream()), "ncclAllGather");
  m.finish("gather");
}

void NcclAllReduce::abort(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (abort_reason_.empty()) abort_reason_ = why;
  }
  broken_ = true;
}

}  // namespace baton::net
