// What the Jinja suites share (test_engine_jinja, test_engine_jinja_hostile).
#pragma once

#include <string>

#include "engine/jinja_ast.h"
#include "engine/jinja_template.h"

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
