// Chat templates are input from strangers (a model file's
// tokenizer.chat_template). Each hostile shape here once crashed, hung or
// took gigabytes; now each ends in jinja::TemplateError at load or
// jinja::RenderError while rendering, quickly and in bounded memory, and
// the stack a render needs does not grow with the template
// (chat/jinja/limits.h, docs/RELIABILITY.md "Hostile chat templates").
#include <gtest/gtest.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "chat/jinja_prompt.h"
#include "chat/jinja/ast.h"
#include "chat/jinja/limits.h"
#include "chat/jinja/template.h"
#include "tests/jinja_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string repeat(std::string_view s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t k = 0; k < n; ++k) out += s;
  return out;
}

std::string load_error(const std::string& source) { return test::template_load_error(source); }

// The RenderError's text ("" when it renders).
std::string render_error(const std::string& source, const jinja::RenderLimits& limits = {},
                         const ojson& context = ojson::object()) {
  const JinjaTemplate t = JinjaTemplate::parse(source);
  try {
    t.render(context, 0, limits);
  } catch (const jinja::RenderError& e) {
    return e.what();
  }
  return "";
}

// Runs f on a thread with a stack of `bytes` (a server thread has 8 MiB;
// half of it must be enough at every limit, sanitizers included).
void on_stack(size_t bytes, const std::function<void()>& f) {
  struct Call {
    const std::function<void()>* f;
    std::exception_ptr error;
  } call{&f, nullptr};
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, bytes), 0);
  pthread_t thread;
  const int rc = pthread_create(
      &thread, &attr,
      [](void* p) -> void* {
        auto* c = static_cast<Call*>(p);
        try {
          (*c->f)();
        } catch (...) {
          c->error = std::current_exception();
        }
        return nullptr;
      },
      &call);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(rc, 0);
  pthread_join(thread, nullptr);
  if (call.error) std::rethrow_exception(call.error);
}

constexpr size_t kHalfServerStack = size_t(4) << 20;
// What "quickly" means here: far above what each shape takes (a fraction of
// a second under the sanitizers), far below a hang, on a loaded CI machine.
constexpr auto kQuick = std::chrono::seconds(5);

// Long chains of every construct that nests: refused at load, before
// anything recurses as deep as the chain. (200,000 links for one shape;
// 20,000 are as fatal to a recursive parser or evaluator and lex faster
// under the sanitizers. jinja_hostile_bench times all at 200,000.)
TEST(HostileJinja, DeepChainsAreRefusedAtLoad) {
  const size_t n = 20'000;
  const std::vector<std::pair<std::string, std::string>> shapes = {
      {"attr 200,000", "{{ x" + repeat(".a", 200'000) + " }}"},
      {"plus", "{{ 1" + repeat("+1", n) + " }}"},
      {"attr", "{{ x" + repeat(".a", n) + " }}"},
      {"filter", "{{ x" + repeat("|upper", n) + " }}"},
      {"concat", "{{ x" + repeat(" ~ 'a'", n) + " }}"},
      {"or", "{{ x" + repeat(" or x", n) + " }}"},
      {"item", "{{ x" + repeat("[0]", n) + " }}"},
      {"call", "{{ x" + repeat("(1)", n) + " }}"},
      {"cond", "{{ " + repeat("1 if false else ", n) + "1 }}"},
      {"not", "{{ " + repeat("not ", n) + "1 }}"},
      {"minus", "{{ " + repeat("-", n) + "1 }}"},
      {"paren", "{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}"},
      {"list", "{{ " + repeat("[", n) + repeat("]", n) + " }}"},
      {"dict", "{{ " + repeat("{'a': ", n) + "1" + repeat("}", n) + " }}"},
      {"compare", "{{ 1" + repeat(" < (1", n) + repeat(")", n) + " }}"},
      {"if", repeat("{% if true %}", n)},
      {"for", repeat("{% for x in y %}", n)},
      {"macro", repeat("{% macro f() %}", n)},
  };
  on_stack(kHalfServerStack, [&] {
    for (const auto& [name, source] : shapes) {
      const auto t0 = Clock::now();
      EXPECT_NE(load_error(source).find("nesting too deep"), std::string::npos) << name;
      EXPECT_LT(Clock::now() - t0, kQuick) << name;
    }
  });
}

// At the limits the stack is what a server thread has: every shape one
// level short of the load limit renders (or raises) on half of 8 MiB, and
// recursion through macros stops at the same depth.
TEST(HostileJinja, RenderingAtTheDepthLimitFitsInHalfAServerStack) {
  const size_t n = jinja::kMaxDepth - 5;
  const ojson ctx = {{"x", {{"a", "b"}}}, {"l", ojson::array()}};
  on_stack(kHalfServerStack, [&] {
    EXPECT_EQ(JinjaTemplate::parse("{{ 1" + repeat("+1", n - 1) + " }}").render(ctx, 0), std::to_string(n));
    EXPECT_EQ(JinjaTemplate::parse("{{ 'a'" + repeat("|upper", n) + " }}").render(ctx, 0), "A");
    EXPECT_EQ(JinjaTemplate::parse("{{ 0" + repeat(" or 0", n - 1) + " or 7 }}").render(ctx, 0), "7");
    EXPECT_EQ(JinjaTemplate::parse("{{ " + repeat("1 if false else ", n) + "2 }}").render(ctx, 0), "2");
    EXPECT_EQ(JinjaTemplate::parse("{{ 'a'" + repeat(" ~ 'a'", n - 1) + " }}").render(ctx, 0), repeat("a", n));
    for (const std::string& raising : {"{{ x" + repeat(".a", n) + " }}", "{{ l" + repeat("[0]", n) + " }}",
                                       "{{ range" + repeat("(1)", n) + " }}"}) {
      EXPECT_NE(render_error(raising, {}, ctx), "") << raising.substr(0, 20);
    }
    // Statements nest as deep.
    const size_t ifs = jinja::kMaxDepth - 10;
    EXPECT_EQ(JinjaTemplate::parse(repeat("{% if true %}", ifs) + "in" + repeat("{% endif %}", ifs)).render(ctx, 0),
              "in");
    // Recursion through macros, with expressions and statements at each level.
    for (const char* macro :
         {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
          "{% macro f(n) %}{% for i in [1] %}{% if true %}{{ ((f(n + 1) ~ 'x') | upper) + 'y' }}{% endif %}"
          "{% endfor %}{% endmacro %}{{ f(0) }}",
          "{% macro f(n) %}{% call f(n) %}{{ caller() }}{% endcall %}{% endmacro %}{{ f(0) }}",
          "{% macro f(n) %}{% set x %}{{ f(n) }}{% endset %}{% endmacro %}{{ f(0) }}",
          "{% macro f(n) %}{% filter upper %}{{ f(n) }}{% endfilter %}{% endmacro %}{{ f(0) }}",
          "{% macro f(n) %}{{ [1, 2] | map('string') | join(f(n)) }}{% endmacro %}{{ f(0) }}"}) {
      EXPECT_NE(render_error(macro).find("recursion too deep"), std::string::npos) << macro;
    }
  });
}

// The depth limit leaves room for what clients may send: a tool whose
// parameter schema nests as deep as the API's 64-level JSON allows, through
// the published templates that recurse over schemas (Kimi K3's json_sorted
// needs 323 levels for it).
TEST(HostileJinja, DeepToolSchemasStillRender) {
  ojson object_schema = {{"type", "string"}}, array_schema = {{"type", "string"}};
  for (int i = 0; i < 29; ++i)  // root, tools, [0], function, parameters, then 2 levels each
    object_schema = {{"type", "object"}, {"properties", {{"a", object_schema}}}, {"required", {"a"}}};
  for (int i = 0; i < 58; ++i) array_schema = {{"type", "array"}, {"items", array_schema}};
  for (const char* name : {"Kimi-K3.jinja", "google-gemma-4-31B-it.jinja", "meetkai-functionary-medium-v3.2.jinja",
                           "openai-gpt-oss-120b.jinja", "Apertus-8B-Instruct.jinja", "GigaChat3.1-10B-A1.8B.jinja"}) {
    std::ifstream f(test::shared_dir() + "/chat_templates/" + name);
    std::stringstream text;
    text << f.rdbuf();
    const JinjaTemplate t = JinjaTemplate::parse(text.str());
    for (const ojson& schema : {object_schema, array_schema}) {
      const ojson ctx = {
          {"messages", ojson::array({{{"role", "user"}, {"content", "Hi"}}})},
          {"tools", ojson::array({{{"type", "function"},
                                   {"function", {{"name", "f"}, {"description", "d"}, {"parameters", schema}}}}})},
          {"add_generation_prompt", true},
          {"bos_token", "<s>"},
          {"eos_token", "</s>"}};
      on_stack(kHalfServerStack, [&] { EXPECT_NO_THROW(t.render(ctx, 0)) << name; });
    }
  }
}

// Values nest as deep as the template builds them (a loop wrapping a list
// in a list): bounded when built, so printing, serializing, comparing and
// freeing them never recurse deeper than the limit.
TEST(HostileJinja, DeeplyNestedValuesAreBounded) {
  on_stack(kHalfServerStack, [&] {
    const std::string wrap =
        "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
    EXPECT_NE(render_error(wrap).find("nested too deep"), std::string::npos);
    for (const char* use : {"{{ ns.x }}", "{{ ns.x | tojson }}", "{{ ns.x == ns.y }}", "{{ ns.x < ns.y }}",
                            "{{ ns.x in [ns.y] }}", "{{ [ns.x, ns.y] | unique | list | length }}"}) {
      // As deep as a value may be: what walks it runs out of depth, cleanly.
      const std::string near = "{% set ns = namespace(x=[], y=[]) %}{% for i in range(" +
                               std::to_string(jinja::kMaxDepth - 1) +
                               ") %}{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}";
      EXPECT_NE(render_error(near + use).find("too deep"), std::string::npos) << use;
    }
    // Dicts and bound methods nest too.
    EXPECT_NE(render_error("{% set ns = namespace(x={}) %}{% for i in range(100000) %}"
                           "{% set ns.x = {'k': ns.x} %}{% endfor %}")
                  .find("nested too deep"),
              std::string::npos);
    EXPECT_NE(render_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
                           "{% set ns.x = [ns.x.count] %}{% endfor %}")
                  .find("nested too deep"),
              std::string::npos);
    // So does the input.
    ojson deep = ojson::array();
    for (int i = 0; i < 2 * jinja::kMaxDepth; ++i) deep = ojson::array({deep});
    EXPECT_NE(render_error("{{ x }}", {}, {{"x", deep}}).find("nests too deep"), std::string::npos);
  });
}

// Work, not statements: one statement over a 5 MB string costs 5 M units
// (100,000 of them took hours; the 60 MB string of the report is timed by
// jinja_hostile_bench).
const std::string kScanLoop =
    "{% set s = 'x' * 5000000 %}{% for i in range(100000) %}{% if s | length > 0 %}{% endif %}{% endfor %}";

TEST(HostileJinja, WorkIsChargedNotJustStatements) {
  jinja::RenderLimits limits;
  limits.max_work = uint64_t(1) << 26;
  const auto t0 = Clock::now();
  EXPECT_NE(render_error(kScanLoop, limits).find("runs too long"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, kQuick);
  // Quadratic filters are charged by the comparison.
  EXPECT_NE(render_error("{{ range(100000) | unique | list | length }}", limits).find("runs too long"),
            std::string::npos);
  EXPECT_NE(render_error("{% set l = range(100000) | list %}{% for i in l %}{% if i in l %}{% endif %}{% endfor %}",
                         limits)
                .find("runs too long"),
            std::string::npos);
  // Each eval of a wide expression is charged too.
  limits.max_work = uint64_t(1) << 24;
  EXPECT_NE(render_error("{% for i in range(100000) %}{% for j in range(20) %}{{ (" + repeat("1,", 300) +
                             ") | length }}{% endfor %}{% endfor %}",
                         limits)
                .find("runs too long"),
            std::string::npos);
}

TEST(HostileJinja, DeadlineAndCancelFlagStopARender) {
  jinja::RenderLimits limits;
  limits.max_work = UINT64_MAX;
  limits.max_steps = UINT64_MAX;
  limits.deadline = Clock::now() + std::chrono::milliseconds(300);
  auto t0 = Clock::now();
  EXPECT_NE(render_error(kScanLoop, limits).find("ran longer than"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, kQuick);

  // A flag another thread sets, read while the render runs.
  std::atomic<bool> cancel{false};
  limits.deadline = Clock::time_point::max();
  limits.cancel = &cancel;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = true;
  });
  t0 = Clock::now();
  EXPECT_NE(render_error(kScanLoop, limits).find("cancelled"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, kQuick);
  setter.join();
  // Set before the render starts: it does not start.
  EXPECT_NE(render_error("x", limits).find("cancelled"), std::string::npos);

  // The chat prompt path carries the limits.
  ChatTemplateInput in;
  in.messages = ojson::parse(R"([{"role":"user","content":"Hi"}])");
  in.limits.cancel = &cancel;
  EXPECT_THROW(render_chat(JinjaTemplate::parse("{{ messages[0].content }}"), in), jinja::RenderError);
  cancel = false;
  EXPECT_EQ(render_chat(JinjaTemplate::parse("{{ messages[0].content }}"), in), "Hi");
}

// Bytes, not items: every value a template builds is charged before it is
// allocated, whatever builds it. The default limit (64 MiB) first, then
// every filter, method and operator under a small one (2 MiB: the same
// checks, less time under the sanitizers; jinja_hostile_bench runs the
// report's full-size shapes at the default).
TEST(HostileJinja, MemoryIsChargedInBytes) {
  for (const char* s : {"{{ 'x' * 100000000 }}", "{{ 'x' * 100000000000 }}",
                        "{{ ('x' * 1000) | replace('x', 'y' * 100000) }}"}) {
    EXPECT_NE(render_error(s).find("larger than 64 MiB"), std::string::npos) << s;
  }
  jinja::RenderLimits limits;
  limits.max_bytes = size_t(2) << 20;
  const std::string x = "{% set x = ['x' * 25000] * 15000 %}";  // 1.4 MiB of list, one string
  const std::vector<std::string> shapes = {
      x + "{{ x }}",
      x + "{{ x | join }}",
      "{% set x = [['x' * 25000]] * 15000 %}{{ x | join(attribute='0') }}",
      x + "{{ x | tojson }}",
      x + "{{ x | string }}",
      x + "{{ ''.join(x) }}",
      x + "{{ x | map('upper') | list | length }}",
      x + "{{ x | sort | length }}",
      x + "{{ x | reverse | list | length }}",
      x + "{{ x + x }}",
      x + "{{ x[::-1] | length }}",
      x + "{{ 'k' ~ x }}",
      "{{ [1] * 100000000000 }}",
      "{{ (1,) * 100000000000 }}",
      "{{ ('x' * 1000).replace('', 'y' * 10000) }}",
      "{{ ('x,' * 750000).split(',') | length }}",
      "{{ ('x,' * 750000).rsplit(',') | length }}",
      "{{ ('x ' * 750000).split() | length }}",
      "{{ ('x\n' * 750000).splitlines() | length }}",
      "{{ ('x' * 750000) | list | length }}",
      "{{ ('x' * 750000)[::2] }}",
      "{% for c in 'x' * 750000 %}{% endfor %}",
      "{{ '{0}{0}{0}{0}{0}{0}{0}{0}'.format('x' * 300000) }}",
      "{{ '{a}{a}{a}{a}{a}{a}{a}{a}{a}'.format(a='x' * 300000) }}",
      "{{ ([[[1]]] * 1000) | tojson(indent=100000000) }}",
      "{{ ('x\n' * 25000) | indent(1000) }}",
      "{{ 'a' | indent(100000000000) }}",
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
      "{% set ns = namespace(s='x' | safe) %}{% for i in range(40) %}{% set ns.s = ns.s + '<' %}"
      "{% set ns.s = '<' + ns.s + ns.s %}{% endfor %}",
      "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + ['x' * 25000] %}{% endfor %}",
      "{% set s = 'x' * 1250000 %}{{ s ~ s }}",
      "{% set s = '<' * 500000 %}{{ s | e }}",
      "{% set s = 'x' * 1250000 %}{{ s | upper ~ s | lower }}",
      "{% set s = 'x' * 1250000 %}{{ s | title ~ s | capitalize }}",
      "{% set s = 'x' * 1250000 %}{{ s | trim ~ s.strip('y') }}",
      "{% set s = 'x' * 1250000 %}{{ s | tojson }}{{ s | tojson }}",
      "{% set s = 'x' * 1250000 %}{{ s | reverse }}{{ s | reverse }}",
      "{% macro m() %}{{ 'x' * 1250000 }}{% endmacro %}{{ m() ~ m() }}",
      "{% macro m() %}{{ 'x' * 1250000 }}{% endmacro %}{% set a %}{{ m() }}{% endset %}{{ a }}{{ a }}",
      "{% for i in range(100) %}{{ 'x' * 25000 }}{% endfor %}",
      "{% set s = 'x' * 1500000 %}{% set t = s[1:] %}",
      "{% set x = ('x' * 25000).split('x') %}{{ x | length }}",
      "{% set d = {'k': 'x' * 1250000} %}{{ d }}{{ d }}",
      "{% set d = dict(k='x' * 1250000) %}{{ d | dictsort }}{{ d.items() | list }}{{ d }}",
      "{% set x = range(20000) %}{{ x | map('string') | list }}",
      "{% set x = range(20000) %}{{ x | select('odd') | list }}{{ x | reject('odd') | list }}",
  };
  for (const std::string& s : shapes) {
    const auto t0 = Clock::now();
    EXPECT_NE(render_error(s, limits).find("larger than 2 MiB"), std::string::npos) << s;
    EXPECT_LT(Clock::now() - t0, kQuick) << s;
  }
  // The limit counts what is alive: values freed along the way are not
  // counted twice (a loop rebuilding one string stays within a small limit).
  jinja::RenderLimits small;
  small.max_bytes = size_t(1) << 20;
  EXPECT_EQ(render_error("{% for i in range(1000) %}{% set s = 'x' * 500000 %}{% endfor %}", small), "");
  EXPECT_NE(render_error("{{ 'x' * 2000000 }}", small).find("larger than 1 MiB"), std::string::npos);
  // The output counts as well.
  EXPECT_NE(render_error("{% for i in range(1000) %}{{ 'x' * 2000 }}{% endfor %}", small).find("larger than"),
            std::string::npos);
}

// A namespace holding itself is a reference cycle: the render frees it when
// it ends (with its error too).
TEST(HostileJinja, NamespaceCyclesAreFreedWhenTheRenderEnds) {
  const JinjaTemplate t = JinjaTemplate::parse(
      "{% set ns = namespace(a='x' * 50000) %}{% set ns.self = ns %}{% set other = namespace(peer=ns) %}"
      "{% set ns.peer = other %}{% set ns.l = [ns, other, [ns]] %}"
      "{% if fail %}{{ raise_exception('fails after the cycles') }}{% endif %}");
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(t.render(ojson::object(), 0), "");
    EXPECT_EQ(jinja::live_namespaces(), 0u);
    EXPECT_THROW(t.render(ojson{{"fail", true}}, 0), jinja::RenderError);
    EXPECT_EQ(jinja::live_namespaces(), 0u);
  }
}

TEST(HostileJinja, RaisedMessagesAreCapped) {
  const std::string huge = render_error("{{ raise_exception('x' * 10000000) }}");
  EXPECT_EQ(huge, repeat("x", jinja::kMaxRaiseBytes) + "...");
  // Cut between characters, never inside one.
  const std::string wide = render_error("{{ raise_exception('x' + 'é' * 10000) }}");
  EXPECT_EQ(wide, "x" + repeat("é", (jinja::kMaxRaiseBytes - 1) / 2) + "...");
  EXPECT_EQ(render_error("{{ raise_exception('short') }}"), "short");
}

}  // namespace
}  // namespace baton
