// The systemd units of configs/systemd/ pass `systemd-analyze verify` with
// their ExecStart pointed at the built binary (the units name
// /usr/local/bin/baton, where scripts/install.sh /usr/local puts it), and
// their commands are ones baton takes (BATON_PARSE_ONLY=1).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  const auto b = test::read_file(p.string());
  return std::string(b.begin(), b.end());
}

TEST(Systemd, UnitsVerifyAndTheirCommandsParse) {
  const std::vector<std::string> units = {"baton-serve.service", "baton-worker.service"};
  test::TempDir dir;
  const std::string installed = "/usr/local/bin/baton";
  for (const std::string& unit : units) {
    SCOPED_TRACE(unit);
    std::string text = read_text(fs::path(test::source_path("configs/systemd")) / unit);
    const size_t exec = text.find("ExecStart=" + installed + " ");
    ASSERT_NE(exec, std::string::npos);
    // The command line, as baton would get it.
    const size_t eol = text.find('\n', exec);
    std::istringstream words(text.substr(exec + 10 + installed.size(), eol - exec - 10 - installed.size()));
    std::vector<std::string> argv = {test::baton_binary()};
    for (std::string w; words >> w;) argv.push_back(w);
    setenv("BATON_PARSE_ONLY", "1", 1);
    const auto parsed = test::run_command(argv);
    unsetenv("BATON_PARSE_ONLY");
    EXPECT_EQ(parsed.err.find("unknown option"), std::string::npos) << parsed.err;
    // Taken as written; a serve unit's config is this machine's to provide.
    EXPECT_TRUE(parsed.exit_code == 0 || parsed.err.find("/etc/baton/cluster.toml: no such file") != std::string::npos)
        << parsed.err;
    text.replace(exec + 10, installed.size(), test::baton_binary());
    test::write_file(dir.file(unit), std::vector<uint8_t>(text.begin(), text.end()));
  }
  if (std::system("command -v systemd-analyze >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "systemd-analyze is not on this machine: the units' syntax is not checked";
  }
  std::vector<std::string> verify = {"/usr/bin/env", "systemd-analyze", "verify"};
  for (const std::string& unit : units) verify.push_back(dir.file(unit));
  const auto r = test::run_command(verify);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find(".service:"), std::string::npos) << r.err;  // no finding on our units
}

}  // namespace
}  // namespace baton
