// POST /tokenize and /detokenize, as llama-server and vLLM answer them (one
// body shape serves the clients of both):
//   /tokenize   {"content" | "prompt": TEXT, "add_special" | "add_special_tokens", "with_pieces"}
//               or {"messages": [...], "tools"} (the chat prompt /v1/chat/completions renders)
//            -> {"tokens": [ids, or {"id", "piece"} with_pieces], "count", "max_model_len"}
//   /detokenize {"tokens": [ids]} -> {"content": TEXT, "prompt": TEXT}
// "model" is optional; when given it must be the served model's id. Special
// tokens in the text are parsed as such (llama-server's behaviour); BOS is
// added by default for "prompt" (vLLM's add_special_tokens) and not for
// "content" (llama-server's add_special).
#pragma once

#include <string>
#include <string_view>

#include "chat/prompt.h"
#include "coordinator/api/generation.h"

namespace baton {

class JinjaTemplate;

// The response bodies; throw ApiError for a bad request.
std::string tokenize_response(std::string_view body, const ModelInfo& model, const JinjaTemplate* chat_template,
                              const RenderBudget& budget = {});
std::string detokenize_response(std::string_view body, const ModelInfo& model);

}  // namespace baton
