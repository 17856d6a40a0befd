// docs/QUICKSTART.md runs as written: its ```sh blocks, in order, as one
// script in a temporary folder where build/baton is the built binary, with
// $BATON_SHARED pointing at the fixtures and the server's port 8080 replaced
// by a free one. Each block must succeed, and the pipeline of split parts
// must print the text the single process printed, as the page says.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> shell_blocks(const std::string& markdown) {
  std::vector<std::string> blocks;
  std::istringstream in(markdown);
  std::string line, block;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside && line == "```sh") {
      inside = true;
      block.clear();
    } else if (inside && line == "```") {
      inside = false;
      blocks.push_back(block);
    } else if (inside) {
      block += line + "\n";
    }
  }
  return blocks;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(CliQuickstart, EveryShellBlockRunsAndThePipelineMatchesOneProcess) {
  std::ifstream in(test::source_path("docs/QUICKSTART.md"));
  ASSERT_TRUE(in) << "cannot read docs/QUICKSTART.md";
  std::stringstream md;
  md << in.rdbuf();
  const std::vector<std::string> blocks = shell_blocks(md.str());
  ASSERT_GE(blocks.size(), 6u);

  test::TempDir dir;
  fs::create_directories(dir.path() / "build");
  fs::create_symlink(test::baton_binary(), dir.path() / "build" / "baton");
  const int port = free_port();
  ASSERT_GT(port, 0);
  // Each block's output follows a marker line, so that it can be found.
  std::string script = "set -eu\ncd '" + dir.path().string() + "'\nexport BATON_SHARED='" + test::shared_dir() + "'\n";
  for (size_t i = 0; i < blocks.size(); ++i) {
    script += "echo '=== block " + std::to_string(i) + "'\n";
    script += std::regex_replace(blocks[i], std::regex("8080"), std::to_string(port));
  }
  script += "echo '=== done'\n";
  const test::CommandResult r = test::run_command({"/usr/bin/timeout", "300", "/bin/bash", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  ASSERT_NE(r.out.find("=== done"), std::string::npos) << r.out;

  auto block_output = [&](size_t i) {
    const std::string from = "=== block " + std::to_string(i) + "\n";
    const size_t at = r.out.find(from);
    if (at == std::string::npos) return std::string();
    const size_t end = r.out.find("=== ", at + from.size());
    return r.out.substr(at + from.size(), end - at - from.size());
  };
  EXPECT_NE(block_output(0).find("baton "), std::string::npos);
  EXPECT_NE(block_output(0).find("llama"), std::string::npos) << block_output(0);
  // Step 2: the greedy text, then a sampled one.
  const std::string run = block_output(1);
  const size_t eol = run.find('\n');
  ASSERT_NE(eol, std::string::npos) << run;
  const std::string greedy = run.substr(0, eol);
  EXPECT_EQ(greedy.rfind("Once upon a time", 0), 0u) << run;
  EXPECT_GT(greedy.size(), std::string("Once upon a time").size() + 20);
  EXPECT_NE(r.err.find("; seed 7]"), std::string::npos) << r.err;
  // Step 3: a chat completion.
  EXPECT_NE(block_output(2).find("\"chat.completion\""), std::string::npos) << block_output(2);
  // Step 4: the plan, the parts, and the pipeline's text.
  EXPECT_NE(block_output(4).find("part2-of-2"), std::string::npos) << block_output(4);
  EXPECT_EQ(block_output(5), greedy + "\n");
}

}  // namespace
}  // namespace baton
