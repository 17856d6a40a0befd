// The built-in chat templates (chat/templates/builtin.h) as
// --chat-template NAME reaches them (load_chat_template): each published one
// is the fixture file's exact text and renders a conversation as that file
// does; ChatML and Llama 2, kept as no file, render as chat/family.h's
// renderers (golden-tested against Jinja2 in test_chat_template). A file
// path still loads the file; an unknown name is refused with the list.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/family.h"
#include "chat/jinja_prompt.h"
#include "chat/templates/builtin.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using ojson = nlohmann::ordered_json;

// The fixture file each published built-in was copied from.
const std::map<std::string, std::string> kFiles = {
    {"llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja"},
    {"mistral", "mistralai-Mistral-Nemo-Instruct-2407.jinja"},
    {"qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"},
    {"deepseek-v3.1", "deepseek-ai-DeepSeek-V3.1.jinja"},
    {"deepseek-v4", "deepseek-ai-DeepSeek-V4.jinja"},
};
// The family renderer of the built-ins kept as no file.
const std::map<std::string, ChatFamily> kFamilies = {{"chatml", ChatFamily::ChatML}, {"llama2", ChatFamily::Llama2}};

const std::vector<ChatMessage> kTwoTurns = {
    {"system", "You are terse."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "What is 2+2?"}};

ChatTemplateInput input(const std::vector<ChatMessage>& msgs) {
  ChatTemplateInput in;
  for (const ChatMessage& m : msgs) in.messages.push_back({{"role", m.role}, {"content", m.content}});
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  return in;
}

std::string file_text(const std::string& path) {
  const std::vector<uint8_t> bytes = test::read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

constexpr std::time_t kNow = 1767225600;  // 2026-01-01: Llama 3.1 writes the date

TEST(BuiltinTemplates, EveryNameRendersAsItsSource) {
  ASSERT_EQ(builtin_chat_template_names(),
            "chatml, llama2, llama3, mistral, qwen2.5, deepseek-v3.1, deepseek-v4, deepseek-v4-0731");
  for (const BuiltinChatTemplate& b : builtin_chat_templates()) {
    const std::string name(b.name);
    SCOPED_TRACE(name);
    // Baton's own rendering of a published encoder: test_chat_deepseek_v4_0731.
    if (name == "deepseek-v4-0731") continue;
    const ChatTemplateSource loaded = load_chat_template(name);
    ASSERT_TRUE(loaded.tmpl);
    EXPECT_EQ(loaded.description, "the built-in template " + name + " (" + std::string(b.source) + ")");
    for (const auto& msgs : {kTwoTurns, std::vector<ChatMessage>(kTwoTurns.begin() + 1, kTwoTurns.end())}) {
      const std::string rendered = render_chat(*loaded.tmpl, input(msgs), kNow);
      if (const auto f = kFiles.find(name); f != kFiles.end()) {
        const std::string path = test::shared_dir() + "/chat_templates/" + f->second;
        EXPECT_EQ(b.text, file_text(path)) << "the built-in is not the published text";
        EXPECT_EQ(rendered, render_chat(*load_chat_template_file(path), input(msgs), kNow));
      } else {
        const ChatFamily family = kFamilies.at(name);
        EXPECT_EQ(rendered, render_chat(family, msgs, ChatOptions{}, family == ChatFamily::Llama2 ? "<s>" : ""));
      }
      EXPECT_NE(rendered.find("What is 2+2?"), std::string::npos) << rendered;
      EXPECT_NE(rendered.find("Hello."), std::string::npos) << rendered;
    }
  }
  // Qwen 2.5's template gives a conversation without a system message its
  // default one; ChatML gives none.
  const std::vector<ChatMessage> no_system(kTwoTurns.begin() + 1, kTwoTurns.end());
  EXPECT_EQ(render_chat(*load_chat_template("qwen2.5").tmpl, input(no_system), kNow)
                .rfind("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                       "<|im_end|>\n<|im_start|>user\nHi!",
                       0),
            0u);
  EXPECT_EQ(render_chat(*load_chat_template("chatml").tmpl, input(no_system), kNow).rfind("<|im_start|>user\nHi!", 0),
            0u);
}

TEST(BuiltinTemplates, AFileStaysAFileAndAnUnknownNameIsRefused) {
  test::TempDir dir;
  // A file wins even where its name is a built-in's.
  const std::string path = dir.file("chatml");
  std::ofstream(path) << "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}";
  const ChatTemplateSource file = load_chat_template(path);
  EXPECT_EQ(file.description, "the file " + path);
  EXPECT_EQ(render_chat(*file.tmpl, input(kTwoTurns), kNow),
            "[system]You are terse.[user]Hi![assistant]Hello.[user]What is 2+2?");
  EXPECT_NO_THROW(check_chat_template_choice(path));

  for (const std::string& bad : std::vector<std::string>{"chatml2", "Llama3", "", dir.file("missing.jinja")}) {
    SCOPED_TRACE(bad);
    try {
      load_chat_template(bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "--chat-template '" + bad +
                                           "' is neither a file nor a built-in template; the built-in ones are "
                                           "chatml, llama2, llama3, mistral, qwen2.5, deepseek-v3.1, deepseek-v4, "
                                           "deepseek-v4-0731");
    }
    EXPECT_THROW(check_chat_template_choice(bad), std::invalid_argument);
  }
}

}  // namespace
}  // namespace baton
