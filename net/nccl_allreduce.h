// The tensor-parallel collective on GPUs: an NCCL communicator of N ranks
// (one GPU each) implementing TpComm (engine/runtime/tp_comm.h) on DEVICE
// buffers: sum() is ncclAllReduce(sum) in place, gather() ncclAllGather,
// which writes rank-major as TpComm asks.
//
// Every rank ends with the same bits: NCCL's ring and tree algorithms reduce
// each element once, on one rank, and hand that result to all (NVLink
// multicast, whose switch-side reduction we cannot see, stays off:
// disable_nvls()). The bits differ from the rank-order sum of the TCP mesh
// (another order of additions), so a group is all NCCL or all TCP.
//
// Compiled with NCCL only (BATON_HAVE_NCCL, net/nccl_allreduce.cpp);
// without it the constructor throws NcclLinkError (net/nccl_none.cpp).
// Bounded like NcclLink: init and every call poll the communicator with a
// deadline and abort it when that passes or NCCL reports an error; after
// that every call throws.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/runtime/tp_comm.h"
#include "net/nccl_link.h"

namespace baton::net {

struct NcclAllReduceConfig {
  int device = 0;
  int rank = 0;
  int size = 1;
  std::string name;  // for errors; "" -> "NCCL all-reduce, rank R of N"
  // The stream that produces and consumes the buffers (a cudaStream_t; null:
  // the legacy default stream). Calls are ordered after its work and return
  // when the result is in place.
  void* stream = nullptr;
  std::chrono::milliseconds init_timeout{30000};
  std::chrono::milliseconds op_timeout{2000};  // one call, including waiting for the other ranks
};

class NcclAllReduce final : public TpComm {
 public:
  // `id` is one nccl_unique_id() that rank 0 made and every rank received
  // (over the authenticated TCP mesh or a stage link). Starts joining
  // (nonblocking); throws NcclLinkError when NCCL refuses at once.
  NcclAllReduce(const std::vector<uint8_t>& id, NcclAllReduceConfig config);
  ~NcclAllReduce() override;
  NcclAllReduce(const NcclAllReduce&) = delete;
  NcclAllReduce& operator=(const NcclAllReduce&) = delete;

  // Waits until every rank has joined (init_timeout).
  void wait_ready();

  int rank() const override { return config_.rank; }
  int size() const override { return config_.size; }
  void sum(float* device_data, size_t n) override;
  void gather(const float* device_mine, size_t n, float* device_all) override;
  bool device_buffers() const override { return true; }

  // Any thread: the group is dead; the call in progress and every later one
  // fail with `why`.
  void abort(const std::string& why);

 private:
  struct Impl;
  NcclAllReduceConfig config_;
  std::atomic<bool> broken_{false};
  std::mutex mu_;
  std::string abort_reason_;
  std::unique_ptr<Impl> impl_;
  friend struct Impl;
};

}  // namespace baton::net
