#include "coordinator/api/generation.h"

#include "engine/model/arch.h"
#include "chat/jinja_prompt.h"
#include "chat/family.h"
#include "engine/gguf/file.h"
#include "engine/model/part_info.h"
#include "engine/sampling/sampler.h"
#include "engine/runtime/stage.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <cmath>
#include <limits>

namespace baton {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "error";
}

TextAssembler::TextAssembler(std::vector<std::string> stop) {
  for (auto& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

std::string TextAssembler::push(std::string_view piece) {
  if (stopped_) return {};
  held_.append(piece);
  size_t first = std::string::npos;
  for (const auto& s : stop_) {
    const size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    std::string out = sanitize_utf8(std::string_view(held_).substr(0, first));
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string: a
  // match starting before it would already have been found complete.
  size_t safe = held_.size();
  for (const auto& s : stop_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > 0; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        safe = std::min(safe, held_.size() - k);
        break;
      }
    }
  }
  safe -= utf8_incomplete_tail(std::string_view(held_).substr(0, safe));
  std::string out = sanitize_utf8(std::string_view(held_).substr(0, safe));
  held_.erase(0, safe);
  return out;
}

std::string TextAssembler::flush() {
  std::string out = sanitize_utf8(held_);
  held_.clear();
  return out;
}

void compute_logprobs(const float* logits, int64_t n_vocab, int32_t chosen, int top_n, GeneratedToken& out) {
  std::vector<TokenLogprobEntry> top;
  out.logprob = token_logprobs(std::span<const float>(logits, size_t(n_vocab)), chosen, top_n, &top);
  out.top.clear();
  for (const TokenLogprobEntry& t : top) out.top.push_back({t.id, t.logprob, {}});
}

void validate_request(GenerationRequest& request, const ModelInfo& info) {
  const int64_t n_prompt = int64_t(request.prompt.size());
  if (n_prompt == 0) throw std::invalid_argument("the prompt is empty");
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= info.n_vocab) {
      throw std::invalid_argument(fmt::format("prompt token id {} is outside the vocabulary [0, {})", t, info.n_vocab));
    }
  }
  if (request.max_tokens < 1) throw std::invalid_argument("max_tokens must be at least 1");
  if (n_prompt + request.max_tokens > info.n_ctx) {
    throw std::invalid_argument(fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceeds the context of {} tokens",
                                            n_prompt, request.max_tokens, info.n_ctx));
  }
  if (request.top_logprobs > kMaxTopLogprobs) {
    throw std::invalid_argument(fmt::format("top_logprobs is at most {}", kMaxTopLogprobs));
  }
  for (const auto& [id, bias] : request.logit_bias) {
    if (id < 0 || id >= info.n_vocab) {
      throw std::invalid_argument(fmt::format("logit_bias token id {} is outside the vocabulary", id));
    }
  }
  std::sort(request.stop_tokens.begin(), request.stop_tokens.end());
  std::sort(request.show_tokens.begin(), request.show_tokens.end());
}

namespace {

// A token's bytes in the output: its piece, or its text for a control token
// the request shows.
std::string output_piece(const GenerationRequest& req, const Tokenizer& tok, int32_t id) {
  std::string piece = tok.token_to_piece(id);
  if (piece.empty() && std::binary_search(req.show_tokens.begin(), req.show_tokens.end(), id)) {
    piece = tok.token_text(id);
  }
  return piece;
}

bool is_end_token(const GenerationRequest& req, const Tokenizer& tok, int32_t id) {
  return (!req.ignore_eos && tok.is_eog(id)) || std::binary_search(req.stop_tokens.begin(), req.stop_tokens.end(), id);
}

}  // namespace

std::optional<FinishReason> accept_token(const GenerationRequest& req, const Tokenizer& tok, int32_t id,
                                         float logprob, const std::vector<std::pair<int32_t, float>>& top,
                                         bool context_full, TextAssembler& text, Usage& usage, GenerationEvent& ev,
                                         GrammarMatcher* grammar) {
  if (is_end_token(req, tok, id)) return FinishReason::stop;
  ++usage.completion_tokens;
  GeneratedToken& g = ev.tokens.emplace_back();
  g.id = id;
  g.piece = output_piece(req, tok, id);
  if (req.top_logprobs >= 0) {
    g.logprob = logprob;
    for (const auto& [alt, lp] : top) g.top.push_back({alt, lp, tok.token_to_piece(alt)});
  }
  ev.text = text.push(g.piece);
  if (text.stopped()) return FinishReason::stop;
  // The mask let only accepted tokens through, so advance cannot fail here.
  if (grammar && grammar->advance(g.piece) && grammar->finished()) return FinishReason::stop;
  if (usage.completion_tokens >= req.max_tokens || context_full) return FinishReason::length;
  return std::nullopt;
}

bool grammar_allowed_tokens(GrammarMatcher& grammar, const GenerationRequest& req, const ModelInfo& info,
                            std::vector<uint64_t>& bits) {
  grammar.fill_mask(*info.vocab_trie, bits);
  // Control tokens the output shows as text (chat markup such as Mistral's
  // [TOOL_CALLS]) are in no trie: the model may write the markup with them.
  for (int32_t t : req.show_tokens) {
    if (t >= 0 && t < info.n_vocab && grammar.accepts(info.tokenizer->token_text(t))) {
      bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    }
  }
  if (grammar.accepting()) {
    auto allow = [&](int32_t t) {
      if (t >= 0 && t < info.n_vocab) bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    };
    if (!req.ignore_eos) {
      for (int32_t t : info.eog_tokens) allow(t);
    }
    for (int32_t t : req.stop_tokens) allow(t);
  }
  for (uint64_t w : bits) {
    if (w) return true;
  }
  return false;
}

size_t grammar_draft_prefix(const GrammarMatcher& grammar, const GenerationRequest& req, const ModelInfo& info,
                            std::span<const int32_t> guesses, std::vector<uint64_t>& bits) {
  GrammarMatcher g = grammar;  // the request's own advances only as tokens are sampled
  size_t n = 0;
  for (const int32_t id : guesses) {
    if (!grammar_allowed_tokens(g, req, info, bits) || !(bits[size_t(id) >> 6] >> (id & 63) & 1)) break;
    ++n;
    if (is_end_token(req, *info.tokenizer, id) || (g.advance(output_piece(req, *info.tokenizer, id)) && g.finished())) {
      break;
    }
  }
  return n;
}

std::vector<int32_t> end_tokens(const GenerationRequest& req, const ModelInfo& info) {
  std::vector<int32_t> out = req.stop_tokens;
  if (!req.ignore_eos) out.insert(out.end(), info.eog_tokens.begin(), info.eog_tokens.end());
  return out;
}

Sampler make_sampler(const GenerationRequest& req, const ModelInfo& info) {
  Sampler s(req.sampling, int32_t(info.n_vocab));
  if (req.sampling.penalizes()) {
    s.set_prompt(req.prompt);
    s.set_end_tokens(end_tokens(req, info));
  }
  return s;
}

ModelInfo model_info_from_gguf(const GgufFile& f, const std::string& path, const std::string& id, int64_t n_ctx) {
  std::shared_ptr<Tokenizer> tok = Tokenizer::from_gguf(f);
  auto arch = Arch::from_gguf(f);
  ModelInfo info;
  info.path = path;
  // The file name, a split part's without its part suffix: general.name is
  // often the architecture or a converter's folder ("llama" in the fixture).
  info.id = id.empty() ? split_source_stem(std::filesystem::path(path).stem().string()) : id;
  info.arch = f.get_str("general.architecture", "");
  info.n_vocab = tok->n_vocab();
  info.created = int64_t(std::time(nullptr));
  info.chat_family = detect_chat_family(f);
  ModelChatTemplate chat_template = model_chat_template(f);
  info.chat_template = std::move(chat_template.tmpl);
  info.chat_template_refused = std::move(chat_template.refused);
  info.chat_template_builtin = std::move(chat_template.builtin);
  info.chat_stop_tokens = chat_stop_tokens(info.chat_family, *tok);
  if (info.chat_family == ChatFamily::Plain) info.chat_stop_strings = chat_stop_strings(info.chat_family);
  for (int32_t t = 0; t < tok->n_vocab(); ++t) {
    info.max_token_bytes = std::max<int64_t>(info.max_token_bytes, int64_t(tok->token_to_piece(t).size()));
  }
  for (int32_t t = 0; t < tok->n_vocab(); ++t) {
    if (tok->is_eog(t)) info.eog_tokens.push_back(t);
  }
  info.vocab_trie = std::make_shared<const VocabTrie>(*tok);
  info.tokenizer = std::move(tok);
  info.n_ctx = n_ctx > 0 ? n_ctx : std::min<int64_t>(arch->dims().n_ctx_train, StageConfig::kDefaultMaxCtx);
  info.n_ctx_train = arch->dims().n_ctx_train;
  if (arch->dims().n_vocab != info.n_vocab) {
    throw std::runtime_error(fmt::format("the vocabulary has {} tokens but the model's output has {}", info.n_vocab,
                                         arch->dims().n_vocab));
  }
  return info;
}

void close_event(GenerationEvent& ev, FinishReason reason, const std::string& error, TextAssembler& text,
                 const Usage& usage) {
  if (reason == FinishReason::cancelled || reason == FinishReason::error) {
    ev.text.clear();
  } else {
    ev.text += text.flush();
  }
  if (reason == FinishReason::stop && text.stopped()) ev.stop_string = text.matched();
  ev.finish = reason;
  ev.error = error;
  ev.usage = usage;
}

bool deliver_event(const EventSink& sink, GenerationEvent&& ev, const std::string& request_id) {
  try {
    sink(std::move(ev));
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton serve: request %s: event sink failed: %s\n", request_id.c_str(), e.what());
    return false;
  }
}

}  // namespace baton
