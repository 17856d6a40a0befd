#include "gguf_split/convert_tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int32_t kNormal = int32_t(TokenType::Normal), kUnknown = int32_t(TokenType::Unknown),
                  kControl = int32_t(TokenType::Control), kUserDefined = int32_t(TokenType::UserDefined),
                  kUnused = int32_t(TokenType::Unused), kByte = int32_t(TokenType::Byte);

std::string placeholder(GgufWriter& w, int64_t n_vocab) {
  if (n_vocab < 3) throw std::runtime_error("config.json: field 'vocab_size' must be at least 3 (unk, bos, eos)");
  std::vector<GgufValue> tokens, scores, types;
  auto add = [&](std::string text, int32_t type) {
    tokens.push_back(GgufValue::of_str(std::move(text)));
    scores.push_back(GgufValue::of_f32(0.0f));
    types.push_back(GgufValue::of_i32(type));
  };
  add("<unk>", kUnknown);
  add("<s>", kControl);
  add("</s>", kControl);
  for (int b = 0; b < 256 && int64_t(tokens.size()) < n_vocab; ++b) add(fmt::format("<0x{:02X}>", b), kByte);
  while (int64_t(tokens.size()) < n_vocab) add(fmt::format("<unused_{}>", tokens.size()), kUnused);
  w.set("tokenizer.ggml.model", GgufValue::of_str("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::of_array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::of_array(GgufType::FLOAT32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::of_array(GgufType::INT32, std::move(types)));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::of_u32(0));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(2));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(true));
  return fmt::format("placeholder SentencePiece vocabulary of {} tokens (<unk>, <s>, </s>, byte tokens)", n_vocab);
}

// True when the tokenizer.json splits text into GPT-2 byte-alphabet symbols.
bool is_byte_level(const json& tok) {
  auto has = [](const json& node, auto&& self) -> bool {
    if (!node.is_object()) return false;
    if (node.value("type", "") == "ByteLevel") return true;
    for (const char* list : {"pretokenizers", "decoders"}) {
      if (auto it = node.find(list); it != node.end() && it->is_array()) {
        for (const json& child : *it) {
          if (self(child, self)) return true;
        }
      }
    }
    return false;
  };
  return has(tok.value("pre_tokenizer", json()), has) || has(tok.value("decoder", json()), has);
}

std::string convert_bpe(GgufWriter& w, const json& tok, const VocabSource& src, const std::string& path) {
  auto bad = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  const json& model = tok["model"];
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw bad("model.vocab is not an object");
  std::vector<std::optional<std::string>> text(size_t(src.n_vocab));
  std::vector<int32_t> type(size_t(src.n_vocab), kUnused);
  auto place = [&](const std::string& t, const json& id_json, int32_t ty) {
    if (!id_json.is_number_integer()) throw bad("the id of token '" + t + "' is not an integer");
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= src.n_vocab) {
      throw bad(fmt::format("token '{}' has id {}, outside config.json's vocab_size {}", t, id, src.n_vocab));
    }
    text[size_t(id)] = t;
    type[size_t(id)] = ty;
  };
  for (const auto& [t, id] : model["vocab"].items()) place(t, id, kNormal);
  if (auto it = tok.find("added_tokens"); it != tok.end() && it->is_array()) {
    for (const json& a : *it) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id")) {
        throw bad("an added_tokens entry lacks content or id");
      }
      place(a["content"].get<std::string>(), a["id"], a.value("special", false) ? kControl : kUserDefined);
    }
  }
  std::vector<GgufValue> tokens, types, merges;
  for (size_t i = 0; i < text.size(); ++i) {
    // Ids the tokenizer does not use (the embedding is often padded) get
    // unique unused names, as llama.cpp's converter writes them.
    tokens.push_back(GgufValue::of_str(text[i] ? *text[i] : fmt::format("[PAD{}]", i)));
    types.push_back(GgufValue::of_i32(type[i]));
  }
  if (!model.contains("merges") || !model["merges"].is_array()) throw bad("model.merges is not an array");
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      merges.push_back(GgufValue::of_str(m.get<std::string>()));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(GgufValue::of_str(m[0].get<std::string>() + " " + m[1].get<std::string>()));
    } else {
      throw bad("a model.merges entry is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  const size_t n_merges = merges.size();
  const std::string pre = src.arch == "qwen2" || src.arch == "qwen3" ? "qwen2" : src.arch == "deepseek4" ? "deepseek-v3" : "llama-bpe";
  w.set("tokenizer.ggml.model", GgufValue::of_str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::of_str(pre));
  w.set("tokenizer.ggml.tokens", GgufValue::of_array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.token_type", GgufValue::of_array(GgufType::INT32, std::move(types)));
  w.set("tokenizer.ggml.merges", GgufValue::of_array(GgufType::STRING, std::move(merges)));
  if (src.bos >= 0 && src.bos < src.n_vocab) w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(uint32_t(src.bos)));
  if (src.eos >= 0 && src.eos < src.n_vocab) w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(uint32_t(src.eos)));
  return fmt::format("byte-level BPE from tokenizer.json: {} tokens, {} merges, pre-tokenizer {}", src.n_vocab,
                     n_merges, pre);
}

}  // namespace

std::string write_vocabulary(GgufWriter& w, const VocabSource& src, const std::function<void(const std::string&)>& note) {
  const fs::path dir(src.dir);
  const fs::path tj = dir / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(tj, ec)) {
    std::ifstream in(tj);
    if (!in) throw std::runtime_error("cannot read " + tj.string());
    json tok;
    try {
      tok = json::parse(in);
    } catch (const json::exception& e) {
      throw std::runtime_error(tj.string() + ": does not parse: " + e.what());
    }
    const bool bpe = tok.is_object() && tok.contains("model") && tok["model"].is_object() &&
                     tok["model"].value("type", "") == "BPE";
    if (bpe && is_byte_level(tok) && !tok["model"].value("byte_fallback", false)) {
      return convert_bpe(w, tok, src, tj.string());
    }
    note("tokenizer.json is not a byte-level BPE tokenizer (the only kind converted yet); the file holds a "
         "placeholder vocabulary: token ids work, text in and out does not");
  } else if (fs::exists(dir / "tokenizer.model", ec)) {
    note("tokenizer.model (SentencePiece) is not converted yet; the file holds a placeholder vocabulary: token ids "
         "work, text in and out does not");
  }
  return placeholder(w, src.n_vocab);
}

}  // namespace baton
