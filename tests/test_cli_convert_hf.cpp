// `baton convert` of checkpoints as transformers itself writes them. Each folder of
// tests/fixtures/hf/ was written by transformers' save_pretrained (bench/hf_fixtures.py) beside
// the logits transformers computed for a fixed prompt (float32 weights and math, eager
// attention): reference.json ({tokens, rows, cols, transformers}) and reference_logits.f32
// (rows x cols, little-endian). The folder is converted to an f32 GGUF and `baton logits` must
// give those logits within the float32 limit of the transformers oracles (docs/CONVERT.md):
// max |baton - reference| / max |reference| <= 1e-3. A name the converter misplaces (a norm
// taken for another of the same shape, a missed rope layout) is off by far more.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "tests/convert_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;

constexpr double kF32Limit = 1e-3;

struct Fixture {
  const char* folder;  // under tests/fixtures/hf/
  const char* arch;    // what `baton convert` reports
};

void PrintTo(const Fixture& f, std::ostream* os) { *os << f.folder; }

class CliConvertHf : public ::testing::TestWithParam<Fixture> {};

TEST_P(CliConvertHf, SavePretrainedCheckpointGivesTransformersLogits) {
  const Fixture& fx = GetParam();
  const std::string src = test::source_path(std::string("tests/fixtures/hf/") + fx.folder);
  std::ifstream in(src + "/reference.json");
  ASSERT_TRUE(in) << "missing " << src << "/reference.json";
  const json ref_info = json::parse(in);
  const auto tokens = ref_info.at("tokens").get<std::vector<int32_t>>();
  const int64_t rows = ref_info.at("rows").get<int64_t>(), cols = ref_info.at("cols").get<int64_t>();
  ASSERT_EQ(int64_t(tokens.size()), rows);
  const std::vector<float> ref = test::read_raw_f32(src + "/reference_logits.f32");
  ASSERT_EQ(int64_t(ref.size()), rows * cols);

  test::TempDir dir;
  const std::string gguf = dir.file("model.gguf"), out = dir.file("logits.f32");
  auto r = test::baton({"convert", "--from", src, "-o", gguf, "--type", "f32", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(std::string(": ") + fx.arch + ","), std::string::npos) << r.out;
  r = test::baton({"logits", "-m", gguf, "--tokens", test::join(tokens), "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<float> got = test::read_raw_f32(out);
  ASSERT_EQ(got.size(), ref.size());

  double diff = 0, scale = 0;
  int64_t worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (d > diff) diff = d, worst = int64_t(i);
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  ASSERT_GT(scale, 0.0);
  EXPECT_LE(diff / scale, kF32Limit) << "max |baton - transformers| " << diff << " at position " << worst / cols
                                     << ", token " << worst % cols << "; max |transformers| " << scale << " ("
                                     << ref_info.value("transformers", std::string("?")) << ")";
}

// What the qwen3 GGUF architecture cannot hold is refused by field, not
// converted into a file that runs wrongly.
TEST(CliConvertHfQwen3, RefusesBiasesAndSlidingWindowsNamingTheField) {
  test::TempDir dir;
  const std::string src = test::source_path("tests/fixtures/hf/qwen3"), hf = dir.file("hf");
  std::filesystem::create_directories(hf);
  std::filesystem::copy_file(src + "/model.safetensors", hf + "/model.safetensors");
  std::ifstream in(src + "/config.json");
  const json config = json::parse(in);
  for (const char* field : {"attention_bias", "use_sliding_window"}) {
    json c = config;
    c[field] = true;
    test::write_text(hf + "/config.json", c.dump());
    const auto r = test::baton({"convert", "--from", hf, "-o", dir.file("m.gguf"), "--quiet"});
    EXPECT_EQ(r.exit_code, 1) << field;
    EXPECT_NE(r.err.find(std::string("'") + field + "' = true"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("m.gguf")));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CliConvertHf,
                         ::testing::Values(Fixture{"qwen3", "qwen3"}, Fixture{"deepseek_v4", "deepseek4"}),
                         [](const ::testing::TestParamInfo<Fixture>& i) { return std::string(i.param.folder); });

}  // namespace
}  // namespace baton
