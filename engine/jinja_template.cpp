#include "engine/jinja_template.h"

#include "engine/jinja_ast.h"
#include "engine/jinja_render.h"

namespace baton {

JinjaTemplate JinjaTemplate::parse(const std::string& source) {
  JinjaTemplate t;
  t.program_ = std::make_shared<const jinja::Program>(jinja::parse(jinja::lex(source)));
  return t;
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context, std::time_t now) const {
  if (!context.is_object()) throw jinja::RenderError("the template context must be a JSON object");
  jinja::Dict globals = jinja::builtin_globals(now);
  for (const auto& [k, v] : context.items()) globals.set(k, jinja::Value::from_json(v));
  jinja::Renderer r(*program_, std::move(globals), now);
  return r.run();
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  return render(context, std::time(nullptr));
}

}  // namespace baton
