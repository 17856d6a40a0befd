// Hostile chat templates through `baton serve` (docs/RELIABILITY.md,
// "Hostile chat templates"): prompts are rendered off the HTTP threads, so a
// template that runs long answers within --template-timeout while /health
// keeps answering, and SIGTERM stops the server within a second even while a
// render is in progress. The engine's own limits (depth, work, bytes) are
// tested in test_chat_jinja. And the built-in templates by name, and the one
// a DeepSeek V4 Flash 0731 file gets without a name.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "engine/gguf/file.h"
#include "gguf_split/synth.h"
#include "tests/deepseek_v4_0731_text.h"
#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Hours of work for the message "slow" (a 60 MB string measured 100,000
// times); an ordinary prompt for any other.
const char* kSlowTemplate =
    "{% if messages[0].content == 'slow' %}{% set s = 'x' * 60000000 %}{% for i in range(100000) %}"
    "{% if s|length > 0 %}{% endif %}{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>";

json chat(const std::string& content) {
  return {{"model", kModel}, {"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 2}};
}

std::string write_template(const test::TempDir& dir) {
  const std::string path = dir.file("slow.jinja");
  std::ofstream(path) << kSlowTemplate;
  return path;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(ServeTemplates, ALongRenderAnswersWithinTheTimeoutWhileHealthAnswers) {
  test::TempDir dir;
  ServeProcess server({"-m", stories(), "--chat-template", write_template(dir), "--template-timeout", "1"});
  const int port = server.port();
  ASSERT_EQ(post(port, "/v1/chat/completions", chat("hello")).status, 200);

  const auto start = Clock::now();
  auto slow = std::async(std::launch::async, [&] { return post(port, "/v1/chat/completions", chat("slow")); });
  auto slow2 = std::async(std::launch::async, [&] { return post(port, "/v1/messages",
      json{{"model", kModel}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "slow"}}}}}); });
  // Both HTTP threads stay free: /health answers at once throughout.
  while (slow.wait_for(0s) != std::future_status::ready) {
    const auto t = Clock::now();
    EXPECT_EQ(http(port, "GET", "/health").status, 200);
    EXPECT_LT(seconds_since(t), 0.5);
    std::this_thread::sleep_for(100ms);
  }
  const Response r = slow.get();
  std::printf("a render past --template-timeout 1: answered after %.2f s\n", seconds_since(start));
  EXPECT_LT(seconds_since(start), 4.0);  // 1 s of render, slack for a loaded machine
  expect_error(r, 400, "invalid_value", "messages");
  EXPECT_EQ(slow2.get().status, 400);
  EXPECT_EQ(post(port, "/v1/chat/completions", chat("hello")).status, 200);
}

TEST(ServeTemplates, SigtermStopsWithinASecondDuringARender) {
  test::TempDir dir;
  ServeProcess server({"-m", stories(), "--chat-template", write_template(dir), "--template-timeout", "60"});
  const int port = server.port();
  auto slow = std::async(std::launch::async, [&] { return post(port, "/v1/chat/completions", chat("slow")); });
  std::this_thread::sleep_for(500ms);  // the render is under way
  const auto t = Clock::now();
  EXPECT_EQ(server.stop(), 0);
  const double stop_s = seconds_since(t);
  std::printf("SIGTERM during a render: exited after %.2f s\n", stop_s);
  EXPECT_LT(stop_s, 1.0);
  const Response r = slow.get();
  // Cancelled (503), ended by the engine's work limit first (400), or the connection closed.
  EXPECT_TRUE(r.status == 503 || r.status == 400 || r.status == 0) << r.status << " " << r.body;
}

// --chat-template NAME: a built-in renders the prompt exactly as its
// published file given as --chat-template FILE does (the /tokenize of the
// same messages gives the same tokens), the log names it, and the chat
// route answers; an unknown name ends the command at once, listing the names.
TEST(ServeTemplates, BuiltinTemplateByNameRendersAsItsFile) {
  const json messages = {{{"role", "user"}, {"content", "Once upon a time"}},
                         {{"role", "assistant"}, {"content", "there was a cat."}},
                         {{"role", "user"}, {"content", "And then?"}}};
  ServeProcess by_name({"-m", stories(), "--chat-template", "qwen2.5"});
  ServeProcess by_file(
      {"-m", stories(), "--chat-template", test::shared_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja"});
  const Response a = post(by_name.port(), "/tokenize", json{{"messages", messages}});
  const Response b = post(by_file.port(), "/tokenize", json{{"messages", messages}});
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(a.j()["tokens"], b.j()["tokens"]);
  json req = chat("hello");
  req["messages"] = messages;
  EXPECT_EQ(post(by_name.port(), "/v1/chat/completions", req).status, 200);
  by_name.stop();
  EXPECT_NE(by_name.stderr_text().find(
                "baton serve: chat prompts from the built-in template qwen2.5 (Qwen/Qwen2.5-7B-Instruct)\n"),
            std::string::npos)
      << by_name.stderr_text();

  const auto unknown = test::run_command({test::baton_binary(), "serve", stories(), "--chat-template", "qwen"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_EQ(unknown.err,
            "baton serve: --chat-template 'qwen' is neither a file nor a built-in template; the built-in ones are "
            "chatml, llama2, llama3, mistral, qwen2.5, deepseek-v3.1, deepseek-v4, deepseek-v4-0731\n");
  const auto help = test::run_command({test::baton_binary(), "serve", "--help"});
  EXPECT_NE(help.out.find("deepseek-v4"), std::string::npos) << help.out;
}

// A synthetic deepseek4-tiny whose general.name is `name`.
std::string deepseek4_tiny(const test::TempDir& dir, const std::string& name) {
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-tiny";
  o.seed = 7;
  const std::string synth = dir.file("synth.gguf");
  write_synth_model(synth, o);
  const GgufFile f = GgufFile::open(synth);
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  w.set("general.name", GgufValue::of_str(name));
  for (const GgufTensorInfo& t : f.tensors()) {
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                 [&f, &t](uint8_t* dst, uint64_t) { f.read_tensor(t, dst); });
  }
  const std::string path = dir.file(name + ".gguf");
  w.write(path);
  return path;
}

// A deepseek4 file named for 0731 and carrying no template is served with
// deepseek-v4-0731: the log says so, and a chat with reasoning_effort max
// gets 0731's max prompt after BOS (the tokens of the text written out);
// the same file under the preview's name keeps the deepseek4 format.
TEST(ServeTemplates, DeepSeekV40731FileGetsItsEncoding) {
  test::TempDir dir;
  const std::string& bos = test::kDs4Bos;
  const std::string& max = test::kDs4EffortMax;
  const json messages = {{{"role", "user"}, {"content", "Hi"}}};
  const std::string want = bos + max + "<｜User｜>Hi<｜Assistant｜><think>";
  ServeProcess flash({"-m", deepseek4_tiny(dir, "DeepSeek-V4-Flash-0731-tiny"), "--model-id", "ds4"});
  const Response got = post(flash.port(), "/tokenize", json{{"messages", messages}, {"reasoning_effort", "max"}});
  const Response text = post(flash.port(), "/tokenize", json{{"content", want}});
  ASSERT_EQ(got.status, 200) << got.body;
  ASSERT_EQ(text.status, 200) << text.body;
  EXPECT_EQ(got.j()["tokens"], text.j()["tokens"]);
  flash.stop();
  EXPECT_NE(flash.stderr_text().find("baton serve: chat prompts from the built-in template deepseek-v4-0731, which "
                                     "the model file's metadata selects\n"),
            std::string::npos)
      << flash.stderr_text();

  ServeProcess preview({"-m", deepseek4_tiny(dir, "DeepSeek-V4-Flash-tiny"), "--model-id", "ds4"});
  const Response family = post(preview.port(), "/tokenize", json{{"messages", messages}, {"reasoning_effort", "max"}});
  const Response family_text =
      post(preview.port(), "/tokenize", json{{"content", bos + "<｜User｜>Hi<｜Assistant｜><think>"}});
  ASSERT_EQ(family.status, 200) << family.body;
  EXPECT_EQ(family.j()["tokens"], family_text.j()["tokens"]);
  preview.stop();
  EXPECT_EQ(preview.stderr_text().find("deepseek-v4-0731"), std::string::npos) << preview.stderr_text();
}

}  // namespace
}  // namespace baton
