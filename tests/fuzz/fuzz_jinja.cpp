// libFuzzer target for the Jinja engine: chat templates come from GGUF files,
// so any bytes must either load and render, or be refused with
// jinja::TemplateError / jinja::RenderError; anything else (another
// exception, a crash, a sanitizer report, a hang) is a bug. The seeds are the
// published templates of shared/chat_templates and small versions of the
// hostile shapes of docs/RELIABILITY.md (tests/fuzz/corpus/fuzz_jinja/).
//
// Input: the template source, rendered for one conversation with a tool call,
// a tool result and tools, under small limits (chat/jinja/limits.h) so that no
// input runs near libFuzzer's timeout or memory limit: what a template may
// do within them is bounded by the same code as with the server's.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "chat/jinja/ast.h"
#include "chat/jinja/template.h"

using namespace baton;

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Zürich?"},
      {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
      {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "{\"temp\": 19}"},
      {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": true
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  JinjaTemplate t;
  try {
    t = JinjaTemplate::parse(source);
  } catch (const jinja::TemplateError&) {
    return 0;
  } catch (...) {
    std::abort();
  }
  jinja::RenderLimits limits;
  limits.max_steps = 20'000;
  limits.max_work = uint64_t(1) << 26;
  limits.max_bytes = size_t(16) << 20;
  limits.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  try {
    t.render(context(), 1768473000, limits);
  } catch (const jinja::RenderError&) {
  } catch (...) {
    std::abort();
  }
  return 0;
}
