// NcclLink with NCCL (builds with BATON_HAVE_NCCL): see net/nccl_link.h.
//
// One CUDA stream per link carries the NCCL operations and the copies around
// them, so they run in the order the frames go out, apart from the stage's
// compute stream. The sender keeps two device slots (and two pinned host
// slots for host rows): a FORWARD's rows are copied into a free slot and the
// call returns, so the next step's compute overlaps the transfer; a slot is
// reused only after its ncclSend finished (event per slot).
#include "net/nccl_link.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "net/protocol.h"

namespace baton::net {

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes, "LINK_SETUP carries the whole ncclUniqueId");

namespace {

using Clock = std::chrono::steady_clock;

bool has_rdma_device() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    (void)e;
    return true;
  }
  return false;
}

// The form nvidia-smi prints: GPU-8-4-4-4-12 hex digits.
std::string uuid_text(const cudaUUID_t& u) {
  static const char* hex = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    const auto b = uint8_t(u.bytes[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on old drivers; clear the sticky-free error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace

bool nccl_built() { return true; }

void disable_nvls() { setenv("NCCL_NVLS_ENABLE", "0", 1); }

NcclProbe probe_nccl(int device) {
  disable_nvls();
  NcclProbe p;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= device) {
    (void)cudaGetLastError();
    p.why_not = "no CUDA device";
    return p;
  }
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
    p.why_not = "the NCCL library does not answer";
    return p;
  }
  cudaDeviceProp prop{};
  char bus[32] = {};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(bus, int(sizeof bus), device) != cudaSuccess) {
    (void)cudaGetLastError();
    p.why_not = "cannot read the CUDA device's identity";
    return p;
  }
  p.available = true;
  p.version = uint32_t(version);
  p.device_uuid = uuid_text(prop.uuid);
  p.pci_bus_id = bus;
  p.rdma = has_rdma_device();
  return p;
}

std::vector<uint8_t> nccl_unique_id() {
  disable_nvls();
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw NcclLinkError(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  const auto* b = reinterpret_cast<const uint8_t*>(id.internal);
  return std::vector<uint8_t>(b, b + sizeof id.internal);
}

struct NcclLink::Impl {
  explicit Impl(NcclLink& s) : self(s) {}
  ~Impl() {
    // Abort rather than destroy: ncclCommDestroy waits for pending work,
    // which a dead peer never completes. The last owner may be any thread.
    cudaSetDevice(self.config_.device);
    abort_comm();
    if (stream) cudaStreamDestroy(stream);
    for (int s = 0; s < 2; ++s) {
      if (slot[s]) cudaFree(slot[s]);
      if (pinned[s]) cudaFreeHost(pinned[s]);
      if (sent[s]) cudaEventDestroy(sent[s]);
    }
    if (done) cudaEventDestroy(done);
    if (produced) cudaEventDestroy(produced);
  }

  NcclLink& self;
  ncclComm_t comm = nullptr;
  bool ready = false;
  bool aborted = false;
  cudaStream_t stream = nullptr;
  float* slot[2] = {};    // device buffers (the receiver uses slot[0])
  float* pinned[2] = {};  // host staging of the same size
  cudaEvent_t sent[2] = {}, done = nullptr, produced = nullptr;
  int next_slot = 0;

  void abort_comm() {
    if (comm && !aborted) {
      ncclCommAbort(comm);
      aborted = true;
    }
  }

  [[noreturn]] void fail(const std::string& why) {
    abort_comm();
    self.broken_ = true;
    throw NcclLinkError(self.config_.name + ": " + why);
  }

  void cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
  }

  bool event_done(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return true;
    if (r != cudaErrorNotReady) fail(std::string("CUDA: ") + cudaGetErrorString(r));
    return false;
  }

  // The watchdog: polls until finished() while the communicator is healthy;
  // an NCCL error, abort() or the deadline aborts the communicator.
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
        fail(what + ": " + (why.empty() ? "the link was aborted" : why));
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) fail(what + ": ncclCommGetAsyncError: " + ncclGetErrorString(r));
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(what + ": " + ncclGetErrorString(state) + " (" + ncclGetLastError(comm) + ")");
      }
      if (state == ncclSuccess && finished()) return;
      if (Clock::now() >= deadline) {
        fail(what + ": no progress within " + std::to_string(timeout.count()) + " ms; the communicator was aborted");
      }
      // Spin briefly (a decode step's rows take microseconds), then sleep.
      if (spin > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // An NCCL call on a nonblocking communicator may answer ncclInProgress;
  // nothing else may be called on it until its state is ncclSuccess.
  void nccl(ncclResult_t r, const std::string& what) {
    if (r == ncclInProgress) return poll(what, self.config_.op_timeout, [] { return true; });
    if (r != ncclSuccess) fail(what + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm) + ")");
  }
};

NcclLink::NcclLink(const std::vector<uint8_t>& id, int rank, NcclLinkConfig config)
    : config_(std::move(config)), impl_(std::make_unique<Impl>(*this)) {
  disable_nvls();
  if (id.size() != sizeof(ncclUniqueId)) throw NcclLinkError(config_.name + ": the NCCL unique id has a wrong size");
  if (config_.max_floats == 0 || (rank != 0 && rank != 1)) throw NcclLinkError(config_.name + ": bad link settings");
  Impl& m = *impl_;
  const size_t bytes = config_.max_floats * sizeof(float);
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  m.cuda(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int s = 0; s < (rank == 0 ? 2 : 1); ++s) {
    m.cuda(cudaMalloc(reinterpret_cast<void**>(&m.slot[s]), bytes), "cudaMalloc (link buffer)");
    m.cuda(cudaMallocHost(reinterpret_cast<void**>(&m.pinned[s]), bytes), "cudaMallocHost (link buffer)");
    m.cuda(cudaEventCreateWithFlags(&m.sent[s], cudaEventDisableTiming), "cudaEventCreate");
  }
  m.cuda(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming), "cudaEventCreate");
  m.cuda(cudaEventCreateWithFlags(&m.produced, cudaEventDisableTiming), "cudaEventCreate");
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), sizeof uid.internal);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // init and transfers return at once; poll() bounds them
  const ncclResult_t r = ncclCommInitRankConfig(&m.comm, 2, uid, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    m.fail(std::string("ncclCommInitRank: ") + ncclGetErrorString(r) + " (" + ncclGetLastError(m.comm) + ")");
  }
}

NcclLink::~NcclLink() = default;

void NcclLink::wait_ready() {
  Impl& m = *impl_;
  if (m.ready) return;
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  m.poll("NCCL init", config_.init_timeout, [] { return true; });
  m.ready = true;
}

void NcclLink::send(const float* src, uint64_t n, void* src_stream) {
  Impl& m = *impl_;
  if (!m.ready) m.fail("send before the link is ready");
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  const bool device = is_device_pointer(src);
  if (device && src_stream) {
    // Device rows: the copy waits for the stream that produced them.
    m.cuda(cudaEventRecord(m.produced, static_cast<cudaStream_t>(src_stream)), "cudaEventRecord");
    m.cuda(cudaStreamWaitEvent(m.stream, m.produced, 0), "cudaStreamWaitEvent");
  }
  for (uint64_t at = 0; at < n; at += config_.max_floats) {
    const uint64_t k = std::min<uint64_t>(config_.max_floats, n - at);
    const int s = m.next_slot;
    m.next_slot ^= 1;
    // The slot is free once its previous ncclSend completed, which needs the
    // receiver to have posted that FORWARD's ncclRecv.
    m.poll("waiting for a free send buffer", config_.op_timeout, [&] { return m.event_done(m.sent[s]); });
    if (device) {
      m.cuda(cudaMemcpyAsync(m.slot[s], src + at, k * sizeof(float), cudaMemcpyDeviceToDevice, m.stream),
             "cudaMemcpyAsync");
    } else {
      std::memcpy(m.pinned[s], src + at, k * sizeof(float));
      m.cuda(cudaMemcpyAsync(m.slot[s], m.pinned[s], k * sizeof(float), cudaMemcpyHostToDevice, m.stream),
             "cudaMemcpyAsync");
    }
    m.nccl(ncclSend(m.slot[s], size_t(k), ncclFloat32, 1, m.comm, m.stream), "ncclSend");
    m.cuda(cudaEventRecord(m.sent[s], m.stream), "cudaEventRecord");
  }
  if (device) {
    // The caller may overwrite its device rows after this returns.
    m.cuda(cudaEventRecord(m.done, m.stream), "cudaEventRecord");
    m.poll("copying the rows out", config_.op_timeout, [&] { return m.event_done(m.done); });
  }
}

void NcclLink::recv(float* dst, uint64_t n) {
  Impl& m = *impl_;
  if (!m.ready) m.fail("recv before the link is ready");
  m.cuda(cudaSetDevice(config_.device), "cudaSetDevice");
  const bool device = is_device_pointer(dst);
  for (uint64_t at = 0; at < n; at += config_.max_floats) {
    const uint64_t k = std::min<uint64_t>(config_.max_floats, n - at);
    float* target = device ? dst + at : m.slot[0];
    m.nccl(ncclRecv(target, size_t(k), ncclFloat32, 0, m.comm, m.stream), "ncclRecv");
    if (!device) {
      m.cuda(cudaMemcpyAsync(m.pinned[0], m.slot[0], k * sizeof(float), cudaMemcpyDeviceToHost, m.stream),
             "cudaMemcpyAsync");
    }
    m.cuda(cudaEventRecord(m.done, m.stream), "cudaEventRecord");
    m.poll("ncclRecv", config_.op_timeout, [&] { return m.event_done(m.done); });
    if (!device) std::memcpy(dst + at, m.pinned[0], k * sizeof(float));
  }
}

void NcclLink::abort(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (abort_reason_.empty()) abort_reason_ = why;
  }
  broken_ = true;
}

}  // namespace baton::net
