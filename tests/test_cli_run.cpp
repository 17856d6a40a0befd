// `baton run` end to end: the greedy oracle in shared/models/reference_outputs.txt
// (token ids, text and top-5 logits, read from the file), the refusals of the
// legacy fixtures, the default model choice, sampling determinism and errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/runtime/backend.h"
#include "tests/test_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

struct Reference {
  std::string model;
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  std::vector<std::pair<int32_t, double>> top;  // top-5 after the prompt
  std::vector<int32_t> greedy;
  std::string text;  // prompt + generated text
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < s.size();) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      size_t used = 0;
      out.push_back(int32_t(std::stol(s.substr(i), &used)));
      i += used;
    } else {
      ++i;
    }
  }
  return out;
}

// "432(',')=17.799398, 383('▁there')=14.281259, ...": the piece is a Python
// repr in either quote style and may hold any character, so scan it.
std::vector<std::pair<int32_t, double>> parse_top(const std::string& s) {
  std::vector<std::pair<int32_t, double>> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t used = 0;
    int32_t id = int32_t(std::stol(s.substr(i), &used));
    i += used;
    if (i + 1 >= s.size() || s[i] != '(') break;
    const char quote = s[i + 1];
    i += 2;
    while (i < s.size() && s[i] != quote) i += s[i] == '\\' ? 2 : 1;
    if (s.compare(i, 3, std::string(1, quote) + ")=") != 0) break;
    i += 3;
    out.emplace_back(id, std::stod(s.substr(i), &used));
    i += used;
    while (i < s.size() && (s[i] == ',' || s[i] == ' ')) ++i;
  }
  return out;
}

// Undoes Python's repr() of a str: quotes and the escapes that appear here.
std::string py_unrepr(std::string s) {
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"')) s = s.substr(1, s.size() - 2);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char c = s[++i];
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
  }
  return out;
}

std::vector<Reference> read_references() {
  std::ifstream in(test::model_path("reference_outputs.txt"));
  std::vector<Reference> refs;
  std::string line;
  auto value = [&](const std::string& key) { return line.substr(key.size()); };
  while (std::getline(in, line)) {
    if (line.rfind("model: ", 0) == 0) {
      refs.push_back({});
      refs.back().model = value("model: ");
    } else if (refs.empty()) {
      continue;
    } else if (line.rfind("prompt: ", 0) == 0) {
      refs.back().prompt = py_unrepr(value("prompt: "));
    } else if (line.rfind("prompt tokens: ", 0) == 0) {
      refs.back().prompt_tokens = parse_ids(value("prompt tokens: "));
    } else if (line.rfind("top-5 after prompt: ", 0) == 0) {
      refs.back().top = parse_top(value("top-5 after prompt: "));
    } else if (line.rfind("greedy tokens: ", 0) == 0) {
      refs.back().greedy = parse_ids(value("greedy tokens: "));
    } else if (line.rfind("greedy text: ", 0) == 0) {
      refs.back().text = py_unrepr(value("greedy text: "));
    }
  }
  return refs;
}

test::CommandResult baton_run(std::vector<std::string> args) {
  args.insert(args.begin(), {test::baton_binary(), "run"});
  return test::run_command(args);
}

// `baton run COMMON --draft-test MODE --draft-max 3` for each test draft
// source: each mode's --json output, whose tokens must be `want`.
std::vector<std::pair<std::string, nlohmann::json>> draft_test_runs(const std::vector<std::string>& common,
                                                                    const std::vector<int32_t>& want) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  for (const char* mode : {"forced-accept", "forced-reject", "forced-prefix"}) {
    std::vector<std::string> args = common;
    args.insert(args.end(), {"--draft-test", mode, "--draft-max", "3"});
    auto r = baton_run(args);
    EXPECT_EQ(r.exit_code, 0) << mode << ": " << r.err;
    if (r.exit_code != 0) continue;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want) << mode;
    out.emplace_back(mode, std::move(j));
  }
  return out;
}

// Errors are one line, "baton run: <message>".
void expect_clean_error(const test::CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("baton run: ", 0), 0u) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

// The legacy fixtures the reader refuses by decision, and what the message names.
const std::map<std::string, std::string> kRefused = {
    {"tinyllamas-stories-260k-f32.gguf", "version 1"},  // GGUF v1
    {"tinyllamas-stories-260k-q8_0.gguf", "block size"},  // ffn_down rows of 172 in 32-element blocks
};

TEST(CliRun, GreedyOracleFromReferenceOutputs) {
  auto refs = read_references();
  ASSERT_GE(refs.size(), 4u) << "could not read " << test::model_path("reference_outputs.txt");
  int checked = 0, refused = 0;
  for (const auto& ref : refs) {
    SCOPED_TRACE(ref.model + " prompt '" + ref.prompt + "'");
    ASSERT_FALSE(ref.greedy.empty());
    ASSERT_EQ(ref.top.size(), 5u);
    auto r = baton_run({"-m", test::model_path(ref.model), "-p", ref.prompt, "-n", std::to_string(ref.greedy.size()),
                        "--temp", "0", "--json", "--threads", "2"});
    if (auto it = kRefused.find(ref.model); it != kRefused.end()) {
      expect_clean_error(r, it->second);
      ++refused;
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["prompt_tokens"].get<std::vector<int32_t>>(), ref.prompt_tokens);
    EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), ref.greedy);
    EXPECT_EQ(j["n_prompt"].get<size_t>(), ref.prompt_tokens.size());
    EXPECT_EQ(j["n_gen"].get<size_t>(), ref.greedy.size());
    EXPECT_EQ(ref.prompt + j["text"].get<std::string>(), ref.text);
    ASSERT_EQ(j["top_logits"].size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(j["top_logits"][i][0].get<int32_t>(), ref.top[i].first) << "rank " << i;
      double got = j["top_logits"][i][1].get<double>(), want = ref.top[i].second;
      EXPECT_NEAR(got, want, 1e-3 * std::abs(want)) << "rank " << i;
    }
    EXPECT_GE(j["prefill_tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0.0);
    ++checked;
  }
  EXPECT_EQ(refused, 2);
  EXPECT_GE(checked, 3);
}

TEST(CliRun, StreamsPromptThenGeneratedText) {
  const std::string model = test::model_path("stories260K.gguf");
  auto r = baton_run({"-m", model, "-p", "Once upon a time", "-n", "12", "--temp", "0", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(
      baton_run({"-m", model, "-p", "Once upon a time", "-n", "12", "--temp", "0", "--json"}).out);
  EXPECT_EQ(r.out, "Once upon a time" + j["text"].get<std::string>() + "\n");
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl", 0), 0u) << r.out;
}

TEST(CliRun, SamplingIsDeterministicPerSeed) {
  const std::string model = test::model_path("stories260K.gguf");
  auto run = [&](const std::string& seed) {
    auto r = baton_run({"-m", model, "-n", "24", "--temp", "1.0", "--seed", seed, "--json", "--threads", "2"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["tokens"].get<std::vector<int32_t>>();
  };
  auto a = run("7"), b = run("7"), c = run("8");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(CliRun, HelpExplainsEveryOption) {
  auto r = baton_run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* opt : {"--model", "--prompt", "--n-predict", "--temp", "--seed", "--top-k", "--top-p", "--min-p",
                          "--ctx", "--threads", "--json", "BATON_MODEL", "Once upon a time", "64"}) {
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
  }
}

// Runs baton from a folder where no default fixture can be found, with
// BATON_MODEL set or not: the child inherits this process's cwd and env.
test::CommandResult run_isolated(const std::vector<std::string>& args, const char* baton_model) {
  // <dir>/iso/bin/baton run from <dir>/iso/work: the fixture would be
  // <dir>/iso/shared or <dir>/shared, which never exist (a shared/ beside
  // the temporary folder itself must not be found).
  test::TempDir dir;
  const fs::path root = dir.path() / "iso";
  fs::create_directories(root / "bin");
  fs::create_directories(root / "work");
  fs::path exe = root / "bin" / "baton";
  fs::copy_file(test::baton_binary(), exe);
  fs::permissions(exe, fs::perms::owner_exec, fs::perm_options::add);
  fs::path old_cwd = fs::current_path();
  fs::current_path(root / "work");
  std::string old_env = std::getenv("BATON_MODEL") ? std::getenv("BATON_MODEL") : "";
  if (baton_model) {
    setenv("BATON_MODEL", baton_model, 1);
  } else {
    unsetenv("BATON_MODEL");
  }
  std::vector<std::string> argv = {exe.string(), "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = test::run_command(argv);
  fs::current_path(old_cwd);
  if (old_env.empty()) {
    unsetenv("BATON_MODEL");
  } else {
    setenv("BATON_MODEL", old_env.c_str(), 1);
  }
  return r;
}

// A fresh clone without ../shared: `run --workers 2` (scripts/run.sh's
// command) takes the built-in model too, written to a file the workers open.
TEST(CliRun, WorkersWithoutAModelRunTheSyntheticModel) {
  auto r = run_isolated({"--workers", "2", "-n", "6", "--ignore-eos", "--json"}, nullptr);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["workers"], 2);
  EXPECT_EQ(j["n_gen"].get<int>(), 6) << r.out;
}

TEST(CliRun, DefaultModelIsEnvThenFixtureThenSynthetic) {
  auto synth = run_isolated({"-n", "8", "--json"}, nullptr);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  auto j = nlohmann::json::parse(synth.out);
  EXPECT_EQ(j["model"], "(built-in synthetic model)");
  EXPECT_EQ(j["arch"], "llama");
  EXPECT_EQ(j["prompt"], "Once upon a time");
  EXPECT_GT(j["n_prompt"].get<int>(), 1);

  const std::string stories = test::model_path("stories260K.gguf");
  auto env = run_isolated({"-n", "5", "--temp", "0", "--json"}, stories.c_str());
  ASSERT_EQ(env.exit_code, 0) << env.err;
  auto je = nlohmann::json::parse(env.out);
  EXPECT_EQ(je["model"], stories);
  EXPECT_TRUE(je["seed"].is_null()) << je["seed"];  // greedy: no seed
  EXPECT_EQ(je["tokens"].get<std::vector<int32_t>>(), (std::vector<int32_t>{432, 383, 286, 261, 376}));

  // From the build folder the fixture beside the checkout is found by the binary's path.
  auto plain = baton_run({"-n", "3", "--temp", "0", "--json"});
  if (!std::getenv("BATON_MODEL")) {
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NE(nlohmann::json::parse(plain.out)["model"].get<std::string>().find("stories260K.gguf"), std::string::npos);
  }
}

TEST(CliRun, ErrorsAreOneLineNeverACrash) {
  test::TempDir dir;
  expect_clean_error(baton_run({"-m", dir.file("absent.gguf")}), "absent.gguf");
  test::write_file(dir.file("junk.gguf"), {'n', 'o', 't', ' ', 'g', 'g', 'u', 'f', 0, 1, 2, 3});
  expect_clean_error(baton_run({"-m", dir.file("junk.gguf")}), "GGUF");
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_str("rwkv42"));
  w.write(dir.file("rwkv.gguf"));
  expect_clean_error(baton_run({"-m", dir.file("rwkv.gguf")}), "unknown architecture 'rwkv42'");
  expect_clean_error(baton_run({"--temp", "warm"}), "temp");
  expect_clean_error(baton_run({"--no-such-option"}), "no-such-option");
  expect_clean_error(baton_run({"-m", test::model_path("stories260K.gguf"), "--ctx", "3"}), "context");
}

// The model may come first, as in llama.cpp's tools; a word nothing takes is
// refused instead of ignored (a misplaced path used to run the default model).
TEST(CliRun, TakesTheModelPositionallyAndRefusesStrayWords) {
  test::TempDir dir;
  expect_clean_error(baton_run({dir.file("absent.gguf"), "-n", "1"}), "absent.gguf");
  const auto r = baton_run({test::model_path("stories260K.gguf"), "-p", "Once upon a time", "-n", "4", "--temp", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  expect_clean_error(baton_run({test::model_path("stories260K.gguf"), "stray"}), "stray");
  expect_clean_error(baton_run({"-m", test::model_path("stories260K.gguf"), test::model_path("stories260K.gguf")}),
                     "model");
  // A command without positional arguments refuses them too.
  const auto logits = test::run_command({test::baton_binary(), "logits", "stray"});
  EXPECT_EQ(logits.exit_code, 1);
  EXPECT_NE(logits.err.find("unexpected argument 'stray'"), std::string::npos) << logits.err;
}

// Text on stdout and the stats on stderr into one pipe: the stats start on a
// line of their own.
TEST(CliRun, StatsStartTheirOwnLineWhenBothStreamsShareAPipe) {
  const auto r = test::run_command({"/bin/sh", "-c",
                                    "\"$0\" run \"$1\" -p 'Once upon a time' -n 8 --temp 0 2>&1",
                                    test::baton_binary(), test::model_path("stories260K.gguf")});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const size_t stats = r.out.find("[");
  ASSERT_NE(stats, std::string::npos) << r.out;
  ASSERT_GT(stats, 0u);
  EXPECT_EQ(r.out[stats - 1], '\n') << r.out;
}

}  // namespace
}  // namespace baton

namespace baton {
namespace {

// --draft-test (docs/SPECULATIVE.md): with each test draft source the output is
// the plain greedy output, token for token, on a deepseek4 written here;
// the guesses kept say which source ran.
TEST(CliRun, DraftedGreedyOutputEqualsPlain) {
  test::TempDir dir;
  const std::string model = dir.file("micro.gguf");
  auto s = test::run_command({test::baton_binary(), "synth", "--quiet", "--shape", "deepseek4-micro", "-o", model});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const std::vector<std::string> common = {"-m", model, "-p", "Once upon a time", "-n", "40", "--temp", "0",
                                           "--ignore-eos", "--json", "--threads", "1"};
  auto plain = baton_run(common);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto want = nlohmann::json::parse(plain.out)["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(want.size(), 40u);
  for (const auto& [mode, j] : draft_test_runs(common, want)) {
    EXPECT_EQ(j["text"], nlohmann::json::parse(plain.out)["text"]) << mode;
    const auto& d = j["draft"];
    if (mode == "forced-accept") {
      EXPECT_EQ(d["accepted"], d["drafted"]);
    } else if (mode == "forced-reject") {
      EXPECT_EQ(d["verifies"], 39);
      EXPECT_EQ(d["accepted"], 0);
    }
  }
  // Refused before loading: sampling, an unknown source, the length.
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--draft-test", "forced-accept", "--temp", "0.8"},
                                              std::vector<std::string>{"--draft-test", "guess"},
                                              std::vector<std::string>{"--draft-test", "forced-accept", "--draft-max", "8"}}) {
    std::vector<std::string> args = {"-m", model, "-n", "4"};
    args.insert(args.end(), bad.begin(), bad.end());
    auto r = baton_run(args);
    EXPECT_NE(r.exit_code, 0) << bad[1];
    EXPECT_NE(r.err.find("--draft"), std::string::npos) << r.err;
  }
}

// The same on the CUDA backend (the deepseek4 stage's verify forward and
// device checkpoint), where there is a GPU. The micro model's float
// matrices and forwards of at most 8 rows (--batch 8) keep every product
// float32, so the verify rows pick the decode steps' tokens (a quantized
// model's near-ties may flip on a GPU: docs/SPECULATIVE.md).
TEST(CliRun, DraftedGreedyOutputEqualsPlainOnCuda) {
  if (!backend_unavailable(Backend::Cuda).empty()) GTEST_SKIP() << backend_unavailable(Backend::Cuda);
  test::TempDir dir;
  const std::string model = dir.file("micro.gguf");
  auto s = test::run_command({test::baton_binary(), "synth", "--quiet", "--shape", "deepseek4-micro", "-o", model});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const std::vector<std::string> common = {"-m", model, "-p", "Once upon a time", "-n", "40", "--temp", "0",
                                           "--ignore-eos", "--json", "--backend", "cuda", "--batch", "8"};
  auto plain = baton_run(common);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto want = nlohmann::json::parse(plain.out)["tokens"].get<std::vector<int32_t>>();
  for (const auto& [mode, j] : draft_test_runs(common, want)) EXPECT_EQ(j["backend"], "cuda") << mode;
}

}  // namespace
}  // namespace baton
