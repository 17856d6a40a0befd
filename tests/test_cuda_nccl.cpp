// The NCCL transport of a stage link (net/nccl_link.h) on two GPUs of one
// machine: rows from host or device memory arrive bit-exact and in order,
// in pieces when a transfer is larger than the link's buffer; a peer that
// never answers makes the sender fail within its timeout, naming the link;
// abort() (the peer's TCP link closed) ends a waiting receive at once.
// Needs two CUDA devices and a build with NCCL; skips, and says so, with less.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "net/nccl_link.h"
#include "tests/test_util.h"

namespace baton::net {
namespace {

using namespace std::chrono_literals;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define REQUIRE_TWO_GPUS_WITH_NCCL()                                                                     \
  do {                                                                                                   \
    if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL (BATON_NCCL)";                            \
    if (const int n = device_count(); n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n;      \
  } while (0)

std::vector<float> random_rows(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-8.0f, 8.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Pair {
  std::unique_ptr<NcclLink> sender, receiver;
};

// Both ranks in this process, one device each; init runs concurrently
// (nonblocking communicators), so one thread suffices.
Pair open_pair(uint64_t max_floats, std::chrono::milliseconds op_timeout = 30s) {
  const std::vector<uint8_t> id = nccl_unique_id();
  NcclLinkConfig a;
  a.device = 0;
  a.name = "test link (sender)";
  a.max_floats = max_floats;
  a.op_timeout = op_timeout;
  NcclLinkConfig b = a;
  b.device = 1;
  b.name = "test link (receiver)";
  Pair p;
  p.sender = std::make_unique<NcclLink>(id, 0, a);
  p.receiver = std::make_unique<NcclLink>(id, 1, b);
  auto ready = std::async(std::launch::async, [&] { p.receiver->wait_ready(); });
  p.sender->wait_ready();
  ready.get();
  return p;
}

TEST(CudaNccl, ProbeNamesTheDeviceAndKeepsMulticastOff) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  unsetenv("NCCL_NVLS_ENABLE");
  const NcclProbe p = probe_nccl(0);
  ASSERT_TRUE(p.available) << p.why_not;
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  EXPECT_GE(p.version, 20000u);
  EXPECT_EQ(p.device_uuid.rfind("GPU-", 0), 0u) << p.device_uuid;
  EXPECT_EQ(p.device_uuid.size(), 40u) << p.device_uuid;
  EXPECT_NE(probe_nccl(1).device_uuid, p.device_uuid);
  EXPECT_FALSE(p.pci_bus_id.empty());
}

TEST(CudaNccl, HostRowsArriveExactlyAndInOrderInPieces) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Pair p = open_pair(/*max_floats=*/4096);
  // Decode-sized rows, a prefill chunk larger than the buffer (pieces), and
  // more transfers in a row than the sender has slots.
  const std::vector<uint64_t> sizes = {4096, 1, 4096 * 5 + 17, 4096, 333, 8192, 4095};
  std::vector<std::vector<float>> sent;
  for (size_t i = 0; i < sizes.size(); ++i) sent.push_back(random_rows(sizes[i], seed + i));
  auto rx = std::async(std::launch::async, [&] {
    std::vector<std::vector<float>> got;
    for (uint64_t n : sizes) {
      got.emplace_back(n, 0.0f);
      p.receiver->recv(got.back().data(), n);
    }
    return got;
  });
  for (const auto& rows : sent) p.sender->send(rows.data(), rows.size());
  const auto got = rx.get();
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(got[i], sent[i]) << "transfer " << i;
}

TEST(CudaNccl, DeviceRowsGoDeviceToDevice) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  const uint64_t seed = test::test_seed() + 7;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const uint64_t n = 4096 * 3;
  Pair p = open_pair(4096);
  const std::vector<float> rows = random_rows(n, seed);
  float *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, rows.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dst), n * sizeof(float)), cudaSuccess);
  auto rx = std::async(std::launch::async, [&] { p.receiver->recv(dst, n); });
  p.sender->send(src, n, nullptr);
  rx.get();
  std::vector<float> back(n);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), dst, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, rows);
  cudaFree(dst);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaFree(src);
}

TEST(CudaNccl, SilentPeerFailsTheSenderWithinItsTimeoutNamingTheLink) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  Pair p = open_pair(1024, /*op_timeout=*/800ms);
  const std::vector<float> rows = random_rows(1024, test::test_seed());
  // The receiver never posts: two sends fill both slots, the third waits for
  // a free one and gives up.
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    for (int i = 0; i < 3; ++i) p.sender->send(rows.data(), rows.size());
  } catch (const NcclLinkError& e) {
    what = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(what.find("test link (sender)"), std::string::npos) << what;
  EXPECT_NE(what.find("aborted"), std::string::npos) << what;
  EXPECT_LT(s, 5.0);
  EXPECT_TRUE(p.sender->broken());
  EXPECT_THROW(p.sender->send(rows.data(), rows.size()), NcclLinkError);
  p.receiver->abort("test over");
}

TEST(CudaNccl, AbortEndsAWaitingReceiveAtOnce) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  Pair p = open_pair(1024, /*op_timeout=*/30s);
  std::vector<float> rows(1024);
  auto rx = std::async(std::launch::async, [&]() -> std::string {
    try {
      p.receiver->recv(rows.data(), rows.size());
    } catch (const NcclLinkError& e) {
      return e.what();
    }
    return "";
  });
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  p.receiver->abort("the previous stage's link closed");
  ASSERT_EQ(rx.wait_for(5s), std::future_status::ready) << "recv did not notice abort()";
  const std::string what = rx.get();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_NE(what.find("the previous stage's link closed"), std::string::npos) << what;
  p.sender->abort("test over");
}

// Not a timing assertion: prints what one transfer costs (host rows in and
// out, as the worker sends them today) for bench/nccl_bench.sh.
TEST(CudaNccl, ReportsLatencyAndBandwidth) {
  REQUIRE_TWO_GPUS_WITH_NCCL();
  const uint64_t width = 4096;  // llama-8b's boundary row
  Pair p = open_pair(64 * width);
  for (uint64_t rows : {uint64_t(1), uint64_t(64)}) {
    const uint64_t n = rows * width;
    const int reps = rows == 1 ? 500 : 100;
    const std::vector<float> src = random_rows(n, test::test_seed());
    std::vector<float> dst(n);
    auto rx = std::async(std::launch::async, [&] {
      for (int i = 0; i < reps + 10; ++i) p.receiver->recv(dst.data(), n);
    });
    for (int i = 0; i < 10; ++i) p.sender->send(src.data(), n);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) p.sender->send(src.data(), n);
    rx.get();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("nccl link: %llu rows x %llu floats (%.0f KiB): %.1f us per transfer, %.2f GB/s\n",
                (unsigned long long)rows, (unsigned long long)width, double(n * 4) / 1024, s / reps * 1e6,
                double(n * 4) * reps / s / 1e9);
    EXPECT_EQ(dst, src);
  }
}

}  // namespace
}  // namespace baton::net
