// `baton logits`: the logits of a prompt as .npy, equal to `baton run`'s top logits, and its
// refusals of bad token lists.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/convert_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;
using test::baton;
using test::join;

TEST(CliLogits, MatchesRunOnStories260KAndWritesNpy) {
  const std::string model = test::model_path("stories260K.gguf");
  auto r = baton({"run", "-m", model, "-p", "Once upon a time there was", "-n", "0", "--json", "-t", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  const std::vector<int32_t> prompt = j.at("prompt_tokens").get<std::vector<int32_t>>();
  test::TempDir dir;
  r = baton({"logits", "-m", model, "--tokens", join(prompt), "-o", dir.file("l.npy"), "-t", "1", "--batch", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto bytes = test::read_file(dir.file("l.npy"));
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 6), "\x93NUMPY");
  const size_t header = 10 + size_t(bytes[8]) + (size_t(bytes[9]) << 8);
  EXPECT_EQ(header % 64, 0u);
  const std::string dict(bytes.begin() + 10, bytes.begin() + std::ptrdiff_t(header));
  const int64_t V = int64_t((bytes.size() - header) / 4 / prompt.size());
  EXPECT_NE(dict.find("'shape': (" + std::to_string(prompt.size()) + ", " + std::to_string(V) + ")"),
            std::string::npos)
      << dict;
  ASSERT_EQ(bytes.size(), header + prompt.size() * size_t(V) * 4);
  std::vector<float> last(static_cast<size_t>(V));
  std::memcpy(last.data(), bytes.data() + header + (prompt.size() - 1) * size_t(V) * 4, size_t(V) * 4);
  for (const auto& top : j.at("top_logits")) {
    const int id = top[0].get<int>();
    EXPECT_NEAR(last[size_t(id)], top[1].get<float>(), 1e-4f * std::fabs(top[1].get<float>()) + 1e-5f) << id;
  }
  // Refusals: a token outside the vocabulary, a malformed list.
  r = baton({"logits", "-m", model, "--tokens", "1,99999", "-o", dir.file("x.f32")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("token id 99999"), std::string::npos) << r.err;
  r = baton({"logits", "-m", model, "--tokens", "1,x", "-o", dir.file("x.f32")});
  EXPECT_NE(r.err.find("is not a token id"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace baton
