// The prefix cache through `baton serve` (docs/SERVING.md, "Prefix cache"),
// in process and on a pipeline of two workers, for stories260K (KV that can
// be cut anywhere) and a synthetic deepseek4-tiny (reused only whole): a
// prompt that extends a finished one, or shares part of it, computes only
// its new tokens and gets the greedy text a server without the cache gives;
// usage and /metrics count the reused tokens; --no-prefix-cache reuses none.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf_split/synth.h"
#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;

struct Completion {
  std::string text;
  int64_t prompt_tokens = -1;
  int64_t cached_tokens = -1;
};

Completion complete(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  const json body = {{"model", "m"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  const Response r = post(port, "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return {};
  const json j = r.j();
  return {j["choices"][0]["text"].get<std::string>(), j["usage"]["prompt_tokens"].get<int64_t>(),
          j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>()};
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// One slot, so every request finds what the one before it left. The first
// request samples one token, which is never fed: the slot keeps exactly its
// prompt. Then: that prompt and more (reused whole), part of it and
// something else (reused when the KV can be cut), and the same prefix again
// with --no-prefix-cache.
void expect_prefix_cache(const std::string& model, bool truncatable, const std::vector<std::string>& layout) {
  const std::vector<int32_t> story = {1, 103, 107, 61, 78, 114, 61, 103, 78};
  struct Case {
    std::vector<int32_t> prompt;
    int max_tokens;
    int64_t cached;
  };
  const std::vector<Case> cases = {
      {story, 1, 0},
      {concat(story, {61, 78, 107}), 12, int64_t(story.size())},
      {concat(std::vector<int32_t>(story.begin(), story.begin() + 6), {107, 107, 61}), 12, truncatable ? 6 : 0},
  };
  std::vector<std::string> want;
  {
    ServeProcess plain({"-m", model, "--model-id", "m", "--parallel", "1", "--no-prefix-cache", "--quiet"});
    for (const Case& c : cases) want.push_back(complete(plain.port(), c.prompt, c.max_tokens).text);
    // Off: nothing is reused, nothing is counted.
    EXPECT_EQ(complete(plain.port(), cases[1].prompt, 4).cached_tokens, 0);
    EXPECT_EQ(metric(plain.port(), "baton_prompt_tokens_cached_total"), 0);
  }
  std::vector<std::string> args = {"-m", model, "--model-id", "m", "--parallel", "1", "--quiet"};
  args.insert(args.end(), layout.begin(), layout.end());
  ServeProcess server(args);
  int64_t cached_total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const double prefill_before = metric(server.port(), "baton_prefill_tokens_total");
    const Completion got = complete(server.port(), cases[i].prompt, cases[i].max_tokens);
    EXPECT_EQ(got.text, want[i]);
    EXPECT_EQ(got.prompt_tokens, int64_t(cases[i].prompt.size()));
    EXPECT_EQ(got.cached_tokens, cases[i].cached);
    // Only the tokens past the reused prefix ran as prefill.
    EXPECT_EQ(metric(server.port(), "baton_prefill_tokens_total") - prefill_before,
              double(int64_t(cases[i].prompt.size()) - cases[i].cached));
    cached_total += cases[i].cached;
  }
  EXPECT_EQ(metric(server.port(), "baton_prompt_tokens_cached_total"), double(cached_total));
  EXPECT_GT(cached_total, 0);
}

std::string deepseek4_tiny(const test::TempDir& dir) {
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-tiny";
  o.seed = 7;
  const std::string path = dir.file("ds4.gguf");
  write_synth_model(path, o);
  return path;
}

TEST(ServePrefixCache, LlamaInProcess) { expect_prefix_cache(stories(), true, {}); }

TEST(ServePrefixCache, LlamaOnTwoWorkers) { expect_prefix_cache(stories(), true, {"--workers", "2"}); }

TEST(ServePrefixCache, Deepseek4InProcess) {
  test::TempDir dir;
  expect_prefix_cache(deepseek4_tiny(dir), false, {});
}

TEST(ServePrefixCache, Deepseek4OnTwoWorkers) {
  test::TempDir dir;
  expect_prefix_cache(deepseek4_tiny(dir), false, {"--workers", "2"});
}

// Two slots on two workers: a prompt that matches neither slot takes the
// least recently used one, and its kept prefix is gone; the other slot's
// survives.
TEST(ServePrefixCache, EvictsTheLeastRecentlyUsedSlotOnTwoWorkers) {
  ServeProcess server({"-m", stories(), "--model-id", "m", "--parallel", "2", "--workers", "2", "--quiet"});
  const int port = server.port();
  const std::vector<int32_t> a = {1, 103, 107, 61, 78, 114};
  const std::vector<int32_t> b = {1, 78, 61, 103, 107, 107};
  const std::vector<int32_t> c = {1, 114, 114, 61, 103, 78};
  EXPECT_EQ(complete(port, a, 4).cached_tokens, 0);
  EXPECT_EQ(complete(port, b, 4).cached_tokens, 0);  // the empty slot, not a's
  EXPECT_EQ(complete(port, concat(a, {61}), 4).cached_tokens, int64_t(a.size()));  // b's is the LRU now
  EXPECT_EQ(complete(port, c, 4).cached_tokens, 0);                               // evicts b's
  EXPECT_EQ(complete(port, concat(b, {61}), 4).cached_tokens, 0);                 // evicts a's
  EXPECT_EQ(complete(port, concat(c, {61}), 4).cached_tokens, int64_t(c.size()));
  EXPECT_EQ(metric(port, "baton_prompt_tokens_cached_total"), double(a.size() + c.size()));
}

}  // namespace
}  // namespace baton
