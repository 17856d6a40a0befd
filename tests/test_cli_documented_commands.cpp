// The commands the documentation shows are real (that every configs/*.toml
// loads with the project's config parser is ClusterRun.ConfigFilesAreChecked-
// KeyByKey in test_cli_cluster.cpp): every `baton ...` command written in
// README.md's and docs/*.md's code blocks and in the configs' comments parses
// and passes the option checks of the current CLI (BATON_PARSE_ONLY=1, see
// engine/base/command_line.h: nothing runs, named files need not exist).
//
// What counts as a command: a code-block line (or a config comment line, or
// a `baton WORD ARGS` span in a config comment) that starts with "baton WORD", after
// an optional shell prompt ("$ ", "host$ "); lines ending in '\' continue it.
// Synopses (with [optional] parts, a|b choices or "...") and output lines
// ("baton serve: listening ...") are not commands and are left out.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

struct Documented {
  std::string where;  // file:line
  std::string text;
};

// Words as a POSIX shell splits them: blanks separate, '...' and "..." quote,
// a backslash escapes the next character.
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) {
        quote = 0;
      } else if (c == '\\' && quote == '"' && i + 1 < line.size()) {
        cur += line[++i];
      } else {
        cur += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < line.size()) {
      cur += line[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(cur);
  return words;
}

bool is_synopsis(const std::string& cmd) {
  return cmd.find_first_of("[]|") != std::string::npos || cmd.find("...") != std::string::npos;
}

// "baton WORD ..." after an optional prompt, or "" when the text is none.
std::string command_in(const std::string& text) {
  static const std::regex re(R"(^\s*(?:\S*\$\s+)?(baton\s+[a-z]+(?:\s.*)?)$)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return "";
  return m[1].str();
}

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

void add(std::vector<Documented>& out, const std::string& where, std::string cmd) {
  while (!cmd.empty() && (cmd.back() == ' ' || cmd.back() == '\r')) cmd.pop_back();
  if (!is_synopsis(cmd)) out.push_back({where, cmd});
}

std::vector<Documented> commands_in(const fs::path& file) {
  const bool toml = file.extension() == ".toml";
  const std::vector<std::string> lines = read_lines(file);
  const std::string name = file.filename().string();
  std::vector<Documented> out;
  bool in_code = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string text = lines[i];
    if (toml) {
      if (text.rfind('#', 0) != 0) continue;
      text = text.substr(1);
      // A span with arguments; "`baton plan`" alone names the command.
      static const std::regex span("`(baton [a-z]+ [^`]+)`");
      for (std::sregex_iterator it(text.begin(), text.end(), span), end; it != end; ++it) {
        add(out, name + ":" + std::to_string(i + 1), (*it)[1].str());
      }
    } else {
      if (text.find("```") != std::string::npos && text.find_first_not_of(" ") == text.find("```")) {
        in_code = !in_code;
        continue;
      }
      if (!in_code) continue;
    }
    std::string cmd = command_in(text);
    if (cmd.empty()) continue;
    const size_t first = i;
    while (!cmd.empty() && cmd.back() == '\\' && i + 1 < lines.size()) {
      std::string next = lines[++i];
      if (toml && !next.empty() && next[0] == '#') next = next.substr(1);
      cmd.pop_back();
      cmd += " " + next;
    }
    add(out, name + ":" + std::to_string(first + 1), cmd);
  }
  return out;
}

std::vector<fs::path> documented_files() {
  std::vector<fs::path> files = {test::source_path("README.md")};
  for (const char* dir : {"docs", "configs"}) {
    for (const auto& e : fs::directory_iterator(test::source_path(dir))) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".md" || ext == ".toml")) files.push_back(e.path());
    }
  }
  return files;
}

// Runs `baton ARGS` in parse-only mode from the top of the checkout (where
// the configs the commands name are).
test::CommandResult parse_only(const std::vector<std::string>& args) {
  const fs::path here = fs::current_path();
  fs::current_path(test::source_path(""));
  setenv("BATON_PARSE_ONLY", "1", 1);
  std::vector<std::string> argv = {test::baton_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  test::CommandResult r = test::run_command(argv);
  unsetenv("BATON_PARSE_ONLY");
  fs::current_path(here);
  return r;
}

TEST(CliDocumentedCommands, EveryDocumentedCommandParses) {
  std::vector<Documented> all;
  for (const fs::path& f : documented_files()) {
    for (Documented& d : commands_in(f)) all.push_back(std::move(d));
  }
  // The deployment recipes are among them: the extraction cannot go blind.
  auto has = [&](const std::string& where_prefix, const std::string& part) {
    for (const Documented& d : all) {
      if (d.where.rfind(where_prefix, 0) == 0 && d.text.find(part) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("one-96gb-card.toml", "baton plan -m MODEL --nodes 97887MiB"));
  EXPECT_TRUE(has("two-sparks.toml", "--listen spark-2:7071"));
  EXPECT_TRUE(has("two-sparks-tp.toml", "--mesh-port 7072"));
  EXPECT_TRUE(has("SERVING.md", "baton serve --config configs/local-loopback.toml"));
  EXPECT_GE(all.size(), 15u);
  for (const Documented& d : all) {
    std::vector<std::string> words = shell_words(d.text);
    ASSERT_GE(words.size(), 2u) << d.where;
    words.erase(words.begin());  // "baton"
    const test::CommandResult r = parse_only(words);
    EXPECT_EQ(r.exit_code, 0) << d.where << ": " << d.text << "\n" << r.err;
    EXPECT_EQ(r.out, "") << d.where << ": parse-only mode does none of the work";
  }
}

// Parse-only mode still refuses what the real command refuses.
TEST(CliDocumentedCommands, ParseOnlyStillRefusesBadOptions) {
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"plan", "-m", "m.gguf", "--nodes", "97887MiB"},                           // no --ctx
           {"plan", "-m", "m.gguf", "--nodes", "96XB", "--ctx", "512"},                // bad size
           {"worker", "--coordinator", "spark-1", "--secret-file", "s"},              // no port
           {"worker", "--coordinator", "::1:7070", "--secret-file", "s"},             // IPv6 without brackets
           {"worker", "--coordinator", "h:1", "--secret-file", "s", "--backend", "gpu"},
           {"serve", "-m", "m.gguf", "--port", "70000"},
           {"serve", "-m", "m.gguf", "--no-such-option"},
           {"split", "m.gguf", "--layers", "0:1"},                                    // no -o
       }) {
    const test::CommandResult r = parse_only(bad);
    EXPECT_EQ(r.exit_code, 1) << bad[0] << " " << bad[1] << "\n" << r.err;
  }
  // And takes what is right, without touching files or hosts.
  EXPECT_EQ(parse_only({"worker", "--coordinator", "[::1]:7070", "--listen", "no-such-host.invalid:7071",
                        "--secret-file", "/nonexistent", "--backend", "cuda", "--staging-mb", "16"})
                .exit_code,
            0);
}

TEST(CliDocumentedCommands, ExtractionRules) {
  test::TempDir dir;
  const std::string md = dir.file("x.md");
  std::ofstream(md) << "text `baton run -m M` prose\n"
                       "```\n"
                       "$ baton run -m m.gguf -p \"two words\"\n"
                       "baton serve: listening on http://127.0.0.1:8080\n"
                       "baton split MODEL --layers 0:2,3:output -o parts/ [--dry-run]\n"
                       "host$ baton worker --coordinator h:1 \\\n"
                       "      --secret-file s\n"
                       "```\n";
  const std::string toml = dir.file("x.toml");
  std::ofstream(toml) << "# `baton plan` finds it: `baton plan -m M --nodes 1GB --ctx 8` then\n"
                         "#   host$ baton serve --config x.toml\n"
                         "key = 1  # baton run -m not-a-comment-line\n";
  const auto in_toml = commands_in(toml);
  ASSERT_EQ(in_toml.size(), 2u);
  EXPECT_EQ(in_toml[0].text, "baton plan -m M --nodes 1GB --ctx 8");
  EXPECT_EQ(in_toml[1].text, "baton serve --config x.toml");
  const auto got = commands_in(md);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].text, "baton run -m m.gguf -p \"two words\"");
  EXPECT_EQ(shell_words(got[0].text), (std::vector<std::string>{"baton", "run", "-m", "m.gguf", "-p", "two words"}));
  EXPECT_EQ(got[1].where, "x.md:6");
  EXPECT_EQ(shell_words(got[1].text),
            (std::vector<std::string>{"baton", "worker", "--coordinator", "h:1", "--secret-file", "s"}));
}

}  // namespace
}  // namespace baton
