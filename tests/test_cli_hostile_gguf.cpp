// `baton inspect` on good files (text and JSON) and on hostile ones: every bad
// file must give exit status 1 and one line on stderr naming the problem.
// `baton run -m BAD` must refuse the same files the same way. And the reader on
// random corruptions of a real header: each loads or is refused by a known class.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "engine/gguf/file.h"
#include "tests/gguf_hostile.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::CommandResult;
using test::model_path;

CommandResult inspect(std::vector<std::string> args) {
  args.insert(args.begin(), {test::baton_binary(), "inspect"});
  return test::run_command(args);
}

// Exit 1 and exactly one line on stderr, "PREFIX<path>: ...expect...".
void expect_one_line_error(const CommandResult& r, const std::string& prefix, const std::string& expect) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << r.err;
  EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
}

TEST(CliInspect, TextOfStories260K) {
  const std::string path = model_path("stories260K.gguf");
  CommandResult r = inspect({path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  for (const char* want : {"GGUF version 3, alignment 32, data offset 14176, size 1185376 bytes",
                           "metadata (19 keys):", "general.architecture", "'llama'",
                           "tokenizer.ggml.tokens", "arr[str]   len=512 ['<unk>', '<s>', '</s>',",
                           "llama.attention.layer_norm_rms_epsilon", "9.99999975e-06",
                           "tensors (48):", "blk.0.ffn_down.weight", "[172, 64]",
                           "total: 48 tensors, 1171200 bytes, 292800 parameters",
                           "tensor table hash: "}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  }
  // Arrays are abbreviated unless --full.
  EXPECT_EQ(r.out.find("'<0x05>'"), std::string::npos);
  CommandResult full = inspect({path, "--full"});
  ASSERT_EQ(full.exit_code, 0);
  EXPECT_NE(full.out.find("'<0x05>'"), std::string::npos);
}

TEST(CliInspect, JsonOfStories260K) {
  const std::string path = model_path("stories260K.gguf");
  CommandResult r = inspect({path, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["data_offset"], 14176);
  EXPECT_EQ(j["file_size"], 1185376);
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016llx", (unsigned long long)f.tensor_table_hash());
  EXPECT_EQ(j["tensor_table_hash"], hash);
  EXPECT_EQ(j["metadata"].size(), 19u);
  EXPECT_EQ(j["metadata"]["general.architecture"]["value"], "llama");
  EXPECT_EQ(j["metadata"]["llama.block_count"]["type"], "u32");
  EXPECT_EQ(j["metadata"]["llama.block_count"]["value"], 5);
  const auto& tokens = j["metadata"]["tokenizer.ggml.tokens"];
  EXPECT_EQ(tokens["type"], "arr[str]");
  EXPECT_EQ(tokens["value"]["length"], 512);
  EXPECT_EQ(tokens["value"]["items"].size(), 8u);
  EXPECT_EQ(tokens["value"]["truncated"], true);
  ASSERT_EQ(j["tensors"].size(), 48u);
  EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(j["tensors"][0]["type"], "F32");
  EXPECT_EQ(j["tensors"][0]["dims"], nlohmann::json::array({64, 512}));
  EXPECT_EQ(j["tensors"][0]["bytes"], 131072);
  EXPECT_EQ(j["totals"]["parameters"], 292800);

  CommandResult full = inspect({path, "--json", "--full"});
  ASSERT_EQ(full.exit_code, 0);
  nlohmann::json jf = nlohmann::json::parse(full.out);
  EXPECT_EQ(jf["metadata"]["tokenizer.ggml.tokens"]["value"]["items"].size(), 512u);
  EXPECT_FALSE(jf["metadata"]["tokenizer.ggml.tokens"]["value"].contains("truncated"));
}

TEST(CliInspect, VocabOnlyFileAndHelp) {
  CommandResult r = inspect({model_path("vocab/ggml-vocab-gpt-2.gguf"), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tensors"].size(), 0u);
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.model"]["value"], "gpt2");

  CommandResult help = inspect({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--json"), std::string::npos);
  EXPECT_NE(help.out.find("--full"), std::string::npos);

  CommandResult none = inspect({});
  expect_one_line_error(none, "baton inspect: ", "no FILE given");
  CommandResult bad_option = inspect({"--bogus"});
  expect_one_line_error(bad_option, "baton inspect: ", "bogus");
}

TEST(CliInspect, UnreadableFiles) {
  expect_one_line_error(inspect({"/nonexistent/model.gguf"}), "baton inspect: /nonexistent/model.gguf: ",
                        "cannot open /nonexistent/model.gguf: No such file or directory");
  expect_one_line_error(inspect({model_path("tinyllamas-stories-260k-f32.gguf")}),
                        "baton inspect: " + model_path("tinyllamas-stories-260k-f32.gguf") + ": ",
                        "GGUF version 1 is not supported (need 2 or 3) (at byte 4)");
}

TEST(CliInspect, HostileFilesAreRefusedOnOneLine) {
  test::TempDir dir;
  for (const auto& h : test::hostile_ggufs()) {
    SCOPED_TRACE(h.name);
    std::string path = dir.file(h.name + ".gguf");
    test::write_file(path, h.bytes);
    CommandResult r = inspect({path});
    expect_one_line_error(r, "baton inspect: " + path + ": ", h.expect);
    EXPECT_NE(r.err.find(" (at byte "), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(CliInspect, HeaderTruncationsAreRefused) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<uint8_t> file = test::read_file(model_path("stories260K.gguf"));
  uint64_t data_offset = GgufFile::parse(file.data(), file.size()).data_offset();
  // The field boundaries of the fixed header and the end of the header, plus
  // seeded random points in between.
  std::set<uint64_t> lengths = {0, 1, 3, 4, 5, 8, 15, 16, 23, 24, 31, 32, data_offset - 33,
                                data_offset - 24, data_offset - 1};
  std::mt19937_64 rng(seed);
  while (lengths.size() < 40) lengths.insert(rng() % data_offset);
  test::TempDir dir;
  for (uint64_t n : lengths) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    std::string path = dir.file("prefix.gguf");
    test::write_file(path, std::vector<uint8_t>(file.begin(), file.begin() + n));
    CommandResult r = inspect({path});
    expect_one_line_error(r, "baton inspect: " + path + ": ", " (at byte ");
    // Before the tensor infos are complete the reader runs out of bytes;
    // after, the tensor data is missing.
    bool named = r.err.find("file ends inside") != std::string::npos ||
                 r.err.find("cannot fit") != std::string::npos ||
                 r.err.find("exceeds the") != std::string::npos ||
                 r.err.find("extends past the end of the file") != std::string::npos;
    EXPECT_TRUE(named) << r.err;
  }
}

// `baton run` loads through the same reader; a bad model is an error (1), with
// the reader's message.
TEST(CliRun, HostileModelsAreRefused) {
  test::TempDir dir;
  const std::set<std::string> picked = {"bad_magic", "version_4", "kv_count_too_big", "array_length_2p63",
                                        "dims_overflow", "unknown_tensor_type", "offset_past_end",
                                        "truncated_data", "legacy_v2_q8_0"};
  int ran = 0;
  for (const auto& h : test::hostile_ggufs()) {
    if (!picked.count(h.name)) continue;
    SCOPED_TRACE(h.name);
    std::string path = dir.file(h.name + ".gguf");
    test::write_file(path, h.bytes);
    CommandResult r = test::run_command({test::baton_binary(), "run", "-m", path, "-p", "Once", "-n", "1"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(h.expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    ++ran;
  }
  EXPECT_EQ(ran, int(picked.size()));
}

// Random byte writes into the header of a small valid file. Each mutated file either loads or is
// refused with a GgufError of a known class (`gguf_error_class`), never anything else (ASan and
// UBSan watch for the rest). A file that loads is either the original (a write of the byte that
// was there) with its tensor table, or one whose change still passes every check. With the fixed
// seed the count of each outcome is pinned, so a check that stops firing, or that starts refusing
// what it accepted, changes a count and fails the test; $BATON_TEST_SEED adds a run of its own
// seed, where only the classes are checked.
TEST(GgufHostile, RandomCorruptionIsLoadedOrRefusedByClass) {
  std::vector<uint8_t> file = test::read_file(model_path("stories260K.gguf"));
  const GgufFile original = GgufFile::parse(file.data(), file.size());
  const uint64_t header = original.data_offset();
  auto outcomes = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::map<std::string, int> counts;
    for (int iter = 0; iter < 300; ++iter) {
      std::vector<uint8_t> b = test::corrupt_header(file, header, rng);
      try {
        const GgufFile f = GgufFile::parse(b.data(), b.size());
        if (b == file) {
          EXPECT_EQ(f.tensor_table_hash(), original.tensor_table_hash());
          ++counts["loaded, unchanged"];
        } else {
          ++counts[f.tensor_table_hash() == original.tensor_table_hash() ? "loaded, same tensor table"
                                                                         : "loaded, tensor table changed"];
        }
      } catch (const GgufError& e) {
        const std::string cls = test::gguf_error_class(e.what());
        EXPECT_FALSE(cls.empty()) << "a refusal of no known class: " << e.what();
        ++counts[cls.empty() ? std::string("unknown: ") + e.what() : "refused: " + cls];
      }
    }
    return counts;
  };

  // Seed 1's 300 mutations. Most writes that load land in string or float values (the tokens,
  // their scores); the few that change the tensor table rename a tensor or move one within bounds.
  const std::map<std::string, int> expected = {
      {"loaded, unchanged", 1},
      {"loaded, same tensor table", 50},
      {"loaded, tensor table changed", 9},
      {"refused: magic", 22},
      {"refused: version", 27},
      {"refused: count cannot fit", 61},
      {"refused: length exceeds the file", 82},
      {"refused: value type", 37},
      {"refused: dimension count", 2},
      {"refused: tensor type", 1},
      {"refused: offset alignment", 1},
      {"refused: data past the end", 6},
      {"refused: overlap", 1},
  };
  EXPECT_EQ(outcomes(1), expected);
  if (std::getenv("BATON_TEST_SEED")) {
    const uint64_t seed = test::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    outcomes(seed);
  }
}

}  // namespace
}  // namespace baton
