// Baton's Jinja engine against Jinja2: every real chat template in
// shared/chat_templates rendered for the conversations of
// tests/chat/conversations.json, and the small templates of
// tests/chat/snippets.json, must give byte-identical output to Jinja2 run
// the way Hugging Face transformers runs it (tests/chat/render_oracle.py), or
// fail where Jinja2 raises. Needs python3 with jinja2 (Debian python3-jinja2).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/jinja_prompt.h"
#include "chat/family.h"
#include "engine/gguf/file.h"
#include "chat/jinja/ast.h"
#include "chat/jinja/template.h"
#include "engine/text/tokenizer.h"
#include "tests/jinja_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using ojson = nlohmann::ordered_json;

ojson read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  return ojson::parse(f);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs the oracle with `args`, returns its JSON output.
ojson run_oracle(const std::vector<std::string>& args) {
  test::TempDir tmp;
  const std::string out = tmp.file("oracle.json");
  std::vector<std::string> argv = {"/usr/bin/env", "python3", test::source_path("tests/chat/render_oracle.py")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(out);
  const auto r = test::run_command(argv);
  if (r.exit_code != 0)
    throw std::runtime_error("render_oracle.py failed (python3 with jinja2 is required: Debian python3-jinja2): " + r.err);
  return read_json(out);
}

// Compares one rendering with the oracle's entry ({"output": ...} or {"error": ...}).
void expect_same(const JinjaTemplate& t, const ojson& context, std::time_t now, const ojson& expected,
                 const std::string& what) {
  if (expected.contains("output")) {
    std::string got;
    try {
      got = t.render(context, now);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": Jinja2 renders it, Baton raised: " << e.what();
      return;
    }
    EXPECT_EQ(got, expected["output"].get<std::string>()) << what;
  } else {
    EXPECT_THROW(t.render(context, now), jinja::RenderError)
        << what << ": Jinja2 raised " << expected["error"].get<std::string>();
  }
}

TEST(Jinja, RealTemplatesMatchJinja2) {
  const std::string dir = test::shared_dir() + "/chat_templates";
  const std::string conv_path = test::source_path("tests/chat/conversations.json");
  const ojson spec = read_json(conv_path);
  const ojson oracle = run_oracle({dir, conv_path});
  const std::time_t now = spec["now"].get<std::time_t>();
  size_t templates = 0, compared = 0, errors = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().filename().string();
    ASSERT_TRUE(oracle.contains(name)) << name;
    const ojson& expected = oracle[name];
    ++templates;
    if (expected.contains("load_error")) {
      EXPECT_THROW(JinjaTemplate::parse(read_text(entry.path().string())), std::runtime_error) << name;
      continue;
    }
    JinjaTemplate t;
    try {
      t = JinjaTemplate::parse(read_text(entry.path().string()));
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << " refused at load: " << e.what();
      continue;
    }
    for (const ojson& c : spec["cases"]) {
      const std::string cname = c["name"].get<std::string>();
      expect_same(t, c["context"], now, expected[cname], name + " / " + cname);
      ++compared;
      errors += expected[cname].contains("error");
    }
  }
  EXPECT_GE(templates, 70u);
  // Most renderings must be outputs, not errors, or the comparison says little.
  EXPECT_GT(compared, 5 * errors) << compared << " compared, " << errors << " Jinja2 errors";
}

TEST(Jinja, SnippetsMatchJinja2) {
  const std::string path = test::source_path("tests/chat/snippets.json");
  const ojson spec = read_json(path);
  const ojson oracle = run_oracle({"--snippets", path});
  const std::time_t now = spec["now"].get<std::time_t>();
  ASSERT_GE(spec["snippets"].size(), 30u);
  for (const ojson& s : spec["snippets"]) {
    const std::string name = s["name"].get<std::string>();
    const ojson& expected = oracle[name];
    ASSERT_FALSE(expected.contains("load_error")) << name;
    try {
      expect_same(JinjaTemplate::parse(s["template"].get<std::string>()), s["context"], now, expected, name);
    } catch (const jinja::TemplateError& e) {
      ADD_FAILURE() << name << " refused at load: " << e.what();
    }
  }
}

std::string load_error(const std::string& source) { return test::template_load_error(source); }

TEST(Jinja, RefusesWhatItCannotRunAtLoadNamingTheConstruct) {
  EXPECT_EQ(load_error("a\n{{ x | xyz }}"), "chat template: unsupported filter 'xyz' at line 2");
  EXPECT_EQ(load_error("{{ x is wobbly }}"), "chat template: unsupported test 'wobbly' at line 1");
  EXPECT_EQ(load_error("\n\n{% include 'other.jinja' %}"), "chat template: unsupported tag 'include' at line 3");
  EXPECT_EQ(load_error("{% for x in y recursive %}{% endfor %}"),
            "chat template: unsupported recursive loop at line 1");
  EXPECT_NE(load_error("{% if x %}never closed"), "");
  EXPECT_NE(load_error("{{ 'unterminated }}"), "");
  // Inside an if, Jinja2 itself defers an unknown filter to run time: so does Baton.
  const JinjaTemplate t = JinjaTemplate::parse("{% if x %}{{ x | from_json }}{% endif %}ok");
  EXPECT_EQ(t.render(ojson{{"x", false}}), "ok");
  EXPECT_THROW(t.render(ojson{{"x", "[]"}}), jinja::RenderError);
}

TEST(Jinja, ContextMustBeAnObject) {
  const JinjaTemplate t = JinjaTemplate::parse("x");
  EXPECT_THROW(t.render(ojson::array()), jinja::RenderError);
  EXPECT_EQ(t.render(ojson::object()), "x");
}

// The Phi-3 vocabulary fixture carries its model's template: rendered by the
// Jinja engine it gives what the Phi3 family renderer writes for alternating
// turns ending with the user (docs/CHAT_TEMPLATES.md), BOS and EOS from the vocabulary.
TEST(Jinja, GgufTemplateAgreesWithItsFamilyRenderer) {
  GgufFile f = GgufFile::open(test::shared_dir() + "/models/vocab/ggml-vocab-phi-3.gguf");
  auto tok = Tokenizer::from_gguf(f);
  const auto t = gguf_chat_template(f);
  ASSERT_NE(t, nullptr);
  ChatTemplateInput in;
  in.messages = ojson::parse(R"([{"role":"user","content":"Hi!"},{"role":"assistant","content":"Hello."},
                                 {"role":"user","content":"What is 2+2?"}])");
  in.bos_token = chat_bos_text(*tok);
  in.eos_token = chat_eos_text(*tok);
  std::vector<ChatMessage> msgs;
  for (const auto& m : in.messages) msgs.push_back({m["role"], m["content"]});
  EXPECT_EQ(render_chat(*t, in), render_chat(ChatFamily::Phi3, msgs, ChatOptions{}, in.bos_token));
  EXPECT_EQ(in.eos_token, "<|endoftext|>");
  // stories260K has no template.
  EXPECT_EQ(gguf_chat_template(GgufFile::open(test::model_path("stories260K.gguf"))), nullptr);
}

// Templates come from untrusted files: nesting, recursion, runaway loops and
// values, and 64-bit integer overflow end in an error, never a crash or a hang.
TEST(Jinja, HostileTemplatesFailCleanly) {
  EXPECT_NE(load_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nesting too deep"),
            std::string::npos);
  EXPECT_NE(load_error("{{ " + std::string(5000, '-') + "1 }}").find("nesting too deep"), std::string::npos);
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  EXPECT_NE(load_error(nested_ifs).find("nesting too deep"), std::string::npos);
  EXPECT_NE(load_error("{{ 99999999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_NE(load_error("{{ '\\U0011ffff' }}").find("bad escape"), std::string::npos);
  EXPECT_EQ(load_error("{{ 1[] }}"), "chat template: empty subscript at line 1");  // found by fuzz_jinja
  auto render_error = [](const std::string& source) -> std::string {
    try {
      JinjaTemplate::parse(source).render(ojson::object(), 0, 100'000);
    } catch (const jinja::RenderError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion"), std::string::npos);
  EXPECT_NE(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
                .find("runs too long"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'x' * 100000000000 }}").find("larger than"), std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("larger than"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'a' | indent(100000000000) }}").find("larger than"), std::string::npos);
  for (const char* overflow : {"{{ 2 ** 64 }}", "{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
                               "{{ 4611686018427387904 * 2 }}", "{{ -(-9223372036854775807 - 1) }}"}) {
    EXPECT_NE(render_error(overflow).find("overflow"), std::string::npos) << overflow;
  }
  EXPECT_EQ(JinjaTemplate::parse("{{ 2 ** 62 }} {{ range(0, 9223372036854775807, 4611686018427387904) | list }}")
                .render(ojson::object(), 0),
            "4611686018427387904 [0, 4611686018427387904]");
}

}  // namespace
}  // namespace baton
