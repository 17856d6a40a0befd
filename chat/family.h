// Chat template families: turning chat messages into a prompt string for
// models whose GGUF carries no Jinja template (`tokenizer.chat_template`) that
// Baton's Jinja engine runs (jinja_prompt.h renders those). It recognises the
// common template families from distinctive markers in the template text, then
// from the architecture and the vocabulary, renders them with its own code,
// and falls back to a documented plain format. The family also gives the
// end-of-turn tokens when the model's own template renders.
// docs/CHAT_TEMPLATES.md gives every family's exact layout and its source.
//
// Contract with the tokenizer: render_chat returns the whole prompt, BOS
// included where the model's template puts it, so encode the result with
// add_special = false and parse_special = true (the markers are special
// tokens). Pass bos_text = "" to leave BOS out of the text.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

class GgufFile;
class Tokenizer;

// role is "system", "user" or "assistant"; any other role is refused.
struct ChatMessage {
  std::string role;
  std::string content;
};

enum class ChatFamily {
  Llama2,      // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s>
  Llama3,      // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  ChatML,      // <|im_start|>role\n...<|im_end|>\n (Qwen 2/2.5/3, many fine-tunes)
  DeepSeekV3,  // <｜begin▁of▁sentence｜>system<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
  DeepSeekV4,  // same markers, with </think> / <think> after <｜Assistant｜> (V3.1, V3.2, V4)
  Phi3,        // <|user|>\n...<|end|>\n<|assistant|>\n
  Plain,       // "System: ...\nUser: ...\nAssistant:" for models without a known template
};

struct ChatOptions {
  // End the prompt with the opening of an assistant turn.
  bool add_generation_prompt = true;
  // DeepSeekV4 only: open a reasoning block (<think>) instead of closing it.
  bool thinking = false;
};

// Stable lower-case names: llama2, llama3, chatml, deepseek3, deepseek4, phi3, plain.
const char* chat_family_name(ChatFamily f);
// Inverse of chat_family_name (for a user override); nullopt for an unknown name.
std::optional<ChatFamily> chat_family_from_name(std::string_view name);

// Detection from the template text (may be empty: no template), the
// `general.architecture` value, and optionally a vocabulary probe that says
// whether a token with exactly this text exists. Order: template markers, then
// architecture, then vocabulary markers, then Plain.
ChatFamily detect_chat_family(std::string_view template_text, std::string_view architecture,
                              const std::function<bool(std::string_view)>& has_token = {});
// Same, from the file's `tokenizer.chat_template`, `general.architecture` and
// `tokenizer.ggml.tokens` (each optional; a non-string template is ignored).
ChatFamily detect_chat_family(const GgufFile& f);

// Renders the conversation. Throws std::invalid_argument for an empty
// conversation, an unknown role, or (Llama2) a conversation the Llama-2
// template refuses: a system message after the first, or user/assistant turns
// that do not alternate starting with the user.
std::string render_chat(ChatFamily family, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options, const std::string& bos_text);

// Texts that end the assistant's turn. For the templated families these are
// special tokens (chat_stop_tokens finds their ids); Plain's are ordinary text
// that the caller must look for in the decoded output.
std::vector<std::string> chat_stop_strings(ChatFamily f);
// Ids of the family's stop strings that are single vocabulary entries, plus
// the tokenizer's EOS when it has one; sorted and unique.
std::vector<int32_t> chat_stop_tokens(ChatFamily f, const Tokenizer& tok);
// The BOS token's text ("<s>", "<|begin_of_text|>"...), or "" without a BOS.
std::string chat_bos_text(const Tokenizer& tok);

}  // namespace baton
