// The sampling penalties and min_tokens through `baton serve`, in process and
// through a pipeline of two workers (protocol v7 carries them): min_tokens
// holds back an end-of-generation token the logits favour, and the penalties
// move a greedy output in their direction (more or fewer distinct tokens).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "tests/serve_client.h"

namespace baton::serve_test {
namespace {

json completion(int port, json extra, int max_tokens = 48) {
  json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
              {"temperature", 0}, {"logprobs", 0}};
  for (auto& [k, v] : extra.items()) req[k] = v;
  const Response r = post(port, "/v1/completions", req);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.j() : json::object();
}

size_t distinct_tokens(const json& j) {
  std::set<std::string> seen;
  for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) seen.insert(t.get<std::string>());
  return seen.size();
}

void check_min_tokens(int port) {
  // A bias of +100 makes EOS (2) the greedy first token: the output is empty.
  const json eos_first = completion(port, {{"logit_bias", {{"2", 100}}}});
  EXPECT_EQ(eos_first["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(eos_first["usage"]["completion_tokens"], 0);
  // min_tokens bans it for 5 tokens; the 6th is the EOS again.
  const json held = completion(port, {{"logit_bias", {{"2", 100}}}, {"min_tokens", 5}});
  EXPECT_EQ(held["choices"][0]["finish_reason"], "stop") << held.dump();
  EXPECT_EQ(held["usage"]["completion_tokens"], 5) << held.dump();
  EXPECT_FALSE(held["choices"][0]["text"].get<std::string>().empty());
}

// Returns the plain greedy output and the penalized ones, for a comparison
// across servers.
std::vector<json> check_penalties(int port) {
  const json plain = completion(port, json::object());
  const json pf = completion(port, {{"presence_penalty", 1.5}, {"frequency_penalty", 1.5}});
  const json rep = completion(port, {{"repetition_penalty", 1.8}});
  const json reward = completion(port, {{"repeat_penalty", 0.3}});
  const size_t n_plain = distinct_tokens(plain);
  EXPECT_GT(distinct_tokens(pf), n_plain) << plain.dump() << "\n" << pf.dump();
  EXPECT_GT(distinct_tokens(rep), n_plain) << rep.dump();
  EXPECT_LT(distinct_tokens(reward), n_plain) << reward.dump();
  // Neutral values are the plain output.
  const json neutral = completion(port, {{"presence_penalty", 0}, {"frequency_penalty", 0}, {"repetition_penalty", 1},
                                         {"min_tokens", 0}});
  EXPECT_EQ(neutral["choices"][0]["text"], plain["choices"][0]["text"]);
  return {plain, pf, rep, reward};
}

TEST(ServePenalties, MinTokensDelaysEosAndPenaltiesChangeTheOutput) {
  ServeProcess local({stories(), "--quiet"});
  check_min_tokens(local.port());
  const std::vector<json> in_process = check_penalties(local.port());
  // A chat request takes them too.
  const Response chat = post(local.port(), "/v1/chat/completions",
                             {{"model", kModel},
                              {"max_tokens", 8},
                              {"min_tokens", 8},
                              {"frequency_penalty", 0.5},
                              {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_GE(chat.j()["usage"]["completion_tokens"].get<int>(), 1);
  // Out of range: refused by name.
  expect_error(post(local.port(), "/v1/completions", {{"model", kModel}, {"prompt", "Once"}, {"presence_penalty", 3}}),
               400, "invalid_value", "presence_penalty");
  local.stop();

  // The same through two workers: the last stage's sampler gets the
  // penalties, the prompt's tail and the end tokens over the wire.
  ServeProcess pipeline({stories(), "--quiet", "--workers", "2"});
  check_min_tokens(pipeline.port());
  const std::vector<json> workers = check_penalties(pipeline.port());
  for (size_t i = 0; i < workers.size(); ++i) {
    EXPECT_EQ(workers[i]["choices"][0]["text"], in_process[i]["choices"][0]["text"]) << "case " << i;
  }
}

// serve --presence-penalty and friends: the defaults of requests that name
// none, shown in /v1/models.
TEST(ServePenalties, ServerDefaults) {
  ServeProcess s({stories(), "--quiet", "--repeat-penalty", "1.8", "--repeat-last-n", "64"});
  const json meta = http(s.port(), "GET", "/v1/models").j()["data"][0]["meta"];
  EXPECT_EQ(meta["sampling_defaults"], (json{{"repeat_penalty", 1.8}, {"repeat_last_n", 64}})) << meta.dump();
  ServeProcess plain({stories(), "--quiet"});
  const json by_default = completion(s.port(), json::object());
  const json asked = completion(plain.port(), {{"repetition_penalty", 1.8}});
  EXPECT_EQ(by_default["choices"][0]["text"], asked["choices"][0]["text"]);
  const json own = completion(s.port(), {{"repetition_penalty", 1}});
  const json none = completion(plain.port(), json::object());
  EXPECT_EQ(own["choices"][0]["text"], none["choices"][0]["text"]);
}

}  // namespace
}  // namespace baton::serve_test
