#include "coordinator/api/tokenize_api.h"

#include <fmt/format.h>

#include "coordinator/api/openai_request.h"
#include "coordinator/api/request_json.h"
#include "engine/text/tokenizer.h"

namespace baton {

using json = nlohmann::json;
using namespace request_json;

namespace {

void check_model_if_given(const json& body, const ModelInfo& model) {
  if (field(body, "model")) check_model(body, model);
}

}  // namespace

std::string tokenize_response(std::string_view text, const ModelInfo& model, const JinjaTemplate* chat_template,
                              const RenderBudget& budget) {
  const json body = parse_body(text, model.n_ctx);
  check_model_if_given(body, model);
  const Tokenizer& tok = *model.tokenizer;
  std::vector<int32_t> tokens;
  if (field(body, "messages")) {
    // The chat route's own parser renders it, so the count is the prompt's.
    json chat = {{"model", model.id}, {"messages", body["messages"]}};
    for (const char* key : {"tools", "tool_choice", "chat_template_kwargs", "reasoning_effort"}) {
      if (const json* v = field(body, key)) chat[key] = *v;
    }
    tokens = parse_chat_request(chat.dump(), model, chat_template, budget).gen.prompt;
  } else {
    const bool vllm = field(body, "prompt") != nullptr;
    const char* key = vllm ? "prompt" : "content";
    const json* t = field(body, key);
    if (!t) throw invalid("You must provide 'content' (or 'prompt', or 'messages').", "content",
                          "missing_required_parameter");
    if (!t->is_string()) throw wrong_type(key, "a string", *t);
    check_text_fits(t->get_ref<const std::string&>().size(), model, key);
    const bool add_special = field(body, "add_special") ? bool_param(body, "add_special", false)
                                                        : bool_param(body, "add_special_tokens", vllm);
    tokens = tok.encode(t->get<std::string>(), add_special, /*parse_special=*/true);
  }
  json out_tokens = json::array();
  if (bool_param(body, "with_pieces", false)) {
    for (int32_t id : tokens) {
      out_tokens.push_back({{"id", id}, {"piece", tok.token_to_piece(id)}});
    }
  } else {
    out_tokens = tokens;
  }
  return dump_json({{"tokens", std::move(out_tokens)}, {"count", tokens.size()}, {"max_model_len", model.n_ctx}});
}

std::string detokenize_response(std::string_view text, const ModelInfo& model) {
  const json body = parse_body(text, model.n_ctx);
  check_model_if_given(body, model);
  const json* t = field(body, "tokens");
  if (!t) throw invalid("You must provide 'tokens'.", "tokens", "missing_required_parameter");
  if (!t->is_array()) throw wrong_type("tokens", "an array of token ids", *t);
  std::vector<int32_t> ids;
  for (const json& v : *t) {
    if (!v.is_number_integer()) throw wrong_type("tokens", "an array of token ids", v);
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= model.n_vocab) {
      throw invalid(fmt::format("Token id {} is outside the vocabulary [0, {}).", id, model.n_vocab), "tokens");
    }
    ids.push_back(int32_t(id));
  }
  const std::string content = model.tokenizer->decode(ids);
  return dump_json({{"content", content}, {"prompt", content}});
}

}  // namespace baton
