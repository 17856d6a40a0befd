#include "chat/jinja/template.h"

#include "chat/jinja/ast.h"
#include "chat/jinja/render.h"

namespace baton {

JinjaTemplate JinjaTemplate::parse(const std::string& source) {
  JinjaTemplate t;
  try {
    t.program_ = std::make_shared<const jinja::Program>(jinja::parse(jinja::lex(source)));
    t.source_ = std::make_shared<const std::string>(source);
  } catch (const jinja::TemplateError&) {
    throw;
  } catch (const std::exception& e) {
    throw jinja::TemplateError(std::string("chat template: ") + e.what());
  }
  return t;
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context, std::time_t now,
                                  const jinja::RenderLimits& limits) const {
  if (!context.is_object()) throw jinja::RenderError("the template context must be a JSON object");
  jinja::Dict globals = jinja::builtin_globals(now);
  const size_t builtins = globals.items.size();
  globals.items.reserve(builtins + context.size());
  for (const auto& [k, v] : context.items()) {
    // The context's keys are unique: only a builtin's name needs a lookup.
    bool replaced = false;
    for (size_t i = 0; i < builtins && !replaced; ++i)
      if (globals.items[i].first == k) {
        globals.items[i].second = jinja::Value::from_json(v);
        replaced = true;
      }
    if (!replaced) globals.items.emplace_back(k, jinja::Value::from_json(v));
  }
  jinja::Renderer r(*program_, std::move(globals), now, limits);
  try {
    return r.run();
  } catch (const jinja::RenderError&) {
    throw;
  } catch (const std::exception& e) {  // e.g. a number out of range: still the template's failure
    throw jinja::RenderError(e.what());
  }
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context, std::time_t now, uint64_t max_steps) const {
  jinja::RenderLimits limits;
  limits.max_steps = max_steps;
  return render(context, now, limits);
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  return render(context, std::time(nullptr));
}

}  // namespace baton
