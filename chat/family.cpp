// Chat template detection and rendering (see family.h and
// docs/CHAT_TEMPLATES.md for the layouts and where each one comes from).
#include "chat/family.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"

namespace baton {
namespace {

// DeepSeek markers use U+FF5C (fullwidth vertical bar) and U+2581 (lower one
// eighth block, SentencePiece's space), not ASCII.
constexpr std::string_view kDsEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kDsUser = "<｜User｜>";
constexpr std::string_view kDsAssistant = "<｜Assistant｜>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

// Python's str.strip() / Jinja's trim, restricted to ASCII whitespace.
std::string_view strip(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Text after the first (or last) "</think>": what the DeepSeek templates keep
// of an earlier assistant turn whose content still carries its reasoning.
std::string_view after_think(std::string_view s, bool last) {
  const size_t p = last ? s.rfind(kThinkClose) : s.find(kThinkClose);
  return p == std::string_view::npos ? s : s.substr(p + kThinkClose.size());
}

void check_roles(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw std::invalid_argument("chat: the conversation has no messages");
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      throw std::invalid_argument("chat: unknown role '" + m.role +
                                  "' (expected system, user or assistant)");
    }
  }
}

// Meta's Llama-2 chat template: only the first message may be the system
// prompt, folded into the first user turn; then strict user/assistant
// alternation. Every user turn starts with BOS and every assistant turn ends
// with "</s>" (the Llama-2 EOS text). The template has no generation-prompt
// switch: " [/INST]" after a user turn is where the answer starts.
std::string render_llama2(const std::vector<ChatMessage>& msgs, const std::string& bos) {
  size_t first = 0;
  std::string system;
  bool has_system = false;
  if (msgs[0].role == "system") {
    system = msgs[0].content;
    has_system = true;
    first = 1;
  }
  auto user_turn = [&](std::string_view content) {
    return bos + "[INST] " + std::string(strip(content)) + " [/INST]";
  };
  auto with_system = [&](const std::string& content) {
    return "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
  };
  if (first == msgs.size()) return user_turn(with_system(""));  // system prompt alone

  std::string out;
  for (size_t k = first; k < msgs.size(); ++k) {
    const ChatMessage& m = msgs[k];
    const bool want_user = (k - first) % 2 == 0;
    if (m.role == "system") {
      throw std::invalid_argument("chat (llama2): a system message may only come first");
    }
    if ((m.role == "user") != want_user) {
      throw std::invalid_argument(
          "chat (llama2): roles must alternate user/assistant/user/... (message " +
          std::to_string(k) + " is '" + m.role + "')");
    }
    const std::string content = (k == first && has_system) ? with_system(m.content) : m.content;
    if (m.role == "user") {
      out += user_turn(content);
    } else {
      out += " ";
      out += strip(content);
      out += " </s>";
    }
  }
  return out;
}

// Meta's Llama-3 template: BOS once, every message as a header block with its
// content trimmed.
std::string render_llama3(const std::vector<ChatMessage>& msgs, const ChatOptions& opt,
                          const std::string& bos) {
  std::string out = bos;
  for (const ChatMessage& m : msgs) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    out += strip(m.content);
    out += "<|eot_id|>";
  }
  if (opt.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Plain ChatML: no BOS, no default system prompt, content verbatim.
std::string render_chatml(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// DeepSeek V3 / R1: all system messages joined by a blank line right after
// BOS; every assistant turn opens with <｜Assistant｜> and keeps only the text
// after the last "</think>" (R1's rule; V3 content has none).
std::string render_deepseek3(const std::vector<ChatMessage>& msgs, const ChatOptions& opt,
                             const std::string& bos) {
  std::string system;
  bool first_system = true;
  for (const ChatMessage& m : msgs) {
    if (m.role != "system") continue;
    if (!first_system) system += "\n\n";
    system += m.content;
    first_system = false;
  }
  std::string out = bos + system;
  for (const ChatMessage& m : msgs) {
    if (m.role == "user") {
      out += kDsUser;
      out += m.content;
    } else if (m.role == "assistant") {
      out += kDsAssistant;
      out += after_think(m.content, /*last=*/true);
      out += kDsEos;
    }
  }
  if (opt.add_generation_prompt) out += kDsAssistant;
  return out;
}

// DeepSeek V4 encoder (also the V3.1 / V3.2 layout): system text in place;
// <｜Assistant｜> plus a thinking token follows a user turn only when an
// assistant turn or the generation prompt comes next. The thinking token is
// "</think>" (reasoning closed) except after the last user turn in thinking
// mode, where it is "<think>". Earlier turns lose their reasoning.
std::string render_deepseek4(const std::vector<ChatMessage>& msgs, const ChatOptions& opt,
                             const std::string& bos) {
  size_t last_user = msgs.size();  // none
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (msgs[i].role == "user") last_user = i;
  }
  const bool has_user = last_user < msgs.size();
  std::string out = bos;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      out += m.content;
    } else if (m.role == "user") {
      out += kDsUser;
      out += m.content;
      const bool last = i + 1 == msgs.size();
      const bool next_is_assistant = !last && msgs[i + 1].role == "assistant";
      if (next_is_assistant || (last && opt.add_generation_prompt)) {
        out += kDsAssistant;
        out += (opt.thinking && i == last_user) ? kThinkOpen : kThinkClose;
      }
    } else {
      // After the last user turn in thinking mode the turn carries its
      // reasoning: "reasoning</think>answer". A content without "</think>"
      // gets an empty reasoning block.
      if (opt.thinking && has_user && i > last_user) {
        if (!contains(m.content, kThinkClose)) out += kThinkClose;
        out += m.content;
      } else {
        out += after_think(m.content, /*last=*/false);
      }
      out += kDsEos;
    }
  }
  return out;
}

// Phi-3 / Phi-3.5: BOS (the Phi-3 template starts with it), then one block
// per message. The oldest Phi-3 template drops system messages; later ones
// render them as <|system|> blocks, which is what this does.
std::string render_phi3(const std::vector<ChatMessage>& msgs, const ChatOptions& opt,
                        const std::string& bos) {
  std::string out = bos;
  for (const ChatMessage& m : msgs) {
    out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  }
  if (opt.add_generation_prompt) out += "<|assistant|>\n";
  return out;
}

// Baton's fallback for models without a recognised template.
std::string render_plain(const std::vector<ChatMessage>& msgs, const ChatOptions& opt,
                         const std::string& bos) {
  std::string out = bos;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") out += "System: ";
    else if (m.role == "user") out += "User: ";
    else out += "Assistant: ";
    out += m.content;
    out += "\n";
  }
  // No trailing space: the tokenizers attach a word's leading space to the word.
  if (opt.add_generation_prompt) out += "Assistant:";
  return out;
}

std::optional<ChatFamily> family_from_template(std::string_view t, std::string_view arch) {
  if (t.empty()) return std::nullopt;
  if (contains(t, kDsUser)) {
    // V3.1 and later close the reasoning right after <｜Assistant｜>; V3 and R1
    // do not. A deepseek4 file is V4 whatever template it was given.
    const bool hybrid = contains(t, std::string(kDsAssistant) + std::string(kThinkClose));
    return (hybrid || arch == "deepseek4") ? ChatFamily::DeepSeekV4 : ChatFamily::DeepSeekV3;
  }
  if (contains(t, "<|start_header_id|>")) return ChatFamily::Llama3;
  // Phi-4 wraps roles as <|im_start|>role<|im_sep|>: not ChatML, not supported.
  if (contains(t, "<|im_sep|>")) return ChatFamily::Plain;
  if (contains(t, "<|im_start|>")) return ChatFamily::ChatML;
  if (contains(t, "<|user|>") && contains(t, "<|end|>")) return ChatFamily::Phi3;
  if (contains(t, "[INST]")) return ChatFamily::Llama2;
  return std::nullopt;
}

std::optional<ChatFamily> family_from_arch(std::string_view arch) {
  if (arch == "deepseek4") return ChatFamily::DeepSeekV4;
  if (arch.starts_with("qwen")) return ChatFamily::ChatML;
  if (arch == "phi3") return ChatFamily::Phi3;
  return std::nullopt;
}

// Vocabulary markers: each family needs all of its texts as single tokens.
struct VocabRule {
  ChatFamily family;
  std::vector<std::string_view> tokens;
};
const std::vector<VocabRule>& vocab_rules() {
  static const std::vector<VocabRule> rules = {
      {ChatFamily::Llama3, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}},
      {ChatFamily::ChatML, {"<|im_start|>", "<|im_end|>"}},
      {ChatFamily::DeepSeekV3, {kDsUser, kDsAssistant}},
      {ChatFamily::Phi3, {"<|user|>", "<|assistant|>", "<|end|>"}},
  };
  return rules;
}

}  // namespace

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::Llama2: return "llama2";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::DeepSeekV3: return "deepseek3";
    case ChatFamily::DeepSeekV4: return "deepseek4";
    case ChatFamily::Phi3: return "phi3";
    case ChatFamily::Plain: return "plain";
  }
  return "unknown";
}

std::optional<ChatFamily> chat_family_from_name(std::string_view name) {
  for (ChatFamily f : {ChatFamily::Llama2, ChatFamily::Llama3, ChatFamily::ChatML,
                       ChatFamily::DeepSeekV3, ChatFamily::DeepSeekV4, ChatFamily::Phi3,
                       ChatFamily::Plain}) {
    if (name == chat_family_name(f)) return f;
  }
  return std::nullopt;
}

ChatFamily detect_chat_family(std::string_view template_text, std::string_view architecture,
                              const std::function<bool(std::string_view)>& has_token) {
  if (auto f = family_from_template(template_text, architecture)) return *f;
  if (auto f = family_from_arch(architecture)) return *f;
  if (has_token) {
    for (const VocabRule& r : vocab_rules()) {
      if (std::all_of(r.tokens.begin(), r.tokens.end(), has_token)) return r.family;
    }
  }
  return ChatFamily::Plain;
}

ChatFamily detect_chat_family(const GgufFile& f) {
  std::string tmpl;
  if (const GgufValue* v = f.find("tokenizer.chat_template"); v && v->type == GgufType::STRING) {
    tmpl = v->str;
  }
  std::string arch;
  if (const GgufValue* v = f.find("general.architecture"); v && v->type == GgufType::STRING) {
    arch = v->str;
  }
  // One pass over the vocabulary collecting the marker texts it holds.
  std::set<std::string, std::less<>> present;
  if (const GgufValue* v = f.find("tokenizer.ggml.tokens"); v && v->type == GgufType::ARRAY) {
    std::set<std::string_view> wanted;
    for (const VocabRule& r : vocab_rules()) wanted.insert(r.tokens.begin(), r.tokens.end());
    for (const GgufValue& item : v->items) {
      if (item.type == GgufType::STRING && wanted.count(item.str)) present.insert(item.str);
    }
  }
  return detect_chat_family(tmpl, arch,
                            [&](std::string_view t) { return present.find(t) != present.end(); });
}

std::string render_chat(ChatFamily family, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options, const std::string& bos_text) {
  check_roles(messages);
  switch (family) {
    case ChatFamily::Llama2: return render_llama2(messages, bos_text);
    case ChatFamily::Llama3: return render_llama3(messages, options, bos_text);
    case ChatFamily::ChatML: return render_chatml(messages, options);
    case ChatFamily::DeepSeekV3: return render_deepseek3(messages, options, bos_text);
    case ChatFamily::DeepSeekV4: return render_deepseek4(messages, options, bos_text);
    case ChatFamily::Phi3: return render_phi3(messages, options, bos_text);
    case ChatFamily::Plain: return render_plain(messages, options, bos_text);
  }
  throw std::invalid_argument("chat: unknown template family");
}

std::vector<std::string> chat_stop_strings(ChatFamily f) {
  switch (f) {
    case ChatFamily::Llama2: return {"</s>"};
    case ChatFamily::Llama3: return {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"};
    case ChatFamily::ChatML: return {"<|im_end|>", "<|endoftext|>"};
    case ChatFamily::DeepSeekV3:
    case ChatFamily::DeepSeekV4: return {std::string(kDsEos)};
    case ChatFamily::Phi3: return {"<|end|>", "<|endoftext|>"};
    case ChatFamily::Plain: return {"\nUser:", "\nSystem:"};
  }
  return {};
}

std::vector<int32_t> chat_stop_tokens(ChatFamily f, const Tokenizer& tok) {
  const std::vector<std::string> stops = chat_stop_strings(f);
  std::vector<int32_t> ids;
  if (tok.eos() >= 0) ids.push_back(tok.eos());
  // A linear scan: done once per model, and Tokenizer offers no text lookup.
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const std::string& text = tok.token_text(id);
    if (std::find(stops.begin(), stops.end(), text) != stops.end()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::string chat_bos_text(const Tokenizer& tok) {
  return tok.bos() >= 0 ? tok.token_text(tok.bos()) : std::string();
}

}  // namespace baton
