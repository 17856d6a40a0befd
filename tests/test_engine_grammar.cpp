// Structured output's grammar: the JSON Schema compiler accepts exactly the
// texts it should, refuses unsupported keywords by name, and the token mask
// walked on a real vocabulary's trie equals the naive check of every token.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "engine/gguf/file.h"
#include "engine/sampling/grammar.h"
#include "engine/sampling/json_schema.h"
#include "engine/text/tokenizer.h"
#include "json_schema_check.h"
#include "test_util.h"

namespace baton {
namespace {

using json = nlohmann::ordered_json;

bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.advance(text) && m.accepting();
}

// A prefix the grammar can still complete.
bool viable(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.advance(text);
}

TEST(Grammar, LiteralsAlternativesAndRecursion) {
  auto g = std::make_shared<Grammar>();
  // list := "(" items ")" ; items := "" | "x" items | list items
  const auto list = g->add_rule();
  const auto items = g->add_rule();
  g->add_alternative(items, {});
  g->add_alternative(items, {Grammar::byte('x'), Grammar::ref(items)});
  g->add_alternative(items, {Grammar::ref(list), Grammar::ref(items)});
  g->add_alternative(list, {Grammar::byte('('), Grammar::ref(items), Grammar::byte(')')});
  g->set_root(list);
  g->check();
  EXPECT_TRUE(matches(g, "()"));
  EXPECT_TRUE(matches(g, "(x(xx)(()x))"));
  EXPECT_FALSE(matches(g, "(x"));
  EXPECT_TRUE(viable(g, "(x(("));
  EXPECT_FALSE(viable(g, "(x))"));
  EXPECT_FALSE(viable(g, "y"));
  GrammarMatcher m(g);
  ASSERT_TRUE(m.advance("(x)"));
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.advance(")"));
  EXPECT_TRUE(m.finished());  // a refused advance leaves the state
}

TEST(Grammar, LeftRecursionIsRefused) {
  Grammar g;
  const auto a = g.add_rule();
  const auto b = g.add_rule();
  g.add_alternative(b, {});
  g.add_alternative(a, {Grammar::ref(b), Grammar::ref(a), Grammar::byte('x')});
  g.add_alternative(a, {Grammar::byte('y')});
  g.set_root(a);
  EXPECT_THROW(g.check(), std::invalid_argument);
}

TEST(JsonSchemaGrammar, JsonObject) {
  auto g = json_object_grammar();
  for (const char* ok : {"{}", "{ }", R"({"a":1})", R"({"a": [1, 2.5e-3, "x", null, true, {"b": {}}]})",
                         "{\n  \"k\": \"\\u00e9\\n\",\n  \"l\": -0.5\n}", "{\"\xc3\xa9\":false}"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {"[]", "1", "{a:1}", R"({"a":01})", R"({"a":1,})", R"({"a" :1})", "{\"\\ud800\":1}",
                          "{\"\xc0\xaf\":1}", "{\"\x01\":1}", R"({"a":1} )", R"({"a":1.})"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
  // Whitespace is bounded: a model cannot ramble in it.
  EXPECT_TRUE(matches(g, "{\n" + std::string(16, ' ') + "}"));
  EXPECT_FALSE(viable(g, "{\n" + std::string(17, ' ')));
  EXPECT_FALSE(viable(g, "{  "));
  // Numbers are bounded too.
  EXPECT_TRUE(matches(g, "{\"n\":" + std::string(16, '9') + "}"));
  EXPECT_FALSE(viable(g, "{\"n\":" + std::string(17, '9')));
}

TEST(JsonSchemaGrammar, PropertiesInOrderRequiredAndOptional) {
  auto g = json_schema_grammar(json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name"]})"));
  EXPECT_TRUE(matches(g, R"({"name":"x"})"));
  EXPECT_TRUE(matches(g, R"({"name":"x","age":3})"));
  EXPECT_TRUE(matches(g, R"({"name": "x", "tags": ["a", "b"]})"));
  EXPECT_TRUE(matches(g, R"({"name":"x","age":0,"tags":[]})"));
  EXPECT_FALSE(matches(g, R"({"age":3})"));                    // name is required
  EXPECT_FALSE(matches(g, R"({"age":3,"name":"x"})"));         // declared order
  EXPECT_FALSE(matches(g, R"({"name":"x","age":-3})"));        // minimum 0
  EXPECT_FALSE(matches(g, R"({"name":"x","age":1.5})"));       // integer
  EXPECT_FALSE(matches(g, R"({"name":"x","tags":["c"]})"));    // enum
  EXPECT_FALSE(matches(g, R"({"name":"x","tags":["a","a","b"]})"));  // maxItems
  EXPECT_FALSE(matches(g, R"({"name":"x","other":1})"));       // no additional properties
  EXPECT_FALSE(matches(g, R"({"name":"x",})"));
}

TEST(JsonSchemaGrammar, OnlyOptionalProperties) {
  auto g = json_schema_grammar(json::parse(R"({"properties": {"a": {"type": "null"}, "b": {"const": [1]}}})"));
  for (const char* ok : {"{}", R"({"a":null})", R"({"b":[1]})", R"({"a":null,"b":[1]})"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {R"({,"b":[1]})", R"({"a":null,})", R"({"b":[2]})", R"({"b":[1],"a":null})"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
}

TEST(JsonSchemaGrammar, AdditionalPropertiesExcludeDeclaredNames) {
  auto g = json_schema_grammar(json::parse(R"({"type": "object", "properties": {"id": {"type": "integer"}},
      "additionalProperties": {"type": "boolean"}})"));
  EXPECT_TRUE(matches(g, R"({"id":1,"i":true,"idx":false,"":true})"));
  EXPECT_TRUE(matches(g, R"({"x":true})"));
  EXPECT_FALSE(matches(g, R"({"id":1,"id":true})"));  // a declared name is not an additional one
  EXPECT_FALSE(matches(g, R"({"id":1,"x":1})"));
  EXPECT_FALSE(matches(g, R"({"\u0069d":true})"));     // no escapes in additional names
}

TEST(JsonSchemaGrammar, StringLengthsCountCodePoints) {
  auto g = json_schema_grammar(json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  EXPECT_FALSE(matches(g, R"("a")"));
  EXPECT_TRUE(matches(g, R"("ab")"));
  EXPECT_TRUE(matches(g, "\"\xc3\xa9\xe2\x82\xac\\n\""));  // é € \n: three characters
  EXPECT_FALSE(matches(g, R"("abcd")"));
  EXPECT_FALSE(viable(g, R"("abcd)"));
}

TEST(JsonSchemaGrammar, AnyOfTypeListsRefsAndRecursion) {
  auto g = json_schema_grammar(json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": ["integer", "null"]},
                                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v", "kids"]}},
    "anyOf": [{"$ref": "#/$defs/node"}, {"type": "boolean"}]})"));
  EXPECT_TRUE(matches(g, "true"));
  EXPECT_TRUE(matches(g, R"({"v":1,"kids":[]})"));
  EXPECT_TRUE(matches(g, R"({"v":null,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]})"));
  EXPECT_FALSE(matches(g, R"({"v":null,"kids":[{"v":2}]})"));
  EXPECT_FALSE(matches(g, "null"));
}

TEST(JsonSchemaGrammar, ArrayCounts) {
  auto g = json_schema_grammar(json::parse(R"({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 3})"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_TRUE(matches(g, "[1,2]"));
  EXPECT_TRUE(matches(g, "[1, -2.5E+10, 0.0]"));
  EXPECT_FALSE(matches(g, "[1,2,3,4]"));
}

TEST(JsonSchemaGrammar, UnsupportedKeywordsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "string", "pattern": "^a+$"})", "'pattern' is not supported (at #)"},
      {R"({"properties": {"n": {"type": "number", "maximum": 3}}})", "'maximum' is not supported (at #/properties/n)"},
      {R"({"type": "integer", "minimum": 5})", "'minimum' other than 0"},
      {R"({"type": "array", "uniqueItems": true})", "'uniqueItems'"},
      {R"({"not": {"type": "null"}})", "'not'"},
      {R"({"allOf": [{"type": "null"}, {"type": "null"}]})", "'allOf' with more than one"},
      {R"({"$ref": "https://example.com/s.json"})", "'$ref' to 'https://example.com/s.json'"},
      {R"({"$ref": "#/$defs/missing"})", "points nowhere"},
      {R"({"type": "date"})", "unknown type 'date'"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "required property 'b'"},
      {R"({"type": "string", "maxLength": 100000})", "'maxLength' above"},
      {R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})",
       "left recursion"},
  };
  for (const auto& [schema, want] : cases) {
    try {
      json_schema_grammar(json::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  // Annotations are not constraints: accepted.
  EXPECT_NO_THROW(json_schema_grammar(json::parse(
      R"({"title": "t", "description": "d", "type": "string", "format": "email", "examples": ["a"]})")));
}

// The trie walk must give exactly the tokens whose whole piece the grammar
// accepts, checked token by token, at states along a document.
void check_masks(const std::string& vocab_file) {
  GgufFile f = GgufFile::open(test::model_path(vocab_file));
  auto tok = Tokenizer::from_gguf(f);
  VocabTrie trie(*tok);
  auto g = json_schema_grammar(json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8}, "n": {"type": "number"},
      "list": {"type": "array", "items": {"enum": ["yes", "no"]}}}, "required": ["name", "n", "list"]})"));
  const std::string doc = R"({"name": "ab\"c", "n": -1.5e3, "list": ["yes","no"]})";
  ASSERT_TRUE(matches(g, doc));
  GrammarMatcher m(g);
  std::vector<uint64_t> mask;
  int checked = 0;
  for (size_t cut = 0; cut < doc.size(); cut += 3) {
    GrammarMatcher at(g);
    ASSERT_TRUE(at.advance(doc.substr(0, cut)));
    at.fill_mask(trie, mask);
    size_t allowed = 0;
    for (int32_t t = 0; t < tok->n_vocab(); ++t) {
      const std::string piece = tok->token_to_piece(t);
      const bool want = !piece.empty() && at.accepts(piece);
      const bool got = (mask[size_t(t) >> 6] >> (t & 63)) & 1;
      ASSERT_EQ(got, want) << vocab_file << " after '" << doc.substr(0, cut) << "' token " << t << " '" << piece << "'";
      allowed += got;
    }
    EXPECT_GT(allowed, 0u);
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST(GrammarMask, EqualsNaiveCheckOnSentencePieceVocab) { check_masks("vocab/ggml-vocab-llama-spm.gguf"); }
TEST(GrammarMask, EqualsNaiveCheckOnByteLevelBpeVocab) { check_masks("vocab/ggml-vocab-gpt-2.gguf"); }

// Random walks over the vocabulary, drawing only allowed tokens, end in JSON
// that validates against the schema.
TEST(GrammarMask, RandomTokenWalksGiveValidDocuments) {
  GgufFile f = GgufFile::open(test::model_path("vocab/ggml-vocab-gpt-2.gguf"));
  auto tok = Tokenizer::from_gguf(f);
  VocabTrie trie(*tok);
  const json schema = json::parse(R"({"type": "object", "properties": {
      "id": {"type": "integer"}, "label": {"type": "string", "maxLength": 6},
      "ok": {"type": "boolean"}, "kind": {"enum": ["a", "b", 3]},
      "pts": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
      "required": ["id", "kind"]})");
  auto g = json_schema_grammar(schema);
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> mask;
  for (int run = 0; run < 20; ++run) {
    GrammarMatcher m(g);
    std::string text;
    while (!m.finished() && text.size() < 4000) {
      m.fill_mask(trie, mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < tok->n_vocab(); ++t) {
        if ((mask[size_t(t) >> 6] >> (t & 63)) & 1) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << text;
      // Prefer closing tokens now and then, so that walks end.
      const int32_t t = allowed[rng() % allowed.size()];
      const std::string piece = tok->token_to_piece(t);
      ASSERT_TRUE(m.advance(piece));
      text += piece;
    }
    if (!m.finished()) continue;  // a walk that kept going: nothing to check
    json v = json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    EXPECT_EQ(test::schema_violation(v, schema, schema), "") << text;
  }
}

// The cost of one mask on a large vocabulary: printed for docs/GRAMMAR.md.
TEST(GrammarMask, CostOnALargeVocabulary) {
  GgufFile f = GgufFile::open(test::model_path("vocab/ggml-vocab-gpt-2.gguf"));
  auto tok = Tokenizer::from_gguf(f);
  // 128K pieces: the real ones, and pairs of them (as larger BPE vocabularies
  // are longer merges of the same bytes).
  std::vector<std::string> pieces;
  for (int32_t t = 0; t < tok->n_vocab(); ++t) pieces.push_back(tok->token_to_piece(t));
  std::mt19937_64 rng(7);
  while (pieces.size() < 128000) pieces.push_back(pieces[rng() % 50000] + pieces[rng() % 50000]);
  const auto t0 = std::chrono::steady_clock::now();
  VocabTrie trie(pieces);
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto g = json_schema_grammar(json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "code": {"type": "string", "maxLength": 64}}, "required": ["name", "code"]})"));
  std::vector<uint64_t> mask;
  for (const char* prefix : {"{", "{\"name\": \"", "{\"name\": \"abc", "{\"name\": \"x\", \"code\": \"ab"}) {
    GrammarMatcher m(g);
    ASSERT_TRUE(m.advance(prefix));
    const auto a = std::chrono::steady_clock::now();
    m.fill_mask(trie, mask);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
    const auto b = std::chrono::steady_clock::now();
    m.fill_mask(trie, mask);  // the same state again: cached
    const double cached = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b).count();
    size_t n = 0;
    for (uint64_t w : mask) n += size_t(__builtin_popcountll(w));
    std::printf("mask after %-32s %7zu of %zu tokens: %.2f ms (cached %.3f ms)\n", prefix, n, pieces.size(), ms, cached);
    EXPECT_GT(n, 0u);
  }
  std::printf("trie of %zu pieces: %zu nodes, built in %.1f ms\n", pieces.size(), trie.node_count(), build_ms);
}

}  // namespace
}  // namespace baton
