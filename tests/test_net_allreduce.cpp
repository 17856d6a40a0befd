// The tensor-parallel all-reduce mesh over loopback (net/allreduce.h): N
// ranks as threads of this process, each with its own TcpAllReduce. Results
// must be bitwise equal to the rank-order sum on every rank (and to the
// in-process group of engine/runtime/tp_comm.h, which the engine's tests
// use), and every failure must end the call on every rank within about 2 s
// with an error that names the rank at fault.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/runtime/tp_comm.h"
#include "net/allreduce.h"

namespace baton::net {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Secret secret_of(const std::string& s) { return Secret({s.begin(), s.end()}); }
const std::string kSecret = "tp-secret-0123456789abcdef0123456789";

// Values over six decades, both signs: the sum's bits depend on the order
// of the additions, so an order other than rank order would show.
std::vector<float> random_data(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> mant(0.f, 1.f);
  std::uniform_int_distribution<int> exp10(-3, 3);
  std::vector<float> v(n);
  for (float& x : v) x = mant(rng) * std::pow(10.f, float(exp10(rng)));
  return v;
}

uint64_t seed_of(int rank, int call) { return 0x9e3779b97f4a7c15ull * uint64_t(call + 1) + uint64_t(rank) * 7919; }

std::vector<float> rank_order_sum(int n_ranks, int call, size_t n) {
  std::vector<float> acc = random_data(seed_of(0, call), n);
  for (int r = 1; r < n_ranks; ++r) {
    const std::vector<float> x = random_data(seed_of(r, call), n);
    for (size_t i = 0; i < n; ++i) acc[i] += x[i];
  }
  return acc;
}

// Runs fn(rank) on one thread per rank; returns each rank's exception.
std::vector<std::exception_ptr> on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
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

struct Mesh {
  std::vector<std::unique_ptr<TcpAllReduce>> ranks;
  std::vector<std::exception_ptr> setup_errors;
};

// Every rank binds an ephemeral port first, then all connect at once.
Mesh make_mesh(int n, const std::function<void(AllReduceConfig&)>& tweak = {}) {
  Mesh m;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    AllReduceConfig c;
    c.rank = r;
    c.size = n;
    c.secret = secret_of(kSecret);
    if (tweak) tweak(c);
    m.ranks.push_back(std::make_unique<TcpAllReduce>(std::move(c)));
    addresses.push_back("127.0.0.1:" + std::to_string(m.ranks.back()->port()));
  }
  m.setup_errors = on_ranks(n, [&](int r) { m.ranks[size_t(r)]->connect(addresses); });
  return m;
}

void expect_connected(const Mesh& m) {
  for (size_t r = 0; r < m.setup_errors.size(); ++r) {
    ASSERT_FALSE(m.setup_errors[r]) << "rank " << r << ": " << message_of(m.setup_errors[r]);
  }
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

const size_t kSizes[] = {1, 3, 1000, 1024, 1025, 4096, 16384, 65536};

TEST(NetAllReduce, SumIsTheRankOrderSumBitwiseOnEveryRank) {
  for (int n_ranks : {2, 3, 4}) {
    Mesh m = make_mesh(n_ranks);
    expect_connected(m);
    InProcessTpGroup local(n_ranks);
    auto errors = on_ranks(n_ranks, [&](int r) {
      for (size_t k = 0; k < std::size(kSizes); ++k) {
        const size_t n = kSizes[k];
        const int call = int(k);
        std::vector<float> tcp = random_data(seed_of(r, call), n);
        std::vector<float> in_process = tcp;
        m.ranks[size_t(r)]->sum(tcp.data(), n);
        local.member(r).sum(in_process.data(), n);
        const std::string what = std::to_string(n_ranks) + " ranks, rank " + std::to_string(r) + ", " +
                                 std::to_string(n) + " floats";
        expect_bitwise(tcp, rank_order_sum(n_ranks, call, n), what + " (TCP)");
        expect_bitwise(in_process, tcp, what + " (in-process against TCP)");
      }
    });
    for (int r = 0; r < n_ranks; ++r) EXPECT_FALSE(errors[size_t(r)]) << message_of(errors[size_t(r)]);
  }
}

TEST(NetAllReduce, ThousandCallsInARow) {
  const int n_ranks = 3;
  const size_t n = 4096;  // 16 KiB, the small end of a layer's all-reduce
  Mesh m = make_mesh(n_ranks);
  expect_connected(m);
  // The reference of every call, computed once.
  std::vector<std::vector<float>> want;
  for (int call = 0; call < 1000; ++call) want.push_back(rank_order_sum(n_ranks, call, n));
  auto errors = on_ranks(n_ranks, [&](int r) {
    std::vector<float> buf(n);
    for (int call = 0; call < 1000; ++call) {
      buf = random_data(seed_of(r, call), n);
      m.ranks[size_t(r)]->sum(buf.data(), n);
      if (std::memcmp(buf.data(), want[size_t(call)].data(), n * sizeof(float)) != 0) {
        ADD_FAILURE() << "rank " << r << ", call " << call << ": not the rank-order sum";
        return;
      }
    }
  });
  for (int r = 0; r < n_ranks; ++r) EXPECT_FALSE(errors[size_t(r)]) << message_of(errors[size_t(r)]);
}

TEST(NetAllReduce, GatherIsRankMajorOnEveryRank) {
  for (int n_ranks : {2, 4}) {
    Mesh m = make_mesh(n_ranks);
    expect_connected(m);
    InProcessTpGroup local(n_ranks);
    auto errors = on_ranks(n_ranks, [&](int r) {
      for (size_t n : {size_t(1), size_t(777), size_t(65536)}) {
        const std::vector<float> mine = random_data(seed_of(r, int(n)), n);
        std::vector<float> all(n * size_t(n_ranks), -1.f), local_all(all.size());
        m.ranks[size_t(r)]->gather(mine.data(), n, all.data());
        local.member(r).gather(mine.data(), n, local_all.data());
        for (int q = 0; q < n_ranks; ++q) {
          const std::vector<float> theirs = random_data(seed_of(q, int(n)), n);
          EXPECT_EQ(std::memcmp(all.data() + size_t(q) * n, theirs.data(), n * sizeof(float)), 0)
              << "rank " << r << " holds a wrong slice of rank " << q << " (" << n << " floats)";
        }
        expect_bitwise(local_all, all, "in-process gather against TCP");
        // This rank's own slot may be the source.
        std::vector<float> in_place(all.size());
        std::memcpy(in_place.data() + size_t(r) * n, mine.data(), n * sizeof(float));
        m.ranks[size_t(r)]->gather(in_place.data() + size_t(r) * n, n, in_place.data());
        expect_bitwise(in_place, all, "gather from the own slot");
      }
    });
    for (int r = 0; r < n_ranks; ++r) EXPECT_FALSE(errors[size_t(r)]) << message_of(errors[size_t(r)]);
  }
}

// Rank 2 ends after 20 calls, by close() (it tells the others why) or by
// going away (its sockets simply close, as when its process dies); the
// others' next call fails at once, naming it.
void expect_the_closed_rank_named(bool destroy) {
  const int n_ranks = 3;
  Mesh m = make_mesh(n_ranks);
  expect_connected(m);
  std::vector<double> seconds(n_ranks, 0.0);
  std::vector<int> failed_at(n_ranks, -1);
  auto errors = on_ranks(n_ranks, [&](int r) {
    std::vector<float> buf(256);
    for (int call = 0; call < 50; ++call) {
      if (r == 2 && call == 20) {
        if (destroy) {
          m.ranks[2].reset();
        } else {
          m.ranks[2]->close();
        }
        return;
      }
      buf = random_data(seed_of(r, call), buf.size());
      const auto t0 = Clock::now();
      try {
        m.ranks[size_t(r)]->sum(buf.data(), buf.size());
      } catch (...) {
        seconds[size_t(r)] = std::chrono::duration<double>(Clock::now() - t0).count();
        failed_at[size_t(r)] = call;
        throw;
      }
    }
  });
  EXPECT_FALSE(errors[2]);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[size_t(r)]) << "rank " << r << " did not notice";
    const std::string msg = message_of(errors[size_t(r)]);
    EXPECT_NE(msg.find("rank 2 (127.0.0.1:"), std::string::npos) << msg;
    EXPECT_NE(msg.find(destroy ? "closed the connection" : "gave up: closed by its owner"), std::string::npos) << msg;
    EXPECT_EQ(failed_at[size_t(r)], 20) << msg;
    EXPECT_LT(seconds[size_t(r)], 2.0) << msg;
    // The group stays broken.
    std::vector<float> buf(256);
    EXPECT_THROW(m.ranks[size_t(r)]->sum(buf.data(), buf.size()), AllReduceError);
  }
}

TEST(NetAllReduce, ARankThatClosesIsNamedAtOnce) { expect_the_closed_rank_named(false); }
TEST(NetAllReduce, ARankThatGoesAwayIsNamedAtOnce) { expect_the_closed_rank_named(true); }

// Rank 1 stops calling (stopped, stuck): the others fail after the timeout.
TEST(NetAllReduce, ASilentRankIsNamedAfterTheTimeout) {
  const int n_ranks = 3;
  Mesh m = make_mesh(n_ranks, [](AllReduceConfig& c) { c.timeout = 1000ms; });
  expect_connected(m);
  std::vector<double> seconds(n_ranks, 0.0);
  auto errors = on_ranks(n_ranks, [&](int r) {
    if (r == 1) return;  // never calls
    std::vector<float> buf = random_data(seed_of(r, 0), 1024);
    const auto t0 = Clock::now();
    try {
      m.ranks[size_t(r)]->sum(buf.data(), buf.size());
    } catch (...) {
      seconds[size_t(r)] = std::chrono::duration<double>(Clock::now() - t0).count();
      throw;
    }
  });
  for (int r : {0, 2}) {
    ASSERT_TRUE(errors[size_t(r)]) << "rank " << r << " did not notice";
    const std::string msg = message_of(errors[size_t(r)]);
    EXPECT_NE(msg.find("rank 1 ("), std::string::npos) << msg;
    EXPECT_NE(msg.find("silent"), std::string::npos) << msg;
    EXPECT_GE(seconds[size_t(r)], 0.9) << msg;
    EXPECT_LT(seconds[size_t(r)], 2.0) << msg;
  }
}

TEST(NetAllReduce, MismatchedSizesFailEveryRank) {
  const int n_ranks = 3;
  Mesh m = make_mesh(n_ranks);
  expect_connected(m);
  auto errors = on_ranks(n_ranks, [&](int r) {
    std::vector<float> buf(8, 1.f);
    m.ranks[size_t(r)]->sum(buf.data(), r == 1 ? 5 : 4);
  });
  for (int r = 0; r < n_ranks; ++r) {
    ASSERT_TRUE(errors[size_t(r)]) << "rank " << r << " did not fail";
    const std::string msg = message_of(errors[size_t(r)]);
    EXPECT_NE(msg.find("same sizes"), std::string::npos) << "rank " << r << ": " << msg;
  }
  EXPECT_NE(message_of(errors[0]).find("rank 1 (") , std::string::npos) << message_of(errors[0]);
  EXPECT_NE(message_of(errors[1]).find("sum of 4 floats where this rank called sum of 5"), std::string::npos)
      << message_of(errors[1]);
}

TEST(NetAllReduce, SumAgainstGatherFailsEveryRank) {
  Mesh m = make_mesh(2);
  expect_connected(m);
  auto errors = on_ranks(2, [&](int r) {
    std::vector<float> buf(64, 1.f), all(128);
    if (r == 0) m.ranks[0]->sum(buf.data(), 64);
    else m.ranks[1]->gather(buf.data(), 64, all.data());
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[size_t(r)]);
    EXPECT_NE(message_of(errors[size_t(r)]).find("called"), std::string::npos) << message_of(errors[size_t(r)]);
  }
}

// Rank 1 has another secret: its handshake is refused at once; rank 0 names
// the refusal when its set-up deadline passes.
TEST(NetAllReduce, AWrongSecretIsRefusedAtSetUp) {
  const auto t0 = Clock::now();
  Mesh m = make_mesh(2, [](AllReduceConfig& c) {
    c.setup_timeout = 1500ms;
    if (c.rank == 1) c.secret = secret_of("another-secret-of-some-length-0123456");
  });
  ASSERT_TRUE(m.setup_errors[0]);
  ASSERT_TRUE(m.setup_errors[1]);
  const std::string dialler = message_of(m.setup_errors[1]), listener = message_of(m.setup_errors[0]);
  EXPECT_NE(dialler.find("rank 0 (127.0.0.1:"), std::string::npos) << dialler;
  EXPECT_NE(dialler.find("refused"), std::string::npos) << dialler;
  EXPECT_NE(listener.find("rank(s) 1 did not connect"), std::string::npos) << listener;
  EXPECT_NE(listener.find("authentication"), std::string::npos) << listener;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  std::vector<float> buf(4);
  EXPECT_THROW(m.ranks[0]->sum(buf.data(), 4), std::logic_error);
}

TEST(NetAllReduce, OneRankIsItsOwnSum) {
  AllReduceConfig c;
  c.secret = secret_of(kSecret);
  TcpAllReduce solo(std::move(c));
  solo.connect({"127.0.0.1:1"});
  std::vector<float> buf = random_data(1, 100), want = buf, all(100);
  solo.sum(buf.data(), buf.size());
  expect_bitwise(buf, want, "one rank");
  solo.gather(want.data(), 100, all.data());
  expect_bitwise(all, want, "one rank's gather");
}

// The in-process group refuses the same mistakes, on every rank, and a rank
// that never comes makes the others fail after the timeout.
TEST(NetAllReduce, InProcessGroupFailsLikeTheMesh) {
  {
    InProcessTpGroup g(3);
    auto errors = on_ranks(3, [&](int r) {
      std::vector<float> buf(8, 1.f);
      g.member(r).sum(buf.data(), r == 1 ? 5 : 4);
    });
    // Whoever came first set the size; the odd one fails at once, and the
    // others (waiting, or arriving after) fail with its reason.
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(errors[size_t(r)]) << "rank " << r << " did not fail";
      EXPECT_NE(message_of(errors[size_t(r)]).find("floats"), std::string::npos) << message_of(errors[size_t(r)]);
    }
  }
  {
    InProcessTpGroup g(2, /*timeout_ms=*/300);
    std::vector<float> buf(4, 1.f);
    const auto t0 = Clock::now();
    EXPECT_THROW(g.member(0).sum(buf.data(), 4), std::runtime_error);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
  }
}

}  // namespace
}  // namespace baton::net
