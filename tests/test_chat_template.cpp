// Chat templates: golden renderings per family (the expected strings were
// produced by rendering the published Jinja templates with Jinja2 on the same
// conversation), DeepSeek thinking modes, properties over seeded random
// conversations, detection from template texts and from the fixture files,
// and the rendered prompts through the real tokenizers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/family.h"
#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"
#include "tests/test_util.h"

namespace baton {
namespace {

const std::string kDsBos = "<｜begin▁of▁sentence｜>";
const std::string kDsEos = "<｜end▁of▁sentence｜>";

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi!"},
    {"assistant", "Hello."},
    {"user", "What is 2+2?"},
};

const std::vector<ChatFamily> kAllFamilies = {
    ChatFamily::Llama2,     ChatFamily::Llama3, ChatFamily::ChatML, ChatFamily::DeepSeekV3,
    ChatFamily::DeepSeekV4, ChatFamily::Phi3,   ChatFamily::Plain};

std::string render(ChatFamily f, const std::vector<ChatMessage>& m, bool gen = true,
                   bool thinking = false, const std::string& bos = "") {
  ChatOptions o;
  o.add_generation_prompt = gen;
  o.thinking = thinking;
  return render_chat(f, m, o, bos);
}

// ---- golden renderings ----------------------------------------------------

TEST(ChatTemplate, Llama2Golden) {
  EXPECT_EQ(render(ChatFamily::Llama2, kConversation, true, false, "<s>"),
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
            "<s>[INST] What is 2+2? [/INST]");
  // The template has no generation-prompt switch: " [/INST]" is the prompt.
  EXPECT_EQ(render(ChatFamily::Llama2, kConversation, false, false, "<s>"),
            render(ChatFamily::Llama2, kConversation, true, false, "<s>"));
  // Without a system prompt; contents are stripped like Python's str.strip().
  EXPECT_EQ(render(ChatFamily::Llama2, {{"user", "  a \n"}, {"assistant", "\tb "}, {"user", "c"}},
                   true, false, "<s>"),
            "<s>[INST] a [/INST] b </s><s>[INST] c [/INST]");
  // The system block is stripped together with the first user turn: only the
  // user text's trailing whitespace goes.
  EXPECT_EQ(render(ChatFamily::Llama2, {{"system", "S"}, {"user", "  u  "}}, true, false, "<s>"),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n  u [/INST]");
  // A system prompt alone becomes a first user turn with nothing after it.
  EXPECT_EQ(render(ChatFamily::Llama2, {{"system", "S"}}, true, false, "<s>"),
            "<s>[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
}

TEST(ChatTemplate, Llama2RefusesWhatItsTemplateRefuses) {
  EXPECT_THROW(render(ChatFamily::Llama2, {{"assistant", "a"}}), std::invalid_argument);
  EXPECT_THROW(render(ChatFamily::Llama2, {{"user", "a"}, {"user", "b"}}), std::invalid_argument);
  EXPECT_THROW(render(ChatFamily::Llama2, {{"user", "a"}, {"system", "s"}}),
               std::invalid_argument);
  EXPECT_THROW(render(ChatFamily::Llama2, {{"system", "s"}, {"system", "t"}, {"user", "u"}}),
               std::invalid_argument);
  // The other families render such conversations as they are.
  EXPECT_NO_THROW(render(ChatFamily::Llama3, {{"user", "a"}, {"user", "b"}}));
}

TEST(ChatTemplate, Llama3Golden) {
  EXPECT_EQ(render(ChatFamily::Llama3, kConversation, true, false, "<|begin_of_text|>"),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Contents are trimmed (Jinja `| trim`).
  EXPECT_EQ(render(ChatFamily::Llama3, {{"user", " \n x y \t"}}, false, false, "<B>"),
            "<B><|start_header_id|>user<|end_header_id|>\n\nx y<|eot_id|>");
}

TEST(ChatTemplate, ChatMLGolden) {
  // ChatML has no BOS: the bos text is not used.
  EXPECT_EQ(render(ChatFamily::ChatML, kConversation, true, false, "<s>"),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Content is verbatim, whitespace included.
  EXPECT_EQ(render(ChatFamily::ChatML, {{"user", " a\n"}}, false),
            "<|im_start|>user\n a\n<|im_end|>\n");
}

TEST(ChatTemplate, DeepSeekV3Golden) {
  EXPECT_EQ(render(ChatFamily::DeepSeekV3, kConversation, true, false, kDsBos),
            kDsBos + "You are terse.<｜User｜>Hi!<｜Assistant｜>Hello." + kDsEos +
                "<｜User｜>What is 2+2?<｜Assistant｜>");
  EXPECT_EQ(render(ChatFamily::DeepSeekV3, kConversation, false, false, kDsBos),
            kDsBos + "You are terse.<｜User｜>Hi!<｜Assistant｜>Hello." + kDsEos +
                "<｜User｜>What is 2+2?");
  // All system messages, wherever they are, join with a blank line after BOS;
  // an earlier turn keeps only what follows its last "</think>" (R1's rule).
  EXPECT_EQ(render(ChatFamily::DeepSeekV3,
                   {{"system", "A"},
                    {"user", "u"},
                    {"assistant", "r1</think>r2</think>answer"},
                    {"system", "B"},
                    {"user", "v"}},
                   true, false, "<bos>"),
            "<bos>A\n\nB<｜User｜>u<｜Assistant｜>answer" + kDsEos + "<｜User｜>v<｜Assistant｜>");
}

TEST(ChatTemplate, DeepSeekV4ThinkingOffAndOn) {
  // Both match the published DeepSeek V3.1 template rendered with thinking
  // false / true, and the V4 encoder in "chat" / "thinking" mode.
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, kConversation, true, false, kDsBos),
            kDsBos + "You are terse.<｜User｜>Hi!<｜Assistant｜></think>Hello." + kDsEos +
                "<｜User｜>What is 2+2?<｜Assistant｜></think>");
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, kConversation, true, true, kDsBos),
            kDsBos + "You are terse.<｜User｜>Hi!<｜Assistant｜></think>Hello." + kDsEos +
                "<｜User｜>What is 2+2?<｜Assistant｜><think>");
  // No generation prompt: the prompt ends with the last user text.
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, kConversation, false, true, kDsBos),
            kDsBos + "You are terse.<｜User｜>Hi!<｜Assistant｜></think>Hello." + kDsEos +
                "<｜User｜>What is 2+2?");
}

TEST(ChatTemplate, DeepSeekV4TurnsAndReasoning) {
  // Earlier turns lose their reasoning (the text up to the first "</think>").
  const std::vector<ChatMessage> history = {
      {"user", "u"}, {"assistant", "thought</think>answer"}, {"user", "v"}};
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, history, true, true, "<bos>"),
            "<bos><｜User｜>u<｜Assistant｜></think>answer" + kDsEos +
                "<｜User｜>v<｜Assistant｜><think>");
  // In thinking mode, a turn after the last user message keeps its reasoning;
  // without one it gets an empty reasoning block.
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, {{"user", "u"}, {"assistant", "why</think>so"}}, true,
                   true),
            "<｜User｜>u<｜Assistant｜><think>why</think>so" + kDsEos);
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, {{"user", "u"}, {"assistant", "so"}}, true, true),
            "<｜User｜>u<｜Assistant｜><think></think>so" + kDsEos);
  // In chat mode it is an ordinary closed turn.
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, {{"user", "u"}, {"assistant", "why</think>so"}}, true,
                   false),
            "<｜User｜>u<｜Assistant｜></think>so" + kDsEos);
  // System text stays where it is (unlike V3) and consecutive user turns get
  // no assistant marker between them.
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, {{"system", "A"}, {"user", "u"}, {"system", "B"},
                                             {"user", "v"}}),
            "A<｜User｜>uB<｜User｜>v<｜Assistant｜></think>");
  // No generation prompt unless a user turn comes last.
  EXPECT_EQ(render(ChatFamily::DeepSeekV4, {{"system", "A"}}), "A");
}

TEST(ChatTemplate, Phi3Golden) {
  EXPECT_EQ(render(ChatFamily::Phi3, kConversation, true, false, "<s>"),
            "<s><|system|>\nYou are terse.<|end|>\n"
            "<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n");
  // Without a system message this is exactly what the template stored in
  // ggml-vocab-phi-3.gguf renders (it drops system messages).
  const std::vector<ChatMessage> no_system(kConversation.begin() + 1, kConversation.end());
  EXPECT_EQ(render(ChatFamily::Phi3, no_system, true, false, "<s>"),
            "<s><|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplate, PlainGolden) {
  EXPECT_EQ(render(ChatFamily::Plain, kConversation, true, false, "<s>"),
            "<s>System: You are terse.\nUser: Hi!\nAssistant: Hello.\nUser: What is 2+2?\n"
            "Assistant:");
  EXPECT_EQ(render(ChatFamily::Plain, {{"user", "x"}}, false), "User: x\n");
}

TEST(ChatTemplate, RefusesEmptyConversationsAndUnknownRoles) {
  for (ChatFamily f : kAllFamilies) {
    SCOPED_TRACE(chat_family_name(f));
    EXPECT_THROW(render(f, {}), std::invalid_argument);
    EXPECT_THROW(render(f, {{"tool", "{}"}}), std::invalid_argument);
    EXPECT_THROW(render(f, {{"user", "a"}, {"User", "b"}}), std::invalid_argument);
  }
}

TEST(ChatTemplate, NamesRoundTrip) {
  std::set<std::string> names;
  for (ChatFamily f : kAllFamilies) {
    names.insert(chat_family_name(f));
    EXPECT_EQ(chat_family_from_name(chat_family_name(f)), f);
  }
  EXPECT_EQ(names.size(), kAllFamilies.size());
  EXPECT_EQ(chat_family_from_name("llama-3"), std::nullopt);
  EXPECT_EQ(chat_family_from_name(""), std::nullopt);
}

// ---- properties over seeded random conversations --------------------------

// Words of letters, digits and punctuation (no whitespace at either end, no
// markers), so that every family keeps the content verbatim.
std::string random_text(std::mt19937_64& rng) {
  static const std::string chars =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'-+*/()";
  std::string s;
  const int words = 1 + static_cast<int>(rng() % 6);
  for (int w = 0; w < words; ++w) {
    if (w) s += (rng() % 5 == 0) ? "\n" : " ";
    const int len = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < len; ++i) s += chars[rng() % chars.size()];
  }
  return s;
}

// Optional leading system message, then alternating user/assistant turns
// ending with a user turn.
std::vector<ChatMessage> random_conversation(std::mt19937_64& rng) {
  std::vector<ChatMessage> m;
  if (rng() % 2) m.push_back({"system", random_text(rng)});
  const int turns = 1 + static_cast<int>(rng() % 4);
  for (int t = 0; t < turns; ++t) {
    if (t) m.push_back({"assistant", random_text(rng)});
    m.push_back({"user", random_text(rng)});
  }
  return m;
}

TEST(ChatTemplate, RandomConversationProperties) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    const std::vector<ChatMessage> conv = random_conversation(rng);
    for (ChatFamily f : kAllFamilies) {
      SCOPED_TRACE(std::string(chat_family_name(f)) + " iteration " + std::to_string(iter));
      const std::string with_gen = render(f, conv, true, false, "<B>");
      const std::string without = render(f, conv, false, false, "<B>");
      // Every message's content appears, in order.
      size_t pos = 0;
      for (const ChatMessage& m : conv) {
        const size_t at = with_gen.find(m.content, pos);
        ASSERT_NE(at, std::string::npos) << "missing: " << m.content;
        pos = at + m.content.size();
      }
      // The generation prompt is a pure suffix.
      ASSERT_EQ(with_gen.compare(0, without.size(), without), 0);
      if (f != ChatFamily::Llama2) {
        ASSERT_GT(with_gen.size(), without.size());
      }
      // Appending turns only appends text (what makes prompt caching work):
      // each shorter conversation renders to a prefix of the longer one.
      // (Thinking mode is exempt by design: earlier turns drop reasoning.)
      for (size_t n = 1; n < conv.size(); ++n) {
        if (conv[n - 1].role == "system" && f == ChatFamily::Llama2) continue;
        const std::vector<ChatMessage> head(conv.begin(), conv.begin() + n);
        const std::string part = render(f, head, false, false, "<B>");
        ASSERT_EQ(without.compare(0, part.size(), part), 0) << "prefix of " << n;
      }
    }
  }
}

// ---- detection ------------------------------------------------------------

TEST(ChatTemplate, DetectFromTemplateText) {
  const std::string llama3 =
      "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' %}";
  const std::string chatml = "{{'<|im_start|>' + message['role'] + '\n'}}";
  const std::string ds3 = "{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>'}}";
  const std::string ds31 = "{{'<｜User｜>' + c}}{%- if ns.is_last_user -%}{{'<｜Assistant｜></think>'}}";
  const std::string phi3 = "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n'}}";
  const std::string llama2 = "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}";
  const std::string phi4 = "{{'<|im_start|>' + message['role'] + '<|im_sep|>'}}";
  const std::string zephyr = "{{ '<|user|>\n' + message['content'] + eos_token }}";

  EXPECT_EQ(detect_chat_family(llama3, "llama"), ChatFamily::Llama3);
  EXPECT_EQ(detect_chat_family(chatml, "qwen2"), ChatFamily::ChatML);
  EXPECT_EQ(detect_chat_family(chatml, "llama"), ChatFamily::ChatML);  // template wins
  EXPECT_EQ(detect_chat_family(ds3, "deepseek2"), ChatFamily::DeepSeekV3);
  EXPECT_EQ(detect_chat_family(ds31, "deepseek2"), ChatFamily::DeepSeekV4);
  EXPECT_EQ(detect_chat_family(ds3, "deepseek4"), ChatFamily::DeepSeekV4);
  EXPECT_EQ(detect_chat_family(phi3, "phi3"), ChatFamily::Phi3);
  EXPECT_EQ(detect_chat_family(llama2, "llama"), ChatFamily::Llama2);
  EXPECT_EQ(detect_chat_family(phi4, "phi3"), ChatFamily::Plain);
  // An unknown template falls back to the architecture, then Plain.
  EXPECT_EQ(detect_chat_family(zephyr, "llama"), ChatFamily::Plain);
  EXPECT_EQ(detect_chat_family("{{ messages }}", "qwen3"), ChatFamily::ChatML);
}

TEST(ChatTemplate, DetectFromArchitectureAndVocabulary) {
  EXPECT_EQ(detect_chat_family("", "deepseek4"), ChatFamily::DeepSeekV4);
  EXPECT_EQ(detect_chat_family("", "qwen2"), ChatFamily::ChatML);
  EXPECT_EQ(detect_chat_family("", "qwen3moe"), ChatFamily::ChatML);
  EXPECT_EQ(detect_chat_family("", "phi3"), ChatFamily::Phi3);
  EXPECT_EQ(detect_chat_family("", "llama"), ChatFamily::Plain);
  EXPECT_EQ(detect_chat_family("", ""), ChatFamily::Plain);

  auto vocab = [](std::set<std::string> tokens) {
    return [tokens = std::move(tokens)](std::string_view t) {
      return tokens.count(std::string(t)) != 0;
    };
  };
  EXPECT_EQ(detect_chat_family("", "llama",
                               vocab({"<|begin_of_text|>", "<|start_header_id|>",
                                      "<|end_header_id|>", "<|eot_id|>"})),
            ChatFamily::Llama3);
  EXPECT_EQ(detect_chat_family("", "deepseek2", vocab({"<｜User｜>", "<｜Assistant｜>"})),
            ChatFamily::DeepSeekV3);
  EXPECT_EQ(detect_chat_family("", "mistral", vocab({"<|im_start|>", "<|im_end|>"})),
            ChatFamily::ChatML);
  // One marker alone is not enough.
  EXPECT_EQ(detect_chat_family("", "llama", vocab({"<|start_header_id|>"})), ChatFamily::Plain);
  EXPECT_EQ(detect_chat_family("", "llama", vocab({"<s>", "</s>"})), ChatFamily::Plain);
}

TEST(ChatTemplate, DetectFromFixtureFiles) {
  const std::map<std::string, ChatFamily> expected = {
      // Has a Phi-3 template (<|user|> ... <|end|>).
      {"vocab/ggml-vocab-phi-3.gguf", ChatFamily::Phi3},
      // No template, and no chat markers in the vocabulary: Plain.
      {"stories260K.gguf", ChatFamily::Plain},
      {"llama-2-tiny-random.gguf", ChatFamily::Plain},
      {"vocab/ggml-vocab-llama-spm.gguf", ChatFamily::Plain},
      {"vocab/ggml-vocab-deepseek-coder.gguf", ChatFamily::Plain},
      {"vocab/ggml-vocab-gpt-2.gguf", ChatFamily::Plain},
      {"vocab/ggml-vocab-falcon.gguf", ChatFamily::Plain},
      {"vocab/ggml-vocab-starcoder.gguf", ChatFamily::Plain},
      {"vocab/ggml-vocab-bert-bge.gguf", ChatFamily::Plain},
  };
  for (const auto& [file, family] : expected) {
    SCOPED_TRACE(file);
    const GgufFile f = GgufFile::open(test::model_path(file));
    EXPECT_EQ(chat_family_name(detect_chat_family(f)), std::string(chat_family_name(family)));
  }
}

// ---- through the real tokenizers -----------------------------------------

std::vector<int32_t> special_ids(const std::vector<int32_t>& ids, int32_t from) {
  std::vector<int32_t> out;
  for (int32_t id : ids) {
    if (id >= from || id <= 2) out.push_back(id);
  }
  return out;
}

TEST(ChatTemplate, Phi3PromptTokenizesToItsMarkers) {
  const GgufFile f = GgufFile::open(test::model_path("vocab/ggml-vocab-phi-3.gguf"));
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(f);
  ASSERT_EQ(chat_bos_text(*tok), "<s>");
  const std::string prompt =
      render_chat(detect_chat_family(f), kConversation, ChatOptions{}, chat_bos_text(*tok));
  const std::vector<int32_t> ids = tok->encode(prompt, false, true);
  // <s>=1, <|system|>=32006, <|end|>=32007, <|user|>=32010, <|assistant|>=32001.
  EXPECT_EQ(special_ids(ids, 32000),
            (std::vector<int32_t>{1, 32006, 32007, 32010, 32007, 32001, 32007, 32010, 32007,
                                  32001}));
  // The turn ends at <|end|>, or at EOS (<|endoftext|> = 32000).
  EXPECT_EQ(chat_stop_tokens(ChatFamily::Phi3, *tok), (std::vector<int32_t>{32000, 32007}));
}

TEST(ChatTemplate, Llama2PromptTokenizesToBosAndEos) {
  const GgufFile f = GgufFile::open(test::model_path("vocab/ggml-vocab-llama-spm.gguf"));
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(f);
  const std::string prompt =
      render_chat(ChatFamily::Llama2, kConversation, ChatOptions{}, chat_bos_text(*tok));
  const std::vector<int32_t> ids = tok->encode(prompt, false, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 2);  // one BOS per user turn
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);  // one EOS after the answer
  EXPECT_EQ(chat_stop_tokens(ChatFamily::Llama2, *tok), std::vector<int32_t>{2});
  // The text between the markers survives tokenization.
  const std::string text = tok->decode(ids);
  EXPECT_NE(text.find("[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello."),
            std::string::npos)
      << text;
}

TEST(ChatTemplate, StopStringsAndTokens) {
  EXPECT_EQ(chat_stop_strings(ChatFamily::Llama3).front(), "<|eot_id|>");
  EXPECT_EQ(chat_stop_strings(ChatFamily::ChatML).front(), "<|im_end|>");
  EXPECT_EQ(chat_stop_strings(ChatFamily::DeepSeekV3), std::vector<std::string>{kDsEos});
  EXPECT_EQ(chat_stop_strings(ChatFamily::DeepSeekV4), std::vector<std::string>{kDsEos});
  for (ChatFamily f : kAllFamilies) EXPECT_FALSE(chat_stop_strings(f).empty());

  // A made-up ChatML vocabulary: the markers are found by text, EOS is added.
  TokenizerVocab v;
  v.model = "gpt2";
  v.tokens = {"a", "b", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "ab"};
  v.merges = {"a b"};
  v.types = {TokenType::Normal,  TokenType::Normal,  TokenType::Control,
             TokenType::Control, TokenType::Control, TokenType::Normal};
  v.eos = 2;
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_vocab(v);
  EXPECT_EQ(chat_stop_tokens(ChatFamily::ChatML, *tok), (std::vector<int32_t>{2, 4}));
  // Plain's stops are text: only EOS is a token.
  EXPECT_EQ(chat_stop_tokens(ChatFamily::Plain, *tok), std::vector<int32_t>{2});
  EXPECT_EQ(chat_bos_text(*tok), "");

  const GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  const std::unique_ptr<Tokenizer> stories = Tokenizer::from_gguf(f);
  EXPECT_EQ(chat_stop_tokens(detect_chat_family(f), *stories), std::vector<int32_t>{2});
}

}  // namespace
}  // namespace baton
