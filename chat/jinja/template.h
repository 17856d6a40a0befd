// A model's own chat template (GGUF `tokenizer.chat_template`), run by Baton's
// Jinja engine with the settings Hugging Face transformers renders it with:
// trim_blocks, lstrip_blocks, the immutable sandbox, loop controls, the
// `{% generation %}` block, tojson as json.dumps(ensure_ascii=False) and the
// globals raise_exception and strftime_now. The output is meant to be byte
// for byte what Jinja2 gives; docs/CHAT_TEMPLATES.md lists the subset.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja/limits.h"
#include "chat/jinja/value.h"

namespace baton {

namespace jinja {
struct Program;
class TemplateError;  // ast.h: a template outside the subset (thrown by parse)
}

class JinjaTemplate {
 public:
  // Throws jinja::TemplateError (a std::runtime_error) naming the construct
  // and line, e.g. "chat template: unsupported filter 'xyz' at line 3".
  static JinjaTemplate parse(const std::string& source);

  // Renders with the variables of `context` (a JSON object: messages, tools,
  // add_generation_prompt, bos_token, eos_token and any template kwargs).
  // Object key order is kept (tojson writes keys in input order, as Python
  // does). `now` is the clock strftime_now reads (local time). Throws
  // jinja::RenderError for what Jinja2 raises (raise_exception, type errors,
  // undefined attribute access...) and for a limit passed: the template's
  // steps, work, memory or depth, the deadline ("the chat template ran
  // longer than 2 s"), the cancel flag ("...cancelled"). A template from an
  // untrusted file must not run forever nor take the server's memory; a
  // prompt needs far less (limits.h has the defaults: no deadline).
  // The thread needs about 2 MiB of stack under ASan (kMaxDepth).
  std::string render(const nlohmann::ordered_json& context, std::time_t now,
                     const jinja::RenderLimits& limits) const;
  // The default limits, with `max_steps` statements and loop iterations.
  static constexpr uint64_t kDefaultMaxSteps = jinja::RenderLimits{}.max_steps;
  std::string render(const nlohmann::ordered_json& context, std::time_t now,
                     uint64_t max_steps = kDefaultMaxSteps) const;
  std::string render(const nlohmann::ordered_json& context) const;

  // The template's text (the chat APIs read the model's markup from it).
  const std::string& source() const { return *source_; }

 private:
  std::shared_ptr<const jinja::Program> program_;
  std::shared_ptr<const std::string> source_ = std::make_shared<const std::string>();
};

}  // namespace baton
