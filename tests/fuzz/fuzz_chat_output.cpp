// libFuzzer target for ChatOutputParser: model output is whatever the model
// samples, so any bytes in any chunking must parse without a crash, and the
// chunked result must equal the whole one (content, reasoning, every call's
// name and arguments); a difference aborts.
//
// Input: byte 0 picks the tool format and the reasoning markers, byte 1
// seeds where the text is cut (and, its top bit, whether the XML formats'
// parameters are typed), the rest is the output text.
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "chat/output/arguments.h"
#include "chat/output/parser.h"

using namespace baton;

namespace {

ChatOutput parse(const ChatOutputFormat& f, const std::string& text, uint8_t seed) {
  ChatOutputParser p(f);
  if (seed == 0) {
    p.push(text);
  } else {
    std::minstd_rand rng(seed);
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 8;
      p.push(std::string_view(text).substr(i, n));
      i += n;
    }
  }
  p.finish();
  return p.output();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const ToolCallFormat kTools[] = {ToolCallFormat::none, ToolCallFormat::deepseek_dsml,
                                          ToolCallFormat::llama3_json, ToolCallFormat::hermes,
                                          ToolCallFormat::mistral, ToolCallFormat::qwen3_coder,
                                          ToolCallFormat::glm};
  ChatOutputFormat f;
  f.tools = kTools[(data[0] & 0x0F) % 7];
  if (data[1] & 0x80) {
    // Every typing path: a string (streamed), a number, mixed types; other names take any JSON.
    f.argument_types["f"] = {{"a", kArgString}, {"b", kArgInteger | kArgNumber}, {"c", kArgString | kArgNull}};
  }
  if (data[0] & 0x10) {
    f.reasoning_start = (data[0] & 0x40) ? "[THINK]" : "<think>";
    f.reasoning_end = (data[0] & 0x40) ? "[/THINK]" : "</think>";
    f.reasoning_open = data[0] & 0x20;
  }
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  const ChatOutput whole = parse(f, text, 0);
  const ChatOutput cut = parse(f, text, data[1] | 1);
  if (whole.content != cut.content || whole.reasoning != cut.reasoning ||
      whole.tool_calls.size() != cut.tool_calls.size()) {
    std::abort();
  }
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    if (whole.tool_calls[i].name != cut.tool_calls[i].name ||
        whole.tool_calls[i].arguments != cut.tool_calls[i].arguments) {
      std::abort();
    }
  }
  return 0;
}
