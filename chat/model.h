// What the chat room needs to know about the served model: its tokenizer,
// its context, its chat template or family, and how a turn ends. The API's
// ModelInfo (coordinator/api/generation.h) is a ChatModel with the serving
// fields added, so the API hands its model to the chat room as it is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat/family.h"

namespace baton {

class JinjaTemplate;
class Tokenizer;

struct ChatModel {
  std::string arch;      // general.architecture
  int64_t n_ctx = 0;     // tokens per sequence: prompt + completion
  std::shared_ptr<const Tokenizer> tokenizer;
  // Bytes of the longest token piece: a text longer than n_ctx times this
  // cannot fit, and is refused before it is tokenized (0: unknown).
  int64_t max_token_bytes = 0;
  ChatFamily chat_family = ChatFamily::Plain;
  // The model's own chat template (GGUF tokenizer.chat_template) when the
  // Jinja engine runs it, else the built-in its metadata selects
  // (chat_template_builtin names it; chat/jinja_prompt.h,
  // model_chat_template): chat prompts are rendered with it, and chat_family
  // only gives the end-of-turn tokens. Null when there is neither (the
  // file's own may have been refused: chat_template_refused says why);
  // chat_family renders then.
  std::shared_ptr<const JinjaTemplate> chat_template;
  std::string chat_template_refused;
  std::string chat_template_builtin;  // "" unless chat_template is a built-in
  std::vector<int32_t> chat_stop_tokens;       // the family's end-of-turn ids (EOS included)
  std::vector<std::string> chat_stop_strings;  // Plain family: text that ends a turn
};

}  // namespace baton
