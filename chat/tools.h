// What a chat request asks about tools, in one form for both chat APIs: each
// parses its own fields (OpenAI: tools, tool_choice, parallel_tool_calls)
// into ChatTools. The template gets the tools to render; grammar-constrained
// sampling reads the choice to force a call.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace baton {

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // a JSON Schema object
};

struct ToolChoice {
  enum class Mode {
    automatic,  // the model decides (OpenAI "auto", the default when tools are given)
    none,       // no call: the template gets no tools and the output is not parsed for calls
    required,   // at least one call (OpenAI "required", Anthropic "any")
    named,      // a call of `name`
  };
  Mode mode = Mode::automatic;
  std::string name;  // with Mode::named
};

struct ChatTools {
  std::vector<ToolSpec> tools;
  ToolChoice choice;
  bool parallel = true;  // more than one call allowed (OpenAI parallel_tool_calls)
  // The template gets the tools and the output is parsed for calls.
  bool active() const { return !tools.empty() && choice.mode != ToolChoice::Mode::none; }
};

}  // namespace baton
