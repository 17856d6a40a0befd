// The grammar of a forced tool call (tool_choice "required" or a named
// function): exactly one call of one of the given functions, written in the
// model's own tool-call syntax (chat/output/parser.h's ToolCallFormat), with
// arguments that validate against the function's parameters schema.
// docs/GRAMMAR.md gives the text each format produces.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output/parser.h"
#include "chat/tools.h"
#include "engine/sampling/grammar.h"

namespace baton {

// A tool's parameters (tools.h) that are null or {} take any object.
// Throws SchemaError (engine/sampling/json_schema.h) for a parameters schema
// it cannot follow, std::invalid_argument for no tools or format none.
// With `reasoning_end` (the prompt opened a reasoning block), the call comes
// after free reasoning text that ends at the first reasoning_end, and up to
// two newlines.
std::shared_ptr<const Grammar> tool_call_grammar(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                                 std::string_view reasoning_end = {});

// The grammar a request's tool choice asks for, for both chat APIs: one
// call of the allowed tools when the choice is "required" (Anthropic "any")
// or names one, else null (the model decides). A model whose output format
// has no tool-call syntax is left to decide too; a prompt that opened a
// reasoning block keeps it free until its end. Throws SchemaError.
std::shared_ptr<const Grammar> forced_tool_call_grammar(const ChatTools& tools, const ChatOutputFormat& output);

}  // namespace baton
