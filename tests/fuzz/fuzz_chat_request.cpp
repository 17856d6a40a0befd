// libFuzzer target for chat requests through real chat templates: the input
// bytes choose a stock template (shared/chat_templates) and build a
// conversation in the shapes clients send (any roles; content absent, null,
// empty, text or parts; tool calls with arguments as text, as an object, bad
// or absent, several of them; tool results; reasoning; tools offered or
// not; tool_choice), which goes through parse_chat_request as a body. Every
// request must give a prompt or an ApiError (a 4xx/5xx answer); anything else
// (another exception, a crash, a sanitizer report, a hang) is a bug. An
// assistant turn with tool_calls and no content key once read freed memory.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/api/openai_request.h"
#include "chat/jinja_prompt.h"
#include "chat/family.h"
#include "engine/gguf/file.h"
#include "chat/jinja/template.h"
#include "engine/text/tokenizer.h"

using namespace baton;
using json = nlohmann::ordered_json;

namespace {

struct Fixture {
  ModelInfo model;
  std::vector<std::shared_ptr<const JinjaTemplate>> templates;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    const std::string shared = BATON_SHARED_DIR;
    GgufFile g = GgufFile::open(shared + "/models/stories260K.gguf");
    x.model.id = "m";
    x.model.n_ctx = 4096;
    x.model.n_vocab = 512;
    x.model.tokenizer = Tokenizer::from_gguf(g);
    x.model.chat_family = detect_chat_family(g);
    x.model.chat_stop_tokens = chat_stop_tokens(x.model.chat_family, *x.model.tokenizer);
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(shared + "/chat_templates")) {
      if (e.path().extension() == ".jinja") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& p : files) {
      try {
        x.templates.push_back(load_chat_template_file(p.string()));
      } catch (const std::exception&) {
        // A template the engine refuses is not this target's subject.
      }
    }
    if (x.templates.empty()) std::abort();
    return x;
  }();
  return f;
}

std::string text(FuzzedDataProvider& in) {
  static const char* kWords[] = {"", "Hi", "Weather in Zürich?", "<|im_end|>", "{\"a\": 1}", "</think>", "\n"};
  if (in.ConsumeBool()) return kWords[in.ConsumeIntegralInRange<size_t>(0, std::size(kWords) - 1)];
  return in.ConsumeRandomLengthString(64);
}

json content(FuzzedDataProvider& in, bool& present) {
  present = true;
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0: present = false; return nullptr;
    case 1: return nullptr;
    case 2: return "";
    case 3: return text(in);
    case 4: {
      json parts = json::array();
      for (int n = in.ConsumeIntegralInRange(0, 3); n > 0; --n) {
        parts.push_back(in.ConsumeBool() ? json{{"type", "text"}, {"text", text(in)}}
                                         : json{{"type", "image_url"}, {"image_url", {{"url", "x"}}}});
      }
      return parts;
    }
    default: return in.ConsumeIntegral<int>();
  }
}

json tool_call(FuzzedDataProvider& in, int i) {
  json fn = json::object();
  if (in.ConsumeIntegralInRange(0, 9) != 0) fn["name"] = in.ConsumeBool() ? "get_weather" : text(in);
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0: break;  // no arguments
    case 1: fn["arguments"] = "{\"city\": \"Paris\", \"days\": 2}"; break;
    case 2: fn["arguments"] = json{{"city", "Paris"}, {"nested", {{"a", json::array({1, 2})}}}}; break;
    case 3: fn["arguments"] = text(in); break;
    default: fn["arguments"] = nullptr; break;
  }
  json call = json::object();
  if (in.ConsumeBool()) call["id"] = "call_" + std::to_string(i);
  if (in.ConsumeBool()) call["type"] = "function";
  call["function"] = in.ConsumeIntegralInRange(0, 9) == 0 ? json(text(in)) : fn;
  return call;
}

json message(FuzzedDataProvider& in, int index) {
  static const char* kRoles[] = {"user", "assistant", "system", "tool", "developer", "function", "ipython"};
  json m = json::object();
  const std::string role = kRoles[in.ConsumeIntegralInRange<size_t>(0, std::size(kRoles) - 1)];
  const bool calls_first = in.ConsumeBool();
  auto add_calls = [&] {
    if (role != "assistant" || !in.ConsumeBool()) return;
    json calls = json::array();
    for (int n = in.ConsumeIntegralInRange(0, 3); n >= 0; --n) calls.push_back(tool_call(in, index * 4 + n));
    m["tool_calls"] = in.ConsumeIntegralInRange(0, 9) == 0 ? json(nullptr) : calls;
  };
  if (calls_first) add_calls();
  m["role"] = role;
  bool present = false;
  json c = content(in, present);
  if (present) m["content"] = std::move(c);
  if (!calls_first) add_calls();
  if (role == "tool" && in.ConsumeBool()) m["tool_call_id"] = "call_" + std::to_string(in.ConsumeIntegral<uint8_t>() % 8);
  if (role == "tool" && in.ConsumeBool()) m["name"] = "get_weather";
  if (role == "assistant" && in.ConsumeBool()) m["reasoning_content"] = text(in);
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = fixture();
  FuzzedDataProvider in(data, size);
  const auto& tmpl = f.templates[in.ConsumeIntegralInRange<size_t>(0, f.templates.size() - 1)];
  json body = {{"model", "m"}, {"max_tokens", 2}};
  json messages = json::array();
  for (int n = in.ConsumeIntegralInRange(1, 8), i = 0; i < n; ++i) messages.push_back(message(in, i));
  body["messages"] = std::move(messages);
  if (in.ConsumeBool()) {
    body["tools"] = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"description", "Weather."},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties", {{"city", {{"type", "string"}}}}},
                                      {"required", {"city"}}}}}}}});
    static const char* kChoices[] = {"auto", "none", "required"};
    if (in.ConsumeBool()) body["tool_choice"] = kChoices[in.ConsumeIntegralInRange(0, 2)];
  }
  if (in.ConsumeBool()) body["chat_template_kwargs"] = {{"enable_thinking", in.ConsumeBool()}};
  try {
    parse_chat_request(body.dump(-1, ' ', false, json::error_handler_t::replace), f.model, tmpl.get());
  } catch (const ApiError&) {
  } catch (...) {
    std::abort();
  }
  return 0;
}
