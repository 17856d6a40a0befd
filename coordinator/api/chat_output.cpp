#include "coordinator/api/chat_output.h"

#include <utility>

namespace baton {

ChatOutputParser::ChatOutputParser(ChatOutputFormat format) : format_(std::move(format)) {}

ChatOutputDelta ChatOutputParser::push(std::string_view text) {
  ChatOutputDelta d;
  d.content.assign(text);
  record(d);
  return d;
}

ChatOutputDelta ChatOutputParser::finish() { return {}; }

void ChatOutputParser::record(const ChatOutputDelta& d) {
  output_.content += d.content;
  output_.reasoning += d.reasoning;
  for (const auto& t : d.tool_calls) {
    if (t.index >= static_cast<int>(output_.tool_calls.size())) output_.tool_calls.resize(t.index + 1);
    ToolCall& call = output_.tool_calls[t.index];
    if (!t.id.empty()) call.id = t.id;
    if (!t.name.empty()) call.name = t.name;
    call.arguments += t.arguments;
  }
}

}  // namespace baton
