// The collective a tensor-parallel stage group needs: N ranks, each holding
// 1/N of every layer, sum their partial results after each attention output
// and each FFN (about 86 calls per DeepSeek V4 token, 16-64 KiB each), and
// gather sliced logits.
//
// Every implementation gives BITWISE identical results on every rank: a rank
// whose activations differed from its neighbours' in the last bit would
// sample another token sooner or later, and the ranks would run different
// sequences. So sum() adds the N buffers in rank order 0..N-1 in float on
// every rank (the same operations in the same order give the same bits),
// rather than in arrival order or as a reduce-scatter whose partial sums
// differ per rank. NCCL's all-reduce gives the same guarantee its own way:
// every rank receives the one result its reduction produced.
//
// The engine sees only this interface; the TCP mesh (net/allreduce.h) and the
// NCCL group (net/nccl_allreduce.h) implement it from above, so this header
// includes nothing of the cluster.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton {

class TpComm {
 public:
  virtual ~TpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] becomes the sum over ranks 0..N-1 of their data[i],
  // added in rank order. Every rank calls with the same n; one that does not
  // is an error on every rank, not a hang. Where the data lives (host or
  // device memory) is the implementation's: host for the TCP and in-process
  // groups, device for NCCL.
  virtual void sum(float* data, size_t n) = 0;
  // all[r * n + i] = rank r's mine[i] (rank-major), on every rank.
  virtual void gather(const float* mine, size_t n, float* all) = 0;
  // Where the buffers of sum() and gather() live: false, host memory (the
  // in-process group, the TCP mesh); true, device memory (NCCL), which a
  // CUDA stage then hands over as it is instead of staging it through
  // pinned host memory (engine/cuda/stage_base.h).
  virtual bool device_buffers() const { return false; }
  // A group whose calls a CUDA stage queues on its own stream, where a
  // captured decode graph takes them in like any kernel: no host
  // synchronisation and no cut of the graph at each exchange. `stream` is
  // the stage's cudaStream_t (void* keeps CUDA out of this header); the
  // buffers are device memory. The lone rank of `baton bench --tp-alone` on
  // CUDA is one (engine/cuda/lone_rank.h).
  // Inline, as the rest of this interface: net/ implements it without
  // linking the engine.
  virtual bool on_stream() const { return false; }
  virtual void sum_on_stream(float*, size_t, void*) {
    throw std::logic_error("this tensor-parallel group cannot queue its calls on a CUDA stream");
  }
  virtual void gather_on_stream(const float*, size_t, float*, void*) {
    throw std::logic_error("this tensor-parallel group cannot queue its calls on a CUDA stream");
  }
};

// A rank file (rank file_rank of file_size) runs only with its group's link
// of that rank and size, and a whole model (file_size 1) only without one or
// in a group of one: std::invalid_argument otherwise, naming both. The CPU
// forwards check at every call, the CUDA stages at construction.
void check_tp_rank(int file_rank, int file_size, const TpComm* tp);

// One rank of a group of N measured alone (`baton bench --tp-alone`,
// docs/PERFORMANCE.md): no peers and no traffic. sum() leaves the rank's own
// partial as it is, as if every other rank had added zeros; gather() puts
// the rank's slice in its place and zeros in the others'. The rank then
// reads, computes and moves exactly what it does in its group, so its step
// time is the group's step time without the network; its logits are not the
// model's. Host buffers.
class LoneTpRank final : public TpComm {
 public:
  LoneTpRank(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(float* data, size_t n) override;
  void gather(const float* mine, size_t n, float* all) override;

 private:
  int rank_, size_;
};

// N ranks as threads of one process, for engine tests: make one
// InProcessTpGroup and give each thread its member(r). A call waits for all
// N members (at most `timeout`, then every waiting rank throws), each copies
// its buffer in, and each rank sums the N copies in rank order itself: the
// same float additions in the same order as the TCP mesh, so both give the
// same bits. Sizes that differ between ranks throw on every rank.
class InProcessTpGroup {
 public:
  explicit InProcessTpGroup(int size, int timeout_ms = 10000);
  ~InProcessTpGroup();
  InProcessTpGroup(const InProcessTpGroup&) = delete;
  InProcessTpGroup& operator=(const InProcessTpGroup&) = delete;

  int size() const { return size_; }
  // Rank r's end; lives as long as the group. One thread per member at a time.
  TpComm& member(int r);

 private:
  class Member;
  friend class Member;
  // One round: every member deposits its buffer, then each writes its
  // result (kind 's': the rank-order sum into out[n]; 'g': the N buffers
  // into out[N * n]). Throws when sizes or kinds disagree or time runs out.
  void exchange(int rank, char kind, const float* mine, size_t n, float* out);

  int size_;
  int timeout_ms_;
  std::vector<std::unique_ptr<Member>> members_;
  std::mutex mu_;
  std::condition_variable cv_;
  // A round goes through two phases: N deposits, then N reads; a fast
  // rank's next deposit waits until every rank has read.
  int deposited_ = 0, read_ = 0;
  bool reading_ = false;
  char kind_ = 0;
  size_t n_ = 0;
  std::string broken_;  // once set, every call throws it
  std::vector<float> slots_;  // N x n, grown to the largest call
};

}  // namespace baton
