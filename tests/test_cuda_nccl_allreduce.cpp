// The NCCL tensor-parallel group (net/nccl_allreduce.h) on the GPUs of one
// machine, one rank per GPU (up to 8) as threads of this process: sum() gives
// every rank the same bits, within float rounding of the rank-order sum;
// gather() is rank-major and exact; a rank that never calls makes the others
// fail within their timeout. Needs two CUDA devices and a build with NCCL;
// skips, and says so, with less.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "net/nccl_allreduce.h"

namespace baton::net {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define REQUIRE_TWO_GPUS_WITH_NCCL()                                                                \
  do {                                                                                              \
    if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL (BATON_NCCL)";                       \
    if (const int n = device_count(); n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n; \
  } while (0)

std::vector<float> random_data(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 4.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

uint64_t seed_of(int rank, int call) { return 1000003ull * uint64_t(call + 1) + uint64_t(rank); }

// One thread per rank, each with its device and communicator.
std::vector<std::exception_ptr> on_ranks(int n, const std::function<void(int, NcclAllReduce&)>& fn,
                                         std::chrono::milliseconds op_timeout = 30s) {
  const std::vector<uint8_t> id = nccl_unique_id();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        NcclAllReduceConfig c;
        c.device = r;
        c.rank = r;
        c.size = n;
        c.op_timeout = op_timeout;
        NcclAllReduce group(id, c);
        group.wait_ready();
        fn(r, group);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::string message_of(const std::exception_ptr& e) {
  if (!e) return "(no error)";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "?";
}

struct DeviceBuffer {
  float* p = nullptr;
  explicit DeviceBuffer(size_t n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMalloc failed");
    }
  }
  ~DeviceBuffer() { cudaFree(p); }
};

// One rank on one GPU: the communicator comes up, and sum and gather run
// through NCCL and leave the data as it was (the sum of one buffer).
TEST(CudaNcclAllReduce, OneRankGroupOnOneGpu) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL (BATON_NCCL)";
  if (device_count() < 1) GTEST_SKIP() << "needs a CUDA device";
  auto errors = on_ranks(1, [&](int, NcclAllReduce& g) {
    const size_t n = 65536;
    const std::vector<float> host = random_data(7, n);
    DeviceBuffer d(n), all(n);
    ASSERT_EQ(cudaMemcpy(d.p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    g.sum(d.p, n);
    g.gather(d.p, n, all.p);
    std::vector<float> got(n), gathered(n);
    ASSERT_EQ(cudaMemcpy(got.data(), d.p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gathered.data(), all.p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(got.data(), host.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(gathered.data(), host.data(), n * sizeof(float)), 0);
  });
  ASSERT_FALSE(errors[0]) << message_of(errors[0]);
}

TEST(CudaNcclAllReduce, SumIsTheSameBitsOnEveryRankAndCloseToTheRankOrderSum) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  const int n_ranks = std::min(device_count(), 8);
  const size_t sizes[] = {1, 1000, 4096, 16384, 65536};
  // results[size][rank]: the last call's sum, copied back.
  std::vector<std::vector<std::vector<float>>> results(std::size(sizes),
                                                       std::vector<std::vector<float>>(size_t(n_ranks)));
  const int calls = 50;
  auto errors = on_ranks(n_ranks, [&](int r, NcclAllReduce& g) {
    for (size_t k = 0; k < std::size(sizes); ++k) {
      const size_t n = sizes[k];
      DeviceBuffer d(n);
      std::vector<float> host;
      for (int call = 0; call < calls; ++call) {
        host = random_data(seed_of(r, call), n);
        ASSERT_EQ(cudaMemcpy(d.p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
        g.sum(d.p, n);
      }
      ASSERT_EQ(cudaMemcpy(host.data(), d.p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      results[k][size_t(r)] = host;
    }
  });
  for (int r = 0; r < n_ranks; ++r) ASSERT_FALSE(errors[size_t(r)]) << message_of(errors[size_t(r)]);
  for (size_t k = 0; k < std::size(sizes); ++k) {
    const size_t n = sizes[k];
    std::vector<float> ref(n, 0.f), mag(n, 0.f);
    for (int r = 0; r < n_ranks; ++r) {
      const std::vector<float> x = random_data(seed_of(r, calls - 1), n);
      for (size_t i = 0; i < n; ++i) {
        ref[i] += x[i];
        mag[i] += std::fabs(x[i]);
      }
    }
    for (int r = 0; r < n_ranks; ++r) {
      EXPECT_EQ(std::memcmp(results[k][size_t(r)].data(), results[k][0].data(), n * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0 (" << n << " floats)";
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(results[k][size_t(r)][i], ref[i], 1e-6f * float(n_ranks) * mag[i] + 1e-30f)
            << "rank " << r << ", element " << i << " of " << n;
      }
    }
  }
}

TEST(CudaNcclAllReduce, GatherIsRankMajorAndExact) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  const int n_ranks = std::min(device_count(), 8);
  auto errors = on_ranks(n_ranks, [&](int r, NcclAllReduce& g) {
    for (size_t n : {size_t(1), size_t(777), size_t(65536)}) {
      DeviceBuffer mine(n), all(n * size_t(n_ranks));
      const std::vector<float> host = random_data(seed_of(r, int(n)), n);
      ASSERT_EQ(cudaMemcpy(mine.p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      g.gather(mine.p, n, all.p);
      std::vector<float> got(n * size_t(n_ranks));
      ASSERT_EQ(cudaMemcpy(got.data(), all.p, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      for (int q = 0; q < n_ranks; ++q) {
        const std::vector<float> theirs = random_data(seed_of(q, int(n)), n);
        EXPECT_EQ(std::memcmp(got.data() + size_t(q) * n, theirs.data(), n * sizeof(float)), 0)
            << "rank " << r << " holds a wrong slice of rank " << q;
      }
    }
  });
  for (int r = 0; r < n_ranks; ++r) EXPECT_FALSE(errors[size_t(r)]) << message_of(errors[size_t(r)]);
}

TEST(CudaNcclAllReduce, ARankThatNeverCallsFailsTheOthersWithinTheTimeout) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  double seconds = 0;
  auto errors = on_ranks(
      2,
      [&](int r, NcclAllReduce& g) {
        if (r == 1) return;  // joined, but never calls
        DeviceBuffer d(4096);
        ASSERT_EQ(cudaMemset(d.p, 0, 4096 * sizeof(float)), cudaSuccess);
        const auto t0 = Clock::now();
        try {
          g.sum(d.p, 4096);
        } catch (...) {
          seconds = std::chrono::duration<double>(Clock::now() - t0).count();
          throw;
        }
      },
      1000ms);
  ASSERT_TRUE(errors[0]) << "rank 0 did not notice";
  const std::string msg = message_of(errors[0]);
  EXPECT_NE(msg.find("rank 0 of 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("aborted"), std::string::npos) << msg;
  EXPECT_LT(seconds, 3.0) << msg;
}

// Not a check: the latency a layer's all-reduce costs on these GPUs.
TEST(CudaNcclAllReduce, ReportsLatency) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  const int n_ranks = std::min(device_count(), 8);
  for (size_t kib : {16, 64, 256}) {
    const size_t n = kib * 1024 / sizeof(float);
    std::vector<double> us(500);
    auto errors = on_ranks(n_ranks, [&](int r, NcclAllReduce& g) {
      DeviceBuffer d(n);
      ASSERT_EQ(cudaMemset(d.p, 0, n * sizeof(float)), cudaSuccess);
      for (int i = 0; i < 50; ++i) g.sum(d.p, n);
      for (size_t i = 0; i < us.size(); ++i) {
        const auto t0 = Clock::now();
        g.sum(d.p, n);
        if (r == 0) us[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      }
    });
    for (int r = 0; r < n_ranks; ++r) ASSERT_FALSE(errors[size_t(r)]) << message_of(errors[size_t(r)]);
    std::sort(us.begin(), us.end());
    std::printf("NCCL all-reduce, %d ranks, %zu KiB: p50 %.1f us, p99 %.1f us (host-synchronous calls)\n", n_ranks,
                kib, us[us.size() / 2], us[us.size() * 99 / 100]);
  }
}

}  // namespace
}  // namespace baton::net
