// `baton synth`: the tensor tables and types of every shape, valid random
// data, determinism, the alias and sparse modes, the tokenizer sections, and
// refusals. Big shapes are written sparse only (a header and a hole).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/model/deepseek4_shape.h"
#include "engine/gguf/file.h"
#include "engine/plan/node_plan.h"
#include "engine/base/temp_file.h"
#include "engine/text/tokenizer.h"
#include "tests/test_util.h"

namespace baton {
namespace {

constexpr double kGiB = double(uint64_t(1) << 30);

test::CommandResult synth(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {test::baton_binary(), "synth", "--quiet"};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::run_command(argv);
}

uint64_t tensor_bytes(const GgufFile& f) {
  uint64_t n = 0;
  for (const auto& t : f.tensors()) n += t.nbytes;
  return n;
}

// Every tensor: finite values, not all zero; hash tables: distinct ids in range.
void expect_valid_data(const GgufFile& f, int64_t n_expert) {
  for (const auto& t : f.tensors()) {
    SCOPED_TRACE(t.name);
    std::vector<uint8_t> bytes(t.nbytes);
    f.read_tensor(t, bytes.data());
    if (t.type == DType::I32) {
      const auto* ids = reinterpret_cast<const int32_t*>(bytes.data());
      for (int64_t r = 0; r < t.ne[1]; ++r) {
        std::set<int32_t> row(ids + r * t.ne[0], ids + (r + 1) * t.ne[0]);
        ASSERT_EQ(int64_t(row.size()), t.ne[0]) << "row " << r << " repeats an expert";
        ASSERT_GE(*row.begin(), 0);
        ASSERT_LT(*row.rbegin(), n_expert);
      }
      continue;
    }
    const int64_t rows = int64_t(t.n_elements() / uint64_t(t.ne[0]));
    std::vector<float> row(size_t(t.ne[0]));
    bool nonzero = false;
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t.type, bytes.data() + uint64_t(r) * t.row_bytes(), row.data(), t.ne[0]);
      for (float v : row) {
        ASSERT_TRUE(std::isfinite(v)) << "row " << r;
        nonzero = nonzero || v != 0.0f;
      }
    }
    EXPECT_TRUE(nonzero) << "all zeros";
  }
}

TEST(CliSynth, HelpListsTheShapes) {
  auto r = synth({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"llama-tiny", "llama-1b", "llama-8b", "deepseek4-tiny", "deepseek4-flash", "sparse", "alias"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
}

TEST(CliSynth, Deepseek4TinyHasEveryLayerKindAndValidData) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  auto r = synth({"--arch", "deepseek4", "--shape", "deepseek4-tiny", "-o", dir.file("t.gguf"), "--seed",
                  std::to_string(seed)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const GgufFile f = GgufFile::open(dir.file("t.gguf"));
  const Deepseek4Shape s = Deepseek4Shape::from_gguf(f);
  EXPECT_EQ(s.compress_ratios, (std::vector<int>{0, 0, 4, 128, 4}));
  EXPECT_EQ(s.n_hash_layers, 3);
  // The file holds exactly the shape's table, with the Q2 file's types.
  const Ds4Types types = Ds4Types::q2();
  std::vector<Ds4TensorSpec> specs = s.embedding_tensors();
  for (int l = 0; l < s.n_layer; ++l) {
    for (auto& spec : s.layer_tensors(l)) specs.push_back(spec);
  }
  for (auto& spec : s.head_tensors()) specs.push_back(spec);
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (const auto& spec : specs) {
    const GgufTensorInfo* t = f.find_tensor(spec.name);
    ASSERT_NE(t, nullptr) << spec.name;
    EXPECT_EQ(std::vector<int64_t>(t->ne, t->ne + t->n_dims), spec.shape) << spec.name;
    EXPECT_EQ(t->type, types.of(spec.role)) << spec.name;
  }
  EXPECT_EQ(f.find_tensor("blk.4.ffn_gate_exps.weight")->type, DType::IQ2_XXS);
  EXPECT_EQ(f.find_tensor("blk.4.ffn_down_exps.weight")->type, DType::Q2_K);
  EXPECT_NE(f.find_tensor("blk.2.indexer.proj.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.3.indexer.proj.weight"), nullptr);
  EXPECT_NE(f.find_tensor("blk.3.attn_compressor_gate.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.1.attn_compressor_gate.weight"), nullptr);
  EXPECT_NE(f.find_tensor("blk.2.ffn_gate_tid2eid.weight"), nullptr);
  EXPECT_NE(f.find_tensor("blk.3.exp_probs_b.bias"), nullptr);
  expect_valid_data(f, s.n_expert);
  ModelPlanner planner(f);  // the planner accepts its table
  EXPECT_EQ(planner.n_layer(), 5);

  // A real byte-level BPE tokenizer with DeepSeek's specials, sized like the embedding.
  EXPECT_EQ(f.get_str("tokenizer.ggml.pre"), "deepseek-v3");
  auto tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok->n_vocab(), f.find_tensor("token_embd.weight")->ne[1]);
  EXPECT_EQ(tok->n_vocab(), s.n_vocab);
  const std::string text = "Once upon a time, the big dog said: 42! <think>";
  const auto ids = tok->encode(text, true, true);
  EXPECT_EQ(ids.front(), tok->bos());
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_LT(ids.size(), text.size()) << "merges applied";
  const auto* vt = dynamic_cast<const VocabTokenizer*>(tok.get());
  ASSERT_NE(vt, nullptr);
  for (const char* special : {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜end▁of▁sentence｜>"}) {
    EXPECT_GE(vt->find(special), 0) << special;
  }
  EXPECT_TRUE(tok->is_eog(vt->find("<｜end▁of▁sentence｜>")));
}

TEST(CliSynth, SameSeedSameFileOtherSeedOtherData) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  for (const char* name : {"a", "b"}) {
    ASSERT_EQ(synth({"--shape", "llama-tiny-q8_0", "-o", dir.file(name), "--seed", std::to_string(seed)}).exit_code, 0);
  }
  ASSERT_EQ(synth({"--shape", "llama-tiny", "--type", "q8_0", "-o", dir.file("c"), "--seed", std::to_string(seed + 1)})
                .exit_code,
            0);
  EXPECT_EQ(test::read_file(dir.file("a")), test::read_file(dir.file("b")));
  const GgufFile a = GgufFile::open(dir.file("a")), c = GgufFile::open(dir.file("c"));
  ASSERT_EQ(a.tensors().size(), c.tensors().size());
  const GgufTensorInfo* ta = a.find_tensor("blk.1.ffn_up.weight");
  const GgufTensorInfo* tc = c.find_tensor("blk.1.ffn_up.weight");
  ASSERT_TRUE(ta && tc);
  EXPECT_EQ(ta->type, DType::Q8_0);
  std::vector<uint8_t> da(ta->nbytes), dc(tc->nbytes);
  a.read_tensor(*ta, da.data());
  c.read_tensor(*tc, dc.data());
  EXPECT_NE(da, dc);
  expect_valid_data(a, 0);
}

TEST(CliSynth, LlamaTinyRunsAndTokenizes) {
  test::TempDir dir;
  for (const char* type : {"f32", "q4_k"}) {
    SCOPED_TRACE(type);
    const std::string path = dir.file(std::string("tiny-") + type + ".gguf");
    ASSERT_EQ(synth({"--arch", "llama", "--shape", "llama-tiny", "--type", type, "-o", path}).exit_code, 0);
    const GgufFile f = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(f);
    EXPECT_EQ(tok->n_vocab(), f.find_tensor("token_embd.weight")->ne[1]);
    std::string text = tok->decode(tok->encode("Once upon a time", false, false));
    if (text.starts_with(' ')) text.erase(0, 1);  // SentencePiece's space prefix
    EXPECT_EQ(text, "Once upon a time");
    auto r = test::run_command({test::baton_binary(), "run", "-m", path, "-n", "4", "--temp", "0", "-t", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
}

// Regression: a synth killed mid-write (SIGXFSZ here) left its temporary
// file beside the output for good; the next synth to that folder removes
// it (engine/base/temp_file.h) and writes the same file as an uninterrupted run.
TEST(CliSynth, TheNextSynthRemovesWhatAKilledOneLeft) {
  test::TempDir dir;
  const std::string out = dir.file("tiny.gguf");
  test::CommandResult r = test::run_command({"/bin/sh", "-c", "ulimit -f 64; exec \"$0\" \"$@\"",
                                             test::baton_binary(), "synth", "--quiet", "--shape", "llama-tiny",
                                             "-o", out});
  ASSERT_EQ(r.exit_code, -1) << "not killed by SIGXFSZ: " << r.err;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) left.push_back(e.path().string());
  ASSERT_EQ(left.size(), 1u);
  ASSERT_TRUE(temp_file_owner(std::filesystem::path(left[0]).filename().string()).has_value()) << left[0];
  r = synth({"--shape", "llama-tiny", "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("removed " + left[0]), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(left[0]));
  ASSERT_EQ(synth({"--shape", "llama-tiny", "-o", dir.file("ref.gguf")}).exit_code, 0);
  EXPECT_EQ(test::read_file(out), test::read_file(dir.file("ref.gguf")));
}

TEST(CliSynth, AliasSharesBytesPerPattern) {
  test::TempDir dir;
  ASSERT_EQ(synth({"--shape", "deepseek4-tiny-q4", "--data", "alias", "-o", dir.file("a.gguf")}).exit_code, 0);
  const GgufFile f = GgufFile::open(dir.file("a.gguf"));
  auto bytes = [&](const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<uint8_t> b(t ? t->nbytes : 0);
    if (t) f.read_tensor(*t, b.data());
    return b;
  };
  EXPECT_EQ(f.find_tensor("blk.0.ffn_up_exps.weight")->type, DType::Q4_K);
  EXPECT_EQ(bytes("blk.0.ffn_up_exps.weight"), bytes("blk.4.ffn_up_exps.weight"));
  EXPECT_NE(bytes("blk.0.ffn_up_exps.weight"), bytes("blk.0.ffn_gate_exps.weight"));
  EXPECT_EQ(bytes("blk.2.attn_compressor_kv.weight"), bytes("blk.4.attn_compressor_kv.weight"));
  // Same pattern, other shape (ratio 128 has one compressor lane): not shared.
  EXPECT_NE(f.find_tensor("blk.3.attn_compressor_kv.weight")->ne[1], f.find_tensor("blk.2.attn_compressor_kv.weight")->ne[1]);
  expect_valid_data(f, 8);
  // The head is Random's, byte for byte (distinct rows: no logit ties).
  ASSERT_EQ(synth({"--shape", "deepseek4-tiny-q4", "-o", dir.file("r.gguf")}).exit_code, 0);
  const GgufFile r = GgufFile::open(dir.file("r.gguf"));
  const GgufTensorInfo* head = r.find_tensor("output.weight");
  ASSERT_NE(head, nullptr);
  std::vector<uint8_t> random_head(head->nbytes);
  r.read_tensor(*head, random_head.data());
  EXPECT_EQ(bytes("output.weight"), random_head);
}

TEST(CliSynth, SparseFullSizeShapes) {
  test::TempDir dir;
  struct Case {
    std::string shape;
    double gib_lo, gib_hi;
    DType expert;
  };
  for (const Case& c : {Case{"deepseek4-flash-q2", 80.755, 80.765, DType::IQ2_XXS},
                        Case{"deepseek4-flash-q4", 152.5, 153.5, DType::Q4_K}}) {
    SCOPED_TRACE(c.shape);
    const std::string path = dir.file(c.shape + ".gguf");
    auto r = synth({"--arch", "deepseek4", "--shape", c.shape, "--data", "sparse", "-o", path});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const GgufFile f = GgufFile::open(path);
    const double gib = double(tensor_bytes(f)) / kGiB;
    EXPECT_GT(gib, c.gib_lo);
    EXPECT_LT(gib, c.gib_hi);
    EXPECT_EQ(f.find_tensor("blk.42.ffn_gate_exps.weight")->type, c.expert);
    EXPECT_EQ(f.find_tensor("blk.42.attn_q_b.weight")->type, DType::Q8_0);
    EXPECT_EQ(f.find_tensor("token_embd.weight")->type, DType::F16);
    EXPECT_EQ(f.find_tensor("token_embd.weight")->ne[1], 129280);
    EXPECT_EQ(f.get_int("deepseek4.vocab_size"), 129280);
    EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").items.size(), 129280u);
    // The hole takes (almost) no disk.
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(uint64_t(st.st_size), f.file_size());
    EXPECT_LT(uint64_t(st.st_blocks) * 512, uint64_t(64) << 20);
  }
  auto r = synth({"--shape", "llama-8b-q4_k", "--data", "sparse", "-o", dir.file("8b.gguf")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const GgufFile f = GgufFile::open(dir.file("8b.gguf"));
  EXPECT_EQ(f.tensors().size(), 32u * 9u + 3u);
  EXPECT_EQ(f.find_tensor("blk.31.ffn_down.weight")->type, DType::Q4_K);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->ne[1], 128256);
  EXPECT_NEAR(double(tensor_bytes(f)) / kGiB, 4.2, 0.3);
}

// --layers N: the first N layers, each as big as in the whole shape; the
// model loads and plans as an N-layer model of the same kind.
TEST(CliSynth, LayersWritesTheFirstLayersAtFullSize) {
  test::TempDir dir;
  const std::string whole = dir.file("whole.gguf"), part = dir.file("20.gguf");
  ASSERT_EQ(synth({"--shape", "deepseek4-flash-q2", "--data", "sparse", "-o", whole}).exit_code, 0);
  auto r = synth({"--shape", "deepseek4-flash-q2", "--data", "sparse", "--layers", "20", "-o", part});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const GgufFile a = GgufFile::open(whole), b = GgufFile::open(part);
  EXPECT_EQ(b.get_int("deepseek4.block_count"), 20);
  EXPECT_EQ(b.get_int("baton.synth.layers"), 20);
  EXPECT_EQ(b.find_tensor("blk.20.attn_q_a.weight"), nullptr);
  for (const char* name : {"blk.19.ffn_gate_exps.weight", "blk.19.attn_compressor_kv.weight", "blk.2.indexer.proj.weight",
                           "token_embd.weight", "output.weight"}) {
    SCOPED_TRACE(name);
    ASSERT_NE(b.find_tensor(name), nullptr);
    EXPECT_EQ(b.find_tensor(name)->nbytes, a.find_tensor(name)->nbytes);
  }
  const Deepseek4Shape s = Deepseek4Shape::from_gguf(b);
  EXPECT_EQ(s.n_layer, 20);
  EXPECT_EQ(s.compress_ratios.size(), 20u);
  // 23 layers fewer, each about 1.85 GiB (Flash's are all alike in size but
  // for the three hash layers' tables and the two sliding-only layers).
  const double per_layer = double(tensor_bytes(a) - tensor_bytes(b)) / 23.0;
  EXPECT_GT(per_layer, 1.7 * kGiB);
  EXPECT_LT(per_layer, 2.0 * kGiB);
  EXPECT_LT(double(tensor_bytes(b)) / kGiB, 40.0);

  r = synth({"--shape", "llama-tiny", "--layers", "1", "-o", dir.file("t1.gguf")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(GgufFile::open(dir.file("t1.gguf")).get_int("llama.block_count"), 1);
  auto run = test::run_command({test::baton_binary(), "run", "-m", dir.file("t1.gguf"), "-p", "a", "-n", "4",
                                "--backend", "cpu"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

TEST(CliSynth, Refusals) {
  test::TempDir dir;
  const std::string out = dir.file("x.gguf");
  auto expect_refused = [&](std::vector<std::string> args, const char* says) {
    args.push_back("-o");
    args.push_back(out);
    auto r = synth(args);
    EXPECT_EQ(r.exit_code, 1) << args[1];
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  };
  expect_refused({"--shape", "llama-70b"}, "unknown shape");
  expect_refused({"--shape", "llama-8b-q8_0", "--type", "q4_k"}, "--type");
  expect_refused({"--shape", "llama-8b", "--type", "q2"}, "no type");
  expect_refused({"--shape", "deepseek4-tiny", "--arch", "llama"}, "deepseek4");
  expect_refused({"--shape", "llama-tiny", "--data", "zeros"}, "--data");
  expect_refused({"--shape", "llama-tiny", "--layers", "3"}, "--layers must be 1 to 2");
  expect_refused({"--shape", "deepseek4-tiny", "--layers", "-1"}, "--layers");
  EXPECT_EQ(synth({"--shape", "llama-tiny"}).exit_code, 1);  // no -o
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace baton
