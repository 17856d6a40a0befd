// The distributed runtime end to end: `baton run --workers K` starts K real
// worker processes on loopback and must give exactly the tokens of the
// single-process run (greedy and seeded sampling); killing a worker in the
// middle of a generation fails the run within 2 s with an error that names
// the worker and its stage, and nothing is left running.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "coordinator/cluster/cluster_config.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> run_tokens(std::vector<std::string> extra, std::string* err = nullptr) {
  std::vector<std::string> argv = {test::baton_binary(), "run", "-m", test::model_path("stories260K.gguf"),
                                   "-p", "Once upon a time", "--json", "-t", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  test::CommandResult r = test::run_command(argv);
  if (err) *err = r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return {};
  auto j = nlohmann::json::parse(r.out);
  return j.at("tokens").get<std::vector<int32_t>>();
}

TEST(ClusterRun, GreedyTokensMatchSingleProcessForOneToFiveWorkers) {
  const std::vector<int32_t> reference = run_tokens({"-n", "100", "--temp", "0"});
  ASSERT_EQ(reference.size(), 100u);
  for (int k = 1; k <= 5; ++k) {
    SCOPED_TRACE("workers " + std::to_string(k));
    EXPECT_EQ(run_tokens({"-n", "100", "--temp", "0", "--workers", std::to_string(k)}), reference);
  }
}

TEST(ClusterRun, SeededSamplingMatchesSingleProcess) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::string> args = {"-n", "80", "--temp", "0.9", "--seed", std::to_string(seed), "--top-k", "0",
                                         "--top-p", "0.97", "--min-p", "0.01", "--batch", "3"};
  const std::vector<int32_t> reference = run_tokens(args);
  ASSERT_FALSE(reference.empty());
  // A different seed gives different text: the comparison below means something.
  std::vector<std::string> other = args;
  other[5] = std::to_string(seed + 1);
  EXPECT_NE(run_tokens(other), reference);
  for (int k : {2, 3}) {
    SCOPED_TRACE("workers " + std::to_string(k));
    std::vector<std::string> dist = args;
    dist.insert(dist.end(), {"--workers", std::to_string(k)});
    EXPECT_EQ(run_tokens(dist), reference);
  }
}

TEST(ClusterRun, JsonReportsTheStagesWithEmbeddingAndHeadApart) {
  test::CommandResult r = test::run_command({test::baton_binary(), "run", "-m", test::model_path("stories260K.gguf"),
                                             "-n", "4", "--temp", "0", "--json", "--workers", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto& stages = j.at("stages");
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_TRUE(stages[0].at("embedding").get<bool>());
  EXPECT_FALSE(stages[0].at("head").get<bool>());
  EXPECT_FALSE(stages[1].at("embedding").get<bool>());
  EXPECT_TRUE(stages[1].at("head").get<bool>());
  EXPECT_EQ(stages[0].at("first_layer").get<int>(), 0);
  EXPECT_EQ(stages[1].at("first_layer").get<int>(), stages[0].at("last_layer").get<int>() + 1);
  EXPECT_GT(stages[0].at("weights_bytes").get<uint64_t>(), 0u);
  EXPECT_GT(stages[1].at("kv_bytes").get<uint64_t>(), 0u);
}

TEST(ClusterRun, MoreWorkersThanLayersIsRefused) {
  test::CommandResult r = test::run_command({test::baton_binary(), "run", "-m", test::model_path("stories260K.gguf"),
                                             "-n", "4", "--workers", "6"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("6 stages"), std::string::npos) << r.err;
}

TEST(ClusterRun, WorkerWithoutSecretFileFailsClearly) {
  test::TempDir dir;
  test::CommandResult r = test::run_command({test::baton_binary(), "worker", "--coordinator", "127.0.0.1:9",
                                             "--secret-file", dir.file("missing.secret")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("baton worker:"), std::string::npos) << r.err;
}

// A child process whose stdout and stderr are read as they come.
struct Child {
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string out_text, err_text;

  explicit Child(const std::vector<std::string>& argv) {
    int o[2], e[2];
    if (pipe(o) != 0 || pipe(e) != 0) throw std::runtime_error("pipe");
    pid = fork();
    if (pid == 0) {
      dup2(o[1], 1);
      dup2(e[1], 2);
      close(o[0]);
      close(e[0]);
      close(o[1]);
      close(e[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(o[1]);
    close(e[1]);
    out = o[0];
    err = e[0];
  }
  ~Child() {
    if (out >= 0) close(out);
    if (err >= 0) close(err);
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // Reads what is there for up to `ms`; false when both pipes are closed.
  bool pump(int ms) {
    pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
    if (out < 0 && err < 0) return false;
    if (poll(fds, 2, ms) <= 0) return true;
    char buf[4096];
    int* fd[2] = {&out, &err};
    std::string* sink[2] = {&out_text, &err_text};
    for (int i = 0; i < 2; ++i) {
      if (*fd[i] < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(*fd[i], buf, sizeof buf);
      if (n > 0) {
        sink[i]->append(buf, size_t(n));
      } else {
        close(*fd[i]);
        *fd[i] = -1;
      }
    }
    return true;
  }
  // Waits for the exit (bounded); returns the exit status, -1 for a signal, -2 on timeout.
  int wait(int ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < deadline) {
      pump(10);
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        while (pump(10)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    return -2;
  }
};

TEST(ClusterRun, KilledWorkerFailsTheRunWithinTwoSeconds) {
  // Slow workers make the generation last long enough to kill one inside it;
  // -v for the info lines that give the workers' pids.
  Child run({test::baton_binary(), "run", "-m", test::model_path("stories260K.gguf"), "-p", "Once upon a time", "-n",
             "400", "--temp", "0", "-t", "1", "--workers", "3", "--worker-delay-ms", "20", "-v"});
  const std::regex started("started worker-1 \\(pid ([0-9]+)\\)");
  std::smatch m;
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  // Wait until worker-1 is known and generation has produced some text.
  while (Clock::now() < give_up &&
         !(std::regex_search(run.err_text, m, started) && run.out_text.size() > std::string("Once upon a time").size() + 8)) {
    ASSERT_TRUE(run.pump(50)) << "baton run ended early: " << run.err_text;
  }
  ASSERT_TRUE(std::regex_search(run.err_text, m, started)) << run.err_text;
  const pid_t victim = pid_t(std::stol(m[1].str()));
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const int status = run.wait(10000);
  const double took = std::chrono::duration<double>(Clock::now() - killed_at).count();
  ASSERT_NE(status, -2) << "baton run did not exit after a worker was killed";
  EXPECT_EQ(status, 1) << run.err_text;
  // Failed, reported and every other worker stopped within 2 s.
  EXPECT_LT(took, 2.0);
  const std::string tail = run.err_text;
  EXPECT_NE(tail.find("baton run: worker worker-1 (stage 1"), std::string::npos) << tail;
  EXPECT_NE(tail.find("disconnected"), std::string::npos) << tail;
  // No worker outlives the run (all were children of it and are reaped).
  std::regex any_started("started (worker-[0-9]) \\(pid ([0-9]+)\\)");
  for (std::sregex_iterator it(tail.begin(), tail.end(), any_started), end; it != end; ++it) {
    EXPECT_NE(kill(pid_t(std::stol((*it)[2].str())), 0), 0) << (*it)[1].str() << " still runs";
  }
}

// Workers that hold split parts (baton split) load only their part, and the
// stages follow the parts, whatever the placement would have chosen.
TEST(ClusterRun, SplitPartsGiveTheSameTokens) {
  test::TempDir dir;
  auto split = test::run_command({test::baton_binary(), "split", test::model_path("stories260K.gguf"), "--layers",
                                  "0:0,1:3,4:output", "-o", dir.path().string()});
  ASSERT_EQ(split.exit_code, 0) << split.err;
  std::vector<std::string> parts;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) parts.push_back(e.path().string());
  std::sort(parts.begin(), parts.end());
  ASSERT_EQ(parts.size(), 3u);
  const std::vector<int32_t> reference = run_tokens({"-n", "40", "--temp", "0"});
  // Given out of order on purpose: the stages follow the parts' layers.
  std::string err;
  EXPECT_EQ(run_tokens({"-n", "40", "--temp", "0", "--parts", parts[2] + "," + parts[0] + "," + parts[1]}, &err),
            reference)
      << err;
  // A set that does not cover the model is refused with a clear line.
  auto r = test::run_command({test::baton_binary(), "run", "-m", test::model_path("stories260K.gguf"), "-p", "Hi",
                              "-n", "2", "--parts", parts[0] + "," + parts[1]});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("do not form one complete split"), std::string::npos) << r.err;
}

TEST(ClusterRun, LocalLoopbackConfigRunsTheCluster) {
  const std::vector<int32_t> reference = run_tokens({"-n", "30", "--temp", "0"});
  auto r = test::run_command({test::baton_binary(), "run", "--config", test::source_path("configs/local-loopback.toml"),
                              "-p", "Once upon a time", "--json", "-t", "1", "-n", "30", "--temp", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), reference);
  EXPECT_EQ(j.at("workers"), 2);
}

// --mem-limit caps the stage's plan in process and each worker's with
// --workers; a local config gives each worker its [[node]] memory.
TEST(ClusterRun, MemLimitCapsTheStageAndEachWorker) {
  const std::vector<int32_t> reference = run_tokens({"-n", "12", "--temp", "0"});
  EXPECT_EQ(run_tokens({"-n", "12", "--temp", "0", "--workers", "2", "--mem-limit", "1GiB"}), reference);
  auto refused = [](std::vector<std::string> extra) {
    std::vector<std::string> argv = {test::baton_binary(), "run", "-m", test::model_path("stories260K.gguf"),
                                     "-p", "Once", "-n", "2", "-t", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const test::CommandResult r = test::run_command(argv);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("--mem-limit allows 4.00 KiB"), std::string::npos) << r.err;
  };
  refused({"--mem-limit", "4KiB"});
  refused({"--workers", "2", "--mem-limit", "4KiB"});
  test::TempDir dir;
  const std::string cfg = dir.file("c.toml");
  const std::string text = "[model]\npath = \"" + test::model_path("stories260K.gguf") +
                           "\"\n[cluster]\nworkers = 2\nlocal = true\n"
                           "[[node]]\nname = \"a\"\nmemory = \"1GiB\"\n[[node]]\nname = \"b\"\nmemory = \"4KiB\"\n";
  test::write_file(cfg, std::vector<uint8_t>(text.begin(), text.end()));
  refused({"--config", cfg});
}

// --staging-mb reaches every worker run --workers starts: each reports the
// ring it loaded with (an info line: -v).
TEST(ClusterRun, StagingMbReachesEveryWorker) {
  auto reports = [](std::vector<std::string> extra, const std::string& ring) {
    std::vector<std::string> argv = {test::baton_binary(), "run", "-m", test::model_path("stories260K.gguf"),
                                     "-p", "Once", "-n", "2", "-t", "1", "--workers", "2", "-v"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const test::CommandResult r = test::run_command(argv);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    int n = 0;
    for (size_t p = r.err.find(ring); p != std::string::npos; p = r.err.find(ring, p + 1)) ++n;
    EXPECT_EQ(n, 2) << ring << "\n" << r.err;
    EXPECT_NE(r.err.find("baton worker worker-1: stage 1, layers "), std::string::npos) << r.err;
  };
  reports({"--staging-mb", "8"}, "loaded in");
  reports({"--staging-mb", "8"}, "(staging 4 x 8 MiB)");
  reports({}, "(staging 4 x 64 MiB)");
}

TEST(ClusterRun, ConfigNodesNameTheWorkersBackendOnlyWhenAllAgree) {
  test::TempDir dir;
  auto load = [&](const std::string& nodes) {
    const std::string p = dir.file("n.toml");
    const std::string text = "[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 2\n" + nodes;
    test::write_file(p, std::vector<uint8_t>(text.begin(), text.end()));
    return load_cluster_config(p);
  };
  EXPECT_EQ(load("[[node]]\nbackend = \"cpu\"\n[[node]]\nbackend = \"cpu\"\n").node_backend, Backend::Cpu);
  EXPECT_EQ(load("[[node]]\nbackend = \"cuda\"\n[[node]]\nbackend = \"cuda\"\n").node_backend, Backend::Cuda);
  EXPECT_FALSE(load("[[node]]\nbackend = \"cuda\"\n[[node]]\nmemory = \"1GiB\"\n").node_backend)
      << "a node without the key keeps the command's --backend";
  EXPECT_FALSE(load("[[node]]\nbackend = \"cpu\"\n[[node]]\nbackend = \"cuda\"\n").node_backend);
  EXPECT_FALSE(load("").node_backend);
}

TEST(ClusterRun, ConfigFilesAreCheckedKeyByKey) {
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("configs"))) {
    if (e.path().extension() != ".toml") continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(load_cluster_config(e.path().string()));
  }
  test::TempDir dir;
  auto write = [&](const std::string& text) {
    const std::string p = dir.file("c.toml");
    test::write_file(p, std::vector<uint8_t>(text.begin(), text.end()));
    return p;
  };
  auto refused = [&](const std::string& text, const std::string& why) {
    try {
      load_cluster_config(write(text));
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 2\nworkerz = 3\n", "unknown key 'workerz'");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = \"two\"\n", "cluster.workers must be an integer");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 2\nlocal = false\n", "secret_file");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 0\n", "1..64");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 1\n[serving]\nprefix_cache = 1\n",
          "serving.prefix_cache must be true or false");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 1\nlisten = \"::1:7070\"\n", "cluster.listen");
  refused("[cluster]\nworkers = 2\n", "[model] needs path");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 1\ntp = 0\n", "cluster.tp must be in 1..64");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 33\ntp = 2\n", "workers x tp at most 64");
  refused("[model]\nparts = [\"a.gguf\", \"b.gguf\"]\n[cluster]\ntp = 2\n", "rank files of baton split --tp");
  EXPECT_EQ(load_cluster_config(test::source_path("configs/two-sparks-tp.toml")).tp, 2);
  refused("[model\npath = 1\n", "line 1");
  refused("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 1\n[[node]]\nmemory = \"12 parsecs\"\n",
          "node.memory");
  const ClusterConfig c = load_cluster_config(
      write("[model]\nparts = [\"a.gguf\", \"/abs/b.gguf\"]\n[serving]\nctx = 512\n"
            "[[node]]\nname = \"s1\"\nmemory = \"128GB\"\nunified = true\n"));
  EXPECT_EQ(c.workers, 2);
  EXPECT_EQ(c.parts.at(0), (std::filesystem::path(dir.path()) / "a.gguf").string());
  EXPECT_EQ(c.parts.at(1), "/abs/b.gguf");
  EXPECT_EQ(c.model, c.parts.at(0));
  EXPECT_EQ(c.ctx, 512);
  EXPECT_TRUE(c.prefix_cache);
  EXPECT_FALSE(
      load_cluster_config(write("[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 1\n[serving]\nprefix_cache = false\n"))
          .prefix_cache);
  ASSERT_EQ(c.nodes.size(), 1u);
  EXPECT_EQ(c.nodes[0].memory_bytes, 128000000000ull);
  EXPECT_TRUE(c.nodes[0].unified);
  EXPECT_FALSE(c.sampling.temperature);
  EXPECT_FALSE(c.sampling.seed);

  // [sampling]: serve's defaults, an integer where a number is asked taken as one.
  const std::string head = "[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 1\n[sampling]\n";
  const ClusterConfig s = load_cluster_config(
      write(head + "temperature = 0\ntop_p = 0.9\ntop_k = 20\nmin_p = 0.1\nseed = 7\nrepeat_penalty = 1.1\n"
                   "repeat_last_n = 128\npresence_penalty = -0.5\nfrequency_penalty = 0.25\n"));
  EXPECT_EQ(s.sampling.temperature, 0.0);
  EXPECT_EQ(s.sampling.top_p, 0.9);
  EXPECT_EQ(s.sampling.top_k, 20);
  EXPECT_EQ(s.sampling.min_p, 0.1);
  EXPECT_EQ(s.sampling.seed, 7u);
  EXPECT_EQ(s.sampling.repeat_penalty, 1.1);
  EXPECT_EQ(s.sampling.repeat_last_n, 128);
  EXPECT_EQ(s.sampling.presence_penalty, -0.5);
  EXPECT_EQ(s.sampling.frequency_penalty, 0.25);
  EXPECT_FALSE(load_cluster_config(write(head + "seed = -1\n")).sampling.seed);
  refused(head + "temperature = 3\n", "sampling.temperature must be between 0 and 2, got 3");
  refused(head + "top_p = \"high\"\n", "sampling.top_p must be a number");
  refused(head + "top_k = 1.5\n", "sampling.top_k must be an integer");
  refused(head + "top_k = -1\n", "sampling.top_k must be between 0 and");
  refused(head + "seed = -2\n", "sampling.seed");
  refused(head + "repeat_penalty = 0\n", "sampling.repeat_penalty must be between");
  refused(head + "temp = 1\n", "unknown key 'temp' in [sampling]");
  refused("sampling = 1\n[model]\npath = \"m.gguf\"\n[cluster]\nworkers = 1\n", "sampling must be a table");
}

}  // namespace
}  // namespace baton
