// Tensor-parallel stages through worker processes (docs/TENSOR_PARALLEL.md,
// "Groups across workers"): `serve --tp N` and `run --tp N` make the rank
// files, the ranks form their all-reduce mesh over loopback TCP, rank 0
// passes each step to the others. Greedy text equals one process; a killed
// rank fails its group's stream within 2 s naming the rank, and the group
// heals with the restarted worker.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;
using namespace std::chrono_literals;

const std::vector<std::string> kPrompts = {
    "Once upon a time",      "The little dog",        "Lily and Ben went to the park",
    "One day, a big bird",   "Tom had a red ball",    "The sun was hot and",
    "Mom said, \"Let's go", "There was a tiny cat who",
};

std::vector<std::string> greedy_texts(int port, int max_tokens) {
  std::vector<std::string> out;
  for (const std::string& p : kPrompts) {
    const json req = {{"model", kModel}, {"prompt", p}, {"max_tokens", max_tokens}, {"temperature", 0}};
    Response r = post(port, "/v1/completions", req);
    EXPECT_EQ(r.status, 200) << r.body;
    out.push_back(r.status == 200 ? r.j()["choices"][0]["text"].get<std::string>() : "");
  }
  return out;
}

TEST(ServeTp, GreedyTextOfTwoStagesOfTwoRanksEqualsOneProcess) {
  std::vector<std::string> want;
  {
    ServeProcess one({"-m", stories(), "--ctx", "256"});
    want = greedy_texts(one.port(), 64);
  }
  ServeProcess tp({"-m", stories(), "--ctx", "256", "--workers", "2", "--tp", "2"});
  const int port = tp.port();
  EXPECT_EQ(greedy_texts(port, 64), want) << tp.stderr_text();

  // /health: one entry per rank, stage by stage, rank by rank.
  const json h = health(port);
  ASSERT_EQ(h["stages"].size(), 4u) << h.dump();
  for (size_t i = 0; i < 4; ++i) {
    const json& s = h["stages"][i];
    EXPECT_EQ(s["stage"], int(i / 2)) << s.dump();
    EXPECT_EQ(s["tp"]["rank"], int(i % 2)) << s.dump();
    EXPECT_EQ(s["tp"]["size"], 2) << s.dump();
    EXPECT_EQ(s["state"], "loaded") << s.dump();
  }
  // Rank 0 of stage 0 holds the link to the next stage; TCP into a group.
  EXPECT_EQ(h["stages"][0]["link"]["kind"], "tcp") << h.dump();
  EXPECT_TRUE(h["stages"][1]["link"].is_null()) << h.dump();
  // /metrics labels each rank's memory.
  Response m = http(port, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("tp_rank=\"1\",tp_size=\"2\",kind=\"planned\""), std::string::npos) << m.body;
  EXPECT_EQ(tp.stop(), 0) << tp.stderr_text();
}

TEST(ServeTp, KilledRankFailsItsStreamNamingItThenTheGroupHeals) {
  // Slow steps keep the stream going long enough to kill a rank inside it.
  ServeProcess server({"-m", stories(), "--tp", "2", "--worker-delay-ms", "20", "--ctx", "1024"});
  const int port = server.port();
  const json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  Response before = post(port, "/v1/completions", req);
  ASSERT_EQ(before.status, 200) << before.body;
  const std::string want = before.j()["choices"][0]["text"];

  // worker-1 holds rank 1 of the one stage (rank files go to the workers in order).
  const pid_t victim = worker_pid(server, 1);
  ASSERT_GT(victim, 0) << server.stderr_text();
  int fd = start_long_stream(port, 900);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string rest = read_all(fd);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  std::printf("the stream failed %.2f s after rank 1 was killed\n", seconds);
  EXPECT_LT(seconds, 2.0) << rest;
  EXPECT_NE(rest.find("generation failed"), std::string::npos) << rest;
  EXPECT_NE(rest.find("rank 1"), std::string::npos) << rest;

  // The worker is started again, rank 0 forms the group with it, and the
  // same request gives the same text.
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_status(port, "ok", 60s)) << health(port).dump() << server.stderr_text();
  std::printf("the group healed %.2f s after the stream failed\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
  EXPECT_NE(worker_pid(server, 1), victim);
  EXPECT_NE(server.stderr_text().find("re-forms its tensor-parallel group"), std::string::npos)
      << server.stderr_text();
  Response after = post(port, "/v1/completions", req);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.j()["choices"][0]["text"], want);

  // Rank 0, the group's face, goes the same way: the coordinator's link to
  // it closes, its replacement takes rank 0 and dials rank 1 again.
  const pid_t face = worker_pid(server, 0);
  ASSERT_GT(face, 0);
  fd = start_long_stream(port, 900);
  ASSERT_EQ(kill(face, SIGKILL), 0);
  const auto t2 = std::chrono::steady_clock::now();
  const std::string rest0 = read_all(fd);
  ::close(fd);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count(), 2.0) << rest0;
  EXPECT_NE(rest0.find("generation failed"), std::string::npos) << rest0;
  ASSERT_TRUE(wait_status(port, "ok", 60s)) << health(port).dump() << server.stderr_text();
  Response again = post(port, "/v1/completions", req);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.j()["choices"][0]["text"], want);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(RunTp, GreedyTokensEqualOneProcessAndTpWithPartsIsRefused) {
  const json one = run_json("Once upon a time", 48);
  test::CommandResult tp = test::run_command({test::baton_binary(), "run", "-m", stories(), "-p", "Once upon a time", "-n", "48", "--temp",
                                            "0", "--json", "--tp", "2"});
  ASSERT_EQ(tp.exit_code, 0) << tp.err;
  const json j = json::parse(tp.out);
  EXPECT_EQ(j["tokens"], one["tokens"]);
  EXPECT_EQ(j["workers"], 2);
  ASSERT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["stages"][1]["tp"]["rank"], 1);

  // --tp makes rank files; --parts takes them: not both.
  test::CommandResult both = test::run_command({test::baton_binary(), "run", "-m", stories(), "--tp", "2", "--parts", "a.gguf,b.gguf"});
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("--parts"), std::string::npos) << both.err;
}

}  // namespace
}  // namespace baton
