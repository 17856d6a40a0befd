// Latency of the tensor-parallel all-reduce (net/allreduce.h): N ranks as
// threads of this process over loopback TCP, each call timed on rank 0.
// Prints p50 / p99 microseconds per sum() and the buffer's bytes over the p50
// time (what a layer sees: its partial result in, the total out).
//
//   allreduce_bench [--ranks 2,4] [--calls 2000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "net/allreduce.h"

using namespace baton::net;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

void run(int n_ranks, int calls) {
  const std::string secret_text = "allreduce-bench-secret-0123456789abcdef";
  std::vector<std::unique_ptr<TcpAllReduce>> ranks;
  std::vector<std::string> addresses;
  for (int r = 0; r < n_ranks; ++r) {
    AllReduceConfig c;
    c.rank = r;
    c.size = n_ranks;
    c.secret = Secret({secret_text.begin(), secret_text.end()});
    ranks.push_back(std::make_unique<TcpAllReduce>(std::move(c)));
    addresses.push_back("127.0.0.1:" + std::to_string(ranks.back()->port()));
  }
  {
    std::vector<std::thread> t;
    for (int r = 0; r < n_ranks; ++r) t.emplace_back([&, r] { ranks[size_t(r)]->connect(addresses); });
    for (auto& x : t) x.join();
  }
  for (size_t kib : {4, 16, 32, 64, 256}) {
    const size_t n = kib * 1024 / sizeof(float);
    std::vector<double> us(static_cast<size_t>(calls));
    std::vector<std::thread> t;
    for (int r = 0; r < n_ranks; ++r) {
      t.emplace_back([&, r] {
        std::vector<float> buf(n, 1.0f + float(r));
        const int warm = std::max(50, calls / 10);
        for (int i = 0; i < warm; ++i) ranks[size_t(r)]->sum(buf.data(), n);
        for (int i = 0; i < calls; ++i) {
          const auto t0 = Clock::now();
          ranks[size_t(r)]->sum(buf.data(), n);
          if (r == 0) us[size_t(i)] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        }
      });
    }
    for (auto& x : t) x.join();
    std::sort(us.begin(), us.end());
    const double p50 = us[us.size() / 2], p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
    std::printf("ranks %d  %4zu KiB  p50 %8.1f us  p99 %8.1f us  %6.2f GB/s\n", n_ranks, kib, p50, p99,
                double(kib * 1024) / (p50 * 1e3));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rank_counts{2, 4};
  int calls = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ranks")) rank_counts = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--calls")) calls = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: allreduce_bench [--ranks 2,4] [--calls 2000]\n");
      return 2;
    }
  }
  for (int n : rank_counts) run(n, calls);
  return 0;
}
