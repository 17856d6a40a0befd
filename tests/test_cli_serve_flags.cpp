// `baton serve`'s flags of other servers' spelling: --api-key KEY and
// $BATON_API_KEY beside --api-key-file, --served-model-name/--alias for
// --model-id, --log-level (warn: no start-up or request lines), and one warning for a
// --ctx beyond the model's trained context, and the sampling defaults (--temp,
// --top-p, --top-k, --min-p, --seed, the penalties; --config's [sampling]).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/serve_client.h"

namespace baton::serve_test {
namespace {

const json kRequest = {{"model", kModel}, {"prompt", "Once"}, {"max_tokens", 2}};

TEST(ServeFlags, ApiKeyOnTheCommandLine) {
  ServeProcess s({stories(), "--api-key", "sk-1"});
  EXPECT_EQ(post(s.port(), "/v1/completions", kRequest).status, 401);
  EXPECT_EQ(post(s.port(), "/v1/completions", kRequest, {"Authorization: Bearer sk-2"}).status, 401);
  EXPECT_EQ(post(s.port(), "/v1/completions", kRequest, {"Authorization: Bearer sk-1"}).status, 200);
}

TEST(ServeFlags, ApiKeyFromTheEnvironment) {
  setenv("BATON_API_KEY", "sk-env", 1);
  ServeProcess s({stories()});
  unsetenv("BATON_API_KEY");
  EXPECT_EQ(post(s.port(), "/v1/completions", kRequest).status, 401);
  EXPECT_EQ(post(s.port(), "/v1/completions", kRequest, {"Authorization: Bearer sk-env"}).status, 200);
}

TEST(ServeFlags, ApiKeyRefusals) {
  test::TempDir dir;
  const auto both = test::run_command(
      {test::baton_binary(), "serve", stories(), "--api-key", "k", "--api-key-file", dir.file("key")});
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_EQ(both.err, "baton serve: give --api-key or --api-key-file, not both\n");
  const auto empty = test::run_command({test::baton_binary(), "serve", stories(), "--api-key", ""});
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_EQ(empty.err, "baton serve: --api-key must not be empty\n");
}

TEST(ServeFlags, ServedModelNameAndAliasNameTheModel) {
  for (const char* flag : {"--served-model-name", "--alias", "--model-id"}) {
    SCOPED_TRACE(flag);
    ServeProcess s({stories(), flag, "my-model"});
    const Response models = http(s.port(), "GET", "/v1/models");
    ASSERT_EQ(models.status, 200);
    EXPECT_EQ(models.j()["data"][0]["id"], "my-model");
    json req = kRequest;
    req["model"] = "my-model";
    EXPECT_EQ(post(s.port(), "/v1/completions", req).status, 200);
    EXPECT_EQ(post(s.port(), "/v1/completions", kRequest).status, 404);
  }
}

// Without -m, serve takes run's default model: $BATON_MODEL, else the
// fixture beside the checkout (test_cli_run covers the built-in model that
// comes last, with the same function).
TEST(ServeFlags, WithoutAModelServesTheDefault) {
  const char* env = std::getenv("BATON_MODEL");
  if (env && *env) GTEST_SKIP() << "BATON_MODEL is set: the default is the environment's";
  ServeProcess s({});
  const Response models = http(s.port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.j()["data"][0]["id"], "stories260K");
  EXPECT_EQ(post(s.port(), "/v1/completions", kRequest).status, 200);
}

// The routes answer over HTTP, behind the API key as /v1/ is.
TEST(ServeFlags, TokenizeAndDetokenizeRoutes) {
  ServeProcess s({stories(), "--api-key", "k"});
  const std::vector<std::string> key = {"Authorization: Bearer k"};
  EXPECT_EQ(post(s.port(), "/tokenize", json{{"content", "Once"}}).status, 401);
  const Response t = post(s.port(), "/tokenize", json{{"content", "Once upon a time"}}, key);
  ASSERT_EQ(t.status, 200) << t.body;
  const Response d = post(s.port(), "/detokenize", json{{"tokens", t.j()["tokens"]}}, key);
  ASSERT_EQ(d.status, 200) << d.body;
  // SentencePiece's word marker on the first piece: a leading space at most.
  const std::string text = d.j()["content"].get<std::string>();
  EXPECT_TRUE(text == "Once upon a time" || text == " Once upon a time") << text;
  EXPECT_EQ(http(s.port(), "GET", "/tokenize", "", key).status, 405);
}

TEST(ServeFlags, LogLevelWarnDropsTheRequestLines) {
  ServeProcess quiet({stories(), "--log-level", "warn"});
  ASSERT_EQ(post(quiet.port(), "/v1/completions", kRequest).status, 200);
  quiet.stop();
  EXPECT_EQ(quiet.stderr_text().find("POST /v1/completions"), std::string::npos) << quiet.stderr_text();
  // The start-up lines are info lines too.
  for (const char* line : {"baton serve: backend ", "baton serve: loading ", "loading weights"}) {
    EXPECT_EQ(quiet.stderr_text().find(line), std::string::npos) << line << "\n" << quiet.stderr_text();
  }
  ServeProcess info({stories()});
  ASSERT_EQ(post(info.port(), "/v1/completions", kRequest).status, 200);
  info.stop();
  EXPECT_NE(info.stderr_text().find("POST /v1/completions"), std::string::npos) << info.stderr_text();
  for (const char* line : {"baton serve: backend ", "baton serve: loading ", "loading weights"}) {
    EXPECT_NE(info.stderr_text().find(line), std::string::npos) << line << "\n" << info.stderr_text();
  }
}

TEST(ServeFlags, CtxBeyondTheTrainedContextIsOneWarning) {
  ServeProcess s({stories(), "--ctx", "4096", "--parallel", "1"});
  EXPECT_NE(s.stderr_text().find("baton serve: warning: --ctx 4096 is beyond the model's trained context of 2048"),
            std::string::npos)
      << s.stderr_text();
}

// serve --temp 0 (here by llama-server's other spelling, --temperature): a
// request without a temperature is greedy, so the seed no longer matters;
// without it the API's temperature 1 samples, and two seeds give two texts.
// --seed fixes the seed of requests that name none. /v1/models and the
// start-up log show the defaults.
TEST(ServeFlags, SamplingDefaultsApplyToRequestsThatLeaveThemOut) {
  auto completion = [](int port, std::optional<int> seed) {
    json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 24}};
    if (seed) req["seed"] = *seed;
    const Response r = post(port, "/v1/completions", req);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.j()["choices"][0]["text"].get<std::string>() : std::string();
  };
  auto message = [](int port) {
    const json req = {{"model", kModel},
                      {"max_tokens", 24},
                      {"messages", json::array({{{"role", "user"}, {"content", "Once upon a time"}}})}};
    const Response r = post(port, "/v1/messages", req);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.body;
  };
  {
    ServeProcess greedy({stories(), "--temperature", "0", "--top-k", "5"});
    EXPECT_EQ(completion(greedy.port(), 1), completion(greedy.port(), 2));
    const json meta = http(greedy.port(), "GET", "/v1/models").j()["data"][0]["meta"];
    EXPECT_EQ(meta["sampling_defaults"], (json{{"temperature", 0.0}, {"top_k", 5}})) << meta.dump();
    const json first = json::parse(message(greedy.port()));
    const json second = json::parse(message(greedy.port()));
    EXPECT_EQ(first["content"], second["content"]);
    greedy.stop();
    EXPECT_NE(greedy.stderr_text().find(
                  "baton serve: sampling defaults for requests that leave them out: temperature 0, top_k 5\n"),
              std::string::npos)
        << greedy.stderr_text();
  }
  {
    ServeProcess sampled({stories()});
    EXPECT_NE(completion(sampled.port(), 1), completion(sampled.port(), 2));
    EXPECT_EQ(http(sampled.port(), "GET", "/v1/models").j()["data"][0]["meta"]["sampling_defaults"], json::object());
  }
  {
    ServeProcess seeded({stories(), "--seed", "7"});
    const std::string a = completion(seeded.port(), std::nullopt);
    EXPECT_EQ(a, completion(seeded.port(), std::nullopt));
    EXPECT_EQ(a, completion(seeded.port(), 7));
  }
}

// --config's [sampling] gives the same defaults; a flag wins over the file.
TEST(ServeFlags, SamplingDefaultsFromTheConfigFile) {
  test::TempDir dir;
  const std::string cfg = dir.file("serve.toml");
  const std::string text = "[model]\npath = \"" + stories() +
                           "\"\n[cluster]\nworkers = 1\n[sampling]\ntemperature = 0\ntop_k = 5\nseed = 7\npresence_penalty = 0.5\n";
  test::write_file(cfg, std::vector<uint8_t>(text.begin(), text.end()));
  {
    ServeProcess s({"--config", cfg});
    const json meta = http(s.port(), "GET", "/v1/models").j()["data"][0]["meta"];
    EXPECT_EQ(meta["sampling_defaults"],
              (json{{"temperature", 0.0}, {"top_k", 5}, {"seed", 7}, {"presence_penalty", 0.5}}))
        << meta.dump();
    s.stop();
    EXPECT_NE(s.stderr_text().find("baton serve: sampling defaults for requests that leave them out: temperature 0, "
                                   "top_k 5, seed 7, presence_penalty 0.5\n"),
              std::string::npos)
        << s.stderr_text();
  }
  {
    ServeProcess s({"--config", cfg, "--temp", "0.5", "--seed", "-1"});
    const json meta = http(s.port(), "GET", "/v1/models").j()["data"][0]["meta"];
    EXPECT_EQ(meta["sampling_defaults"], (json{{"temperature", 0.5}, {"top_k", 5}, {"presence_penalty", 0.5}}))
        << meta.dump();
  }
  const std::string bad = dir.file("bad.toml");
  const std::string bad_text = "[model]\npath = \"" + stories() + "\"\n[cluster]\nworkers = 1\n[sampling]\ntop_p = 2\n";
  test::write_file(bad, std::vector<uint8_t>(bad_text.begin(), bad_text.end()));
  const auto r = test::run_command({test::baton_binary(), "serve", "--config", bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("sampling.top_p must be between 0 and 1, got 2"), std::string::npos) << r.err;
}

TEST(ServeFlags, SamplingDefaultsOutOfRangeAreRefused) {
  for (const auto& [args, err] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--temp", "3"}, "baton serve: --temp must be between 0 and 2, got 3\n"},
           {{"--top-p", "-0.5"}, "baton serve: --top-p must be between 0 and 1, got -0.5\n"},
           {{"--min-p", "2"}, "baton serve: --min-p must be between 0 and 1, got 2\n"},
           {{"--top-k", "-1"}, "baton serve: --top-k must be between 0 and 2147483647, got -1\n"},
           {{"--presence-penalty", "3"}, "baton serve: --presence-penalty must be between -2 and 2, got 3\n"},
           {{"--repeat-penalty", "0"}, "baton serve: --repeat-penalty must be between 0.01 and 10, got 0\n"},
           {{"--repeat-last-n", "-1"}, "baton serve: --repeat-last-n must be between 0 and 65536, got -1\n"},
           {{"--seed", "x"},
            "baton serve: --seed takes an integer from 0 to 18446744073709551615, or -1 for a random seed per "
            "request; got 'x'\n"}}) {
    std::vector<std::string> cmd = {test::baton_binary(), "serve", stories()};
    cmd.insert(cmd.end(), args.begin(), args.end());
    const auto r = test::run_command(cmd);
    EXPECT_EQ(r.exit_code, 1) << args[0];
    EXPECT_EQ(r.err, err);
  }
}

TEST(ServeFlags, UnknownOptionNamesTheNearest) {
  const auto r = test::run_command({test::baton_binary(), "serve", stories(), "--api-keyfile", "k"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "baton serve: unknown option '--api-keyfile' (did you mean --api-key-file?)\n");
}

}  // namespace
}  // namespace baton::serve_test
