// What the Jinja suites share (test_chat_jinja, test_chat_jinja_hostile).
#pragma once

#include <string>

#include "chat/jinja/ast.h"
#include "chat/jinja/template.h"

namespace baton::test {

// The TemplateError's text when `source` does not load, else "".
inline std::string template_load_error(const std::string& source) {
  try {
    JinjaTemplate::parse(source);
  } catch (const jinja::TemplateError& e) {
    return e.what();
  }
  return "";
}

}  // namespace baton::test
