// The OpenAI API's pure pieces, driven directly (no server): text assembly
// (stop strings, split UTF-8 characters), logprobs, the constant-time key
// comparison, and request parsing into GenerationRequests.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "coordinator/api/generation.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/api/prompt_pool.h"
#include "coordinator/api/tokenize_api.h"
#include "chat/jinja_prompt.h"
#include "chat/family.h"
#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"
#include "tests/test_model_info.h"
#include "tests/test_util.h"

namespace baton {
namespace {

TEST(ServeText, AssemblerHoldsBackStopPrefixesAndSplitCharacters) {
  TextAssembler t({"\nUser:", "END"});
  EXPECT_EQ(t.push("Hello"), "Hello");
  EXPECT_EQ(t.push(" wor"), " wor");
  EXPECT_EQ(t.push("ld\nUs"), "ld");  // "\nUs" may begin "\nUser:"
  EXPECT_EQ(t.push("ed"), "\nUsed");  // it did not
  EXPECT_EQ(t.push("E"), "");
  EXPECT_EQ(t.push("N"), "");
  EXPECT_EQ(t.push("Dless"), "");  // "END" found: nothing after it, ever
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.push("more"), "");
  EXPECT_EQ(t.flush(), "");

  TextAssembler u({});
  const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes, split over tokens
  EXPECT_EQ(u.push("a" + euro.substr(0, 1)), "a");
  EXPECT_EQ(u.push(euro.substr(1, 1)), "");
  EXPECT_EQ(u.push(euro.substr(2)), euro);
  EXPECT_EQ(u.push("\xE2\x82"), "");
  EXPECT_EQ(u.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");  // an unfinished character at the end
  EXPECT_EQ(sanitize_utf8("ok\xFF\xC0\x80z"), "ok\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a UTF-16 surrogate
}

TEST(ServeText, AssemblerMatchesStopStringsAcrossRandomSplits) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::string alphabet = "ab\xC3\xA9XY";  // includes a two-byte character
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const size_t len = 1 + rng() % 40;
    while (text.size() < len) {
      size_t k = rng() % 5;
      text += k == 2 ? std::string("\xC3\xA9") : std::string(1, alphabet[k < 2 ? k : k + 1]);
    }
    const std::string stop = rng() % 2 ? "aXb" : "\xC3\xA9Y";
    TextAssembler t({stop});
    std::string out;
    for (size_t at = 0; at < text.size() && !t.stopped();) {
      size_t n = 1 + rng() % 4;
      out += t.push(text.substr(at, n));
      at += n;
    }
    if (!t.stopped()) out += t.flush();
    const size_t pos = text.find(stop);
    EXPECT_EQ(out, pos == std::string::npos ? text : text.substr(0, pos)) << "round " << round;
  }
}

TEST(ServeText, LogprobsAreALogSoftmaxWithSortedAlternatives) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = nd(rng);
  GeneratedToken g;
  compute_logprobs(logits.data(), int64_t(logits.size()), 17, 5, g);
  double sum = 0;
  float max = logits[0];
  for (float x : logits) max = std::max(max, x);
  for (float x : logits) sum += std::exp(double(x) - max);
  EXPECT_NEAR(g.logprob, logits[17] - max - std::log(sum), 1e-4);
  ASSERT_EQ(g.top.size(), 5u);
  EXPECT_NEAR(g.top[0].logprob, -std::log(sum), 1e-4);
  EXPECT_EQ(logits[size_t(g.top[0].id)], max);
  for (size_t i = 1; i < g.top.size(); ++i) EXPECT_GE(g.top[i - 1].logprob, g.top[i].logprob);
}

TEST(ServeText, ConstantTimeCompare) {
  EXPECT_TRUE(constant_time_equal("sk-abc", "sk-abc"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-abd"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-ab"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

ModelInfo stories_info() { return test::stories_model_info(128); }

TEST(ServeApi, ParsesRequestsIntoGenerationRequests) {
  ModelInfo m = stories_info();
  ApiRequest c = parse_completion_request(
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":7,"temperature":0,"top_k":5,"min_p":0.1,
          "top_p":0.5,"seed":42,"stop":["x","yz"],"logprobs":2,"stream":true,"stream_options":{"include_usage":true},
          "logit_bias":{"2":-100}})",
      m);
  EXPECT_EQ(c.gen.prompt, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(c.gen.max_tokens, 7);
  EXPECT_EQ(c.gen.sampling.temperature, 0.f);
  EXPECT_EQ(c.gen.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(c.gen.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(c.gen.sampling.top_p, 0.5f);
  EXPECT_EQ(c.gen.sampling.seed, 42u);
  EXPECT_EQ(c.gen.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(c.gen.top_logprobs, 2);
  EXPECT_TRUE(c.stream && c.include_usage && c.logprobs);
  ASSERT_EQ(c.gen.logit_bias.size(), 1u);
  EXPECT_EQ(c.gen.logit_bias[0].first, 2);

  // Defaults: OpenAI's temperature 1 / top_p 1, 16 tokens for completions,
  // the rest of the context for chat, no logprobs.
  ApiRequest d = parse_completion_request(R"({"model":"stories260K","prompt":[1,403]})", m);
  EXPECT_EQ(d.gen.prompt, (std::vector<int32_t>{1, 403}));
  EXPECT_EQ(d.gen.max_tokens, 16);
  EXPECT_EQ(d.gen.sampling.temperature, 1.f);
  EXPECT_EQ(d.gen.top_logprobs, -1);
  ApiRequest chat = parse_chat_request(R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}]})", m);
  EXPECT_EQ(chat.gen.max_tokens, 128 - int64_t(chat.gen.prompt.size()));
  EXPECT_FALSE(chat.gen.stop_tokens.empty());
  EXPECT_EQ(chat.gen.stop, m.chat_stop_strings);
}

// serve --temp/--top-p/--top-k/--min-p/--seed: a request that leaves a field
// out gets the server's value; one that names it keeps its own; an unset
// default leaves OpenAI's.
TEST(ServeApi, ServerSamplingDefaultsFillWhatARequestLeavesOut) {
  ModelInfo m = stories_info();
  SamplingDefaults d;
  d.temperature = 0.25;
  d.top_p = 0.5;
  d.top_k = 7;
  d.min_p = 0.125;
  d.seed = 99;
  const std::string chat = R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}])";
  for (const bool is_chat : {true, false}) {
    SCOPED_TRACE(is_chat ? "chat" : "completions");
    auto parse = [&](const std::string& extra, const SamplingDefaults& defaults) {
      const std::string body = is_chat ? chat + extra + "}" : R"({"model":"stories260K","prompt":"Once")" + extra + "}";
      return is_chat ? parse_chat_request(body, m, nullptr, {}, defaults).gen.sampling
                     : parse_completion_request(body, m, defaults).gen.sampling;
    };
    const SamplerParams without = parse("", d);
    EXPECT_EQ(without.temperature, 0.25f);
    EXPECT_EQ(without.top_p, 0.5f);
    EXPECT_EQ(without.top_k, 7);
    EXPECT_EQ(without.min_p, 0.125f);
    EXPECT_EQ(without.seed, 99u);
    // null is "default" too.
    EXPECT_EQ(parse(R"(,"temperature":null)", d).temperature, 0.25f);
    const SamplerParams own = parse(R"(,"temperature":1.5,"top_p":0.9,"top_k":3,"min_p":0.0,"seed":5)", d);
    EXPECT_EQ(own.temperature, 1.5f);
    EXPECT_EQ(own.top_p, 0.9f);
    EXPECT_EQ(own.top_k, 3);
    EXPECT_EQ(own.min_p, 0.0f);
    EXPECT_EQ(own.seed, 5u);
    // A request's 0 is its own choice, not "unset".
    EXPECT_EQ(parse(R"(,"temperature":0)", SamplingDefaults{.temperature = 0.7}).temperature, 0.0f);
    const SamplerParams plain = parse("", {});
    EXPECT_EQ(plain.temperature, 1.0f);
    EXPECT_EQ(plain.top_p, 1.0f);
    EXPECT_EQ(plain.top_k, 0);
    EXPECT_EQ(plain.min_p, 0.0f);
    // Only the temperature set: the rest stay OpenAI's.
    const SamplerParams temp_only = parse("", SamplingDefaults{.temperature = 0.0});
    EXPECT_EQ(temp_only.temperature, 0.0f);
    EXPECT_EQ(temp_only.top_p, 1.0f);
  }
}

// A model whose GGUF carries a Jinja template renders chat prompts with it:
// every role and the tool calls reach the template, key order is kept,
// chat_template_kwargs become variables, and the Plain family's text stops
// (stories260K's family) no longer apply.
TEST(ServeApi, ChatPromptFromTheModelsJinjaTemplate) {
  ModelInfo m = stories_info();
  m.chat_template = std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
      "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% endfor %}"
      "{% if messages[-1].role == 'tool' and not ok %}{{ raise_exception('tool last') }}{% endif %}"
      "{% if add_generation_prompt %}[assistant]{% endif %}{% if enable_thinking %}<think>{% endif %}"));
  auto prompt_of = [&](const std::string& text) { return m.tokenizer->encode(text, false, true); };
  ApiRequest r = parse_chat_request(
      R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"},
          {"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"z":1,"a":2}}}]},
          {"role":"tool","content":"42"}],"chat_template_kwargs":{"enable_thinking":true,"ok":true}})",
      m);
  EXPECT_EQ(r.gen.prompt, prompt_of("<s>[user]Hi[assistant]{\"z\": 1, \"a\": 2}[tool]42[assistant]<think>"));
  EXPECT_TRUE(r.gen.stop.empty());
  EXPECT_EQ(r.gen.stop_tokens, m.chat_stop_tokens);

  // The template's raise_exception is a 400 naming it.
  try {
    parse_chat_request(R"({"model":"stories260K","messages":[{"role":"tool","content":"42"}]})", m);
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("tool last"), std::string::npos) << e.what();
  }

  // A template given to the API (serve --chat-template) wins over the model's.
  const JinjaTemplate other = JinjaTemplate::parse("{% for m in messages %}<{{ m.content }}>{% endfor %}");
  ApiRequest o = parse_chat_request(R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}]})", m, &other);
  EXPECT_EQ(o.gen.prompt, prompt_of("<Hi>"));

  // Without a template the family renders, and refuses what it cannot render.
  m.chat_template = nullptr;
  EXPECT_THROW(parse_chat_request(R"({"model":"stories260K","messages":[{"role":"tool","content":"42"}]})", m),
               ApiError);
}

// chat_template_kwargs add variables; they cannot replace what the server
// checked (messages, tools...) nor the template's globals: each such key is
// a 400 naming it.
TEST(ServeApi, ChatTemplateKwargsCannotReplaceCheckedVariables) {
  ModelInfo m = stories_info();
  m.chat_template = std::make_shared<const JinjaTemplate>(
      JinjaTemplate::parse("{% for m in messages %}{{ m.content }}{% endfor %}{{ extra }}"));
  for (const char* key : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                          "strftime_now", "range", "namespace", "dict"}) {
    SCOPED_TRACE(key);
    const std::string body = std::string(R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}],)") +
                             R"("chat_template_kwargs":{")" + key + R"(":[{"role":"user","content":"x"}]}})";
    try {
      parse_chat_request(body, m);
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, std::string("chat_template_kwargs.") + key);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  const ApiRequest r = parse_chat_request(
      R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"extra":"!"}})", m);
  EXPECT_EQ(r.gen.prompt, m.tokenizer->encode("Hi!", false, true));
}

// ignore_eos: parsed on both routes, refused when not a boolean; a chat drops
// the family's end-of-turn tokens and strings; accept_token keeps an EOS.
TEST(ServeApi, IgnoreEosKeepsEndOfGenerationTokens) {
  ModelInfo m = stories_info();
  const int32_t eos = m.tokenizer->eos();
  ASSERT_TRUE(m.tokenizer->is_eog(eos));
  ApiRequest c = parse_completion_request(R"({"model":"stories260K","prompt":[1,403],"ignore_eos":true})", m);
  EXPECT_TRUE(c.gen.ignore_eos);
  EXPECT_FALSE(
      parse_completion_request(R"({"model":"stories260K","prompt":[1],"ignore_eos":false})", m).gen.ignore_eos);
  EXPECT_FALSE(parse_completion_request(R"({"model":"stories260K","prompt":[1]})", m).gen.ignore_eos);
  ApiRequest chat = parse_chat_request(
      R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"ignore_eos":true,"stop":"x"})", m);
  EXPECT_TRUE(chat.gen.ignore_eos);
  EXPECT_TRUE(chat.gen.stop_tokens.empty());
  EXPECT_EQ(chat.gen.stop, std::vector<std::string>{"x"});  // the client's stop strings stay
  for (const char* bad : {R"("yes")", "1", "[true]", R"({"a":1})"}) {
    SCOPED_TRACE(bad);
    for (bool is_chat : {false, true}) {
      const std::string body =
          is_chat ? std::string(R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"ignore_eos":)") +
                        bad + "}"
                  : std::string(R"({"model":"stories260K","prompt":"Hi","ignore_eos":)") + bad + "}";
      try {
        is_chat ? parse_chat_request(body, m) : parse_completion_request(body, m);
        ADD_FAILURE() << "accepted " << body;
      } catch (const ApiError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.param, "ignore_eos");
        EXPECT_EQ(e.code, "invalid_type");
      }
    }
  }

  // The same EOS ends a request without ignore_eos and is counted with it;
  // a stop token the request names still ends it.
  GenerationRequest req = c.gen;
  req.max_tokens = 3;
  req.stop_tokens = {7};
  for (bool ignore : {false, true}) {
    req.ignore_eos = ignore;
    TextAssembler text({});
    Usage usage;
    GenerationEvent ev;
    auto reason = accept_token(req, *m.tokenizer, eos, 0, {}, false, text, usage, ev);
    if (!ignore) {
      EXPECT_EQ(reason, FinishReason::stop);
      EXPECT_EQ(usage.completion_tokens, 0);
      continue;
    }
    EXPECT_FALSE(reason);
    EXPECT_EQ(usage.completion_tokens, 1);
    ASSERT_EQ(ev.tokens.size(), 1u);
    EXPECT_EQ(ev.tokens[0].id, eos);
    EXPECT_EQ(accept_token(req, *m.tokenizer, 7, 0, {}, false, text, usage, ev), FinishReason::stop);
    EXPECT_EQ(accept_token(req, *m.tokenizer, eos, 0, {}, false, text, usage, ev), std::nullopt);
    EXPECT_EQ(accept_token(req, *m.tokenizer, eos, 0, {}, false, text, usage, ev), FinishReason::length);
    EXPECT_EQ(usage.completion_tokens, 3);
  }
}

// The body's shape is checked before nlohmann builds a tree of it: deep
// nesting and huge numbers of values are refused by name, the limits
// themselves pass.
TEST(ServeApi, JsonDepthAndValueCountAreBoundedBeforeParsing) {
  ModelInfo m = stories_info();
  const std::string head = R"({"model":"stories260K","prompt":"Once","max_tokens":1,"x":)";
  auto refusal = [&](const std::string& body) -> std::string {
    try {
      parse_completion_request(body, m);
      return "";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_json");
      return e.what();
    }
  };
  auto nested = [&](int depth) { return head + std::string(depth, '[') + std::string(depth, ']') + "}"; };
  EXPECT_EQ(refusal(nested(kMaxJsonDepth - 1)), "");  // the body's own object is one level
  EXPECT_NE(refusal(nested(kMaxJsonDepth)).find("deeper than 64"), std::string::npos);
  EXPECT_NE(refusal(std::string(1 << 20, '[')).find("deeper than 64"), std::string::npos);
  // The body's object and its 4 keys and 3 values come first.
  const int64_t room = max_json_values(m.n_ctx) - 8 - 1;  // the array is a value too
  auto zeros = [&](int64_t n) {
    std::string b = head + "[";
    for (int64_t i = 0; i < n; ++i) b += i ? ",0" : "0";
    return b + "]}";
  };
  EXPECT_EQ(refusal(zeros(room)), "");
  EXPECT_NE(refusal(zeros(room + 1)).find("more than"), std::string::npos);
  // A prompt of token ids that fills the context is not refused for its size.
  std::string ids = R"({"model":"stories260K","max_tokens":1,"prompt":[)";
  for (int64_t i = 0; i + 1 < m.n_ctx; ++i) ids += i ? ",1" : "1";
  EXPECT_EQ(refusal(ids + "]}"), "");
  // Malformed JSON is still reported as such.
  EXPECT_NE(refusal("{\"model\":").find("could not parse"), std::string::npos);
}

// The prompt threads: a job runs until its cancel flag is set (the client
// left, or the pool stops); jobs still queued at stop run with the flag set,
// so that each answers; a full queue refuses.
TEST(PromptPool, StopCancelsRunningJobsAndRunsQueuedOnesCancelled) {
  using namespace std::chrono_literals;
  PromptPool pool(1, 2);
  std::atomic<int> started{0}, ended_cancelled{0}, queued_ran_cancelled{0};
  auto spin = [&](const std::atomic<bool>& cancel) {
    ++started;
    const auto give_up = std::chrono::steady_clock::now() + 20s;
    while (!cancel && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
    if (cancel) ++ended_cancelled;
  };
  auto flag = [] { return std::make_shared<std::atomic<bool>>(false); };
  ASSERT_TRUE(pool.submit(spin, flag()));
  while (started == 0) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(pool.submit([&](const std::atomic<bool>& c) { queued_ran_cancelled += c ? 1 : 0; }, flag()));
  ASSERT_TRUE(pool.submit([&](const std::atomic<bool>& c) { queued_ran_cancelled += c ? 1 : 0; }, flag()));
  EXPECT_FALSE(pool.submit([](const std::atomic<bool>&) {}, flag()));  // 2 queued already
  const auto t = std::chrono::steady_clock::now();
  pool.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t, 5s);
  EXPECT_EQ(ended_cancelled, 1);
  EXPECT_EQ(queued_ran_cancelled, 2);
  EXPECT_TRUE(pool.stopping());
  EXPECT_FALSE(pool.submit([](const std::atomic<bool>&) {}, flag()));
}

TEST(PromptPool, WithoutThreadsAJobRunsOnTheCallersThread) {
  PromptPool pool(0, 0);
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  ASSERT_TRUE(pool.submit([&](const std::atomic<bool>&) { ran_on = std::this_thread::get_id(); },
                          std::make_shared<std::atomic<bool>>(false)));
  EXPECT_EQ(ran_on, caller);
  pool.stop();
  EXPECT_FALSE(pool.submit([](const std::atomic<bool>&) {}, std::make_shared<std::atomic<bool>>(false)));
}

TEST(PromptPool, ACancelFlagSetByTheCallerStopsItsJobAlone) {
  using namespace std::chrono_literals;
  PromptPool pool(2, 8);
  auto mine = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> done{false}, other_done{false};
  ASSERT_TRUE(pool.submit([&](const std::atomic<bool>& c) {
    while (!c) std::this_thread::sleep_for(1ms);
    done = true;
  }, mine));
  ASSERT_TRUE(pool.submit([&](const std::atomic<bool>&) { other_done = true; },
                          std::make_shared<std::atomic<bool>>(false)));
  while (!other_done) std::this_thread::sleep_for(1ms);  // the other thread still serves
  EXPECT_FALSE(done);
  *mine = true;  // what the exchange's abort does
  for (int i = 0; i < 5000 && !done; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(done);
}

// /tokenize and /detokenize in the shapes of llama-server ("content",
// add_special off, with_pieces) and vLLM ("prompt" with BOS, "messages",
// count and max_model_len); ids outside the vocabulary are a 400.
TEST(TokenizeApi, LlamaServerAndVllmShapes) {
  const ModelInfo m = test::stories_model_info(512);
  const Tokenizer& tok = *m.tokenizer;
  const nlohmann::json llama = nlohmann::json::parse(tokenize_response(R"({"content":"Once upon a time"})", m, nullptr));
  const std::vector<int32_t> plain = tok.encode("Once upon a time", false, true);
  EXPECT_EQ(llama["tokens"].get<std::vector<int32_t>>(), plain);
  EXPECT_EQ(llama["count"], plain.size());
  EXPECT_EQ(llama["max_model_len"], 512);
  const nlohmann::json vllm =
      nlohmann::json::parse(tokenize_response(R"({"model":"stories260K","prompt":"Once upon a time"})", m, nullptr));
  EXPECT_EQ(vllm["tokens"].get<std::vector<int32_t>>(), tok.encode("Once upon a time", true, true));
  const nlohmann::json pieces =
      nlohmann::json::parse(tokenize_response(R"({"content":"Once upon","with_pieces":true})", m, nullptr));
  std::string joined;
  for (const auto& p : pieces["tokens"]) joined += p["piece"].get<std::string>();
  EXPECT_EQ(tok.decode(tok.encode("Once upon", false, true)), joined);
  // messages: the prompt the chat route renders.
  const std::string chat = R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}]})";
  EXPECT_EQ(nlohmann::json::parse(tokenize_response(chat, m, nullptr))["tokens"].get<std::vector<int32_t>>(),
            parse_chat_request(chat, m).gen.prompt);

  const std::string ids = llama["tokens"].dump();
  const nlohmann::json back = nlohmann::json::parse(detokenize_response(R"({"tokens":)" + ids + "}", m));
  EXPECT_EQ(back["content"], tok.decode(plain));
  EXPECT_EQ(back["prompt"], back["content"]);
  for (const char* bad : {R"({"tokens":[1,512]})", R"({"tokens":"1"})", R"({})"}) {
    EXPECT_THROW(detokenize_response(bad, m), ApiError) << bad;
  }
  EXPECT_THROW(tokenize_response(R"({"content":7})", m, nullptr), ApiError);
  try {
    tokenize_response(R"({"model":"other","content":"x"})", m, nullptr);
    ADD_FAILURE() << "another model's id was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
  }
}

// Sampling fields the sampler does not implement are refused by name unless
// neutral (they were accepted and ignored); the penalties and min_tokens are
// implemented: taken into the sampler's parameters, refused by name out of range.
TEST(ServeApi, UnimplementedSamplingFieldsAreRefusedUnlessNeutral) {
  const ModelInfo m = test::stories_model_info(512);
  const std::string head = R"({"model":"stories260K","prompt":"Once",)";
  for (const auto& [key, neutral, other] :
       std::vector<std::tuple<std::string, std::string, std::string>>{{"mirostat", "0", "2"},
                                                                      {"continue_final_message", "false", "true"}}) {
    SCOPED_TRACE(key);
    EXPECT_NO_THROW(parse_completion_request(head + "\"" + key + "\":" + neutral + "}", m));
    try {
      parse_completion_request(head + "\"" + key + "\":" + other + "}", m);
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, key);
      EXPECT_EQ(e.code, "unsupported_parameter");
    }
  }
}

TEST(ServeApi, PenaltiesAndMinTokensReachTheSampler) {
  const ModelInfo m = test::stories_model_info(512);
  const std::string head = R"({"model":"stories260K","prompt":"Once",)";
  const ApiRequest plain = parse_completion_request(head + R"("max_tokens":4})", m);
  EXPECT_FALSE(plain.gen.sampling.penalizes());
  EXPECT_EQ(plain.gen.sampling.repeat_last_n, 64);
  const ApiRequest r = parse_completion_request(
      head + R"("presence_penalty":0.5,"frequency_penalty":-0.25,"repetition_penalty":1.1,"repeat_last_n":32,"min_tokens":5})",
      m);
  EXPECT_FLOAT_EQ(r.gen.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.frequency_penalty, -0.25f);
  EXPECT_FLOAT_EQ(r.gen.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(r.gen.sampling.repeat_last_n, 32);
  EXPECT_EQ(r.gen.sampling.min_tokens, 5);
  // llama.cpp's spelling of the repetition penalty, on the chat route too.
  const ApiRequest c = parse_chat_request(
      R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"repeat_penalty":1.3})", m);
  EXPECT_FLOAT_EQ(c.gen.sampling.repeat_penalty, 1.3f);
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{{"presence_penalty", "2.5"},
                                                                                    {"frequency_penalty", "-3"},
                                                                                    {"repetition_penalty", "0"},
                                                                                    {"repeat_penalty", "11"},
                                                                                    {"repeat_last_n", "-1"},
                                                                                    {"min_tokens", "-2"},
                                                                                    {"min_tokens", "1.5"},
                                                                                    {"presence_penalty", "\"a\""}}) {
    SCOPED_TRACE(field + "=" + value);
    try {
      parse_completion_request(head + "\"" + field + "\":" + value + "}", m);
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, field);
    }
  }
  try {
    parse_completion_request(head + R"("repetition_penalty":1.1,"repeat_penalty":1.2})", m);
    ADD_FAILURE() << "two different repetition penalties were accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
  }
  // The server's defaults apply to a request that names none, on both APIs.
  SamplingDefaults d;
  d.repeat_penalty = 1.2, d.presence_penalty = 0.3, d.repeat_last_n = 16;
  const ApiRequest dr = parse_completion_request(head + R"("max_tokens":4})", m, d);
  EXPECT_FLOAT_EQ(dr.gen.sampling.repeat_penalty, 1.2f);
  EXPECT_FLOAT_EQ(dr.gen.sampling.presence_penalty, 0.3f);
  EXPECT_EQ(dr.gen.sampling.repeat_last_n, 16);
  const ApiRequest own = parse_completion_request(head + R"("repetition_penalty":1})", m, d);
  EXPECT_FLOAT_EQ(own.gen.sampling.repeat_penalty, 1.0f);
}

}  // namespace
}  // namespace baton
