// `baton split --tp N` and `baton merge` of tensor-parallel rank files: the
// files load as smaller models of the same architecture, carry the baton.tp.*
// keys, and merging every rank of every stage gives back the source byte for
// byte (stories260K and synthetic GQA llamas in F32, Q8_0 and Q4_K).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/arch/llama_family.h"
#include "engine/base/temp_file.h"
#include "engine/gguf/file.h"
#include "engine/model/arch.h"
#include "engine/model/part_info.h"
#include "engine/tp/slice.h"
#include "gguf_split/split.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;
using test::model_path;

CommandResult baton(std::vector<std::string> args) {
  args.insert(args.begin(), test::baton_binary());
  return test::run_command(args);
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Each rank file is a model of the source's architecture with divided head
// and FFN counts and the source's head dimension.
void expect_divided(const std::string& source, const std::string& rank_path, int n) {
  const GgufFile src = GgufFile::open(source), rank = GgufFile::open(rank_path);
  const auto full = Arch::from_gguf(src);
  const auto part = Arch::from_gguf(rank);
  ASSERT_EQ(part->name(), full->name());
  const LlamaHparams& a = dynamic_cast<const LlamaFamilyArch&>(*full).hparams();
  const LlamaHparams& b = dynamic_cast<const LlamaFamilyArch&>(*part).hparams();
  EXPECT_EQ(b.n_head, a.n_head / n) << rank_path;
  EXPECT_EQ(b.n_head_kv, a.n_head_kv / n) << rank_path;
  EXPECT_EQ(b.n_ff, a.n_ff / n) << rank_path;
  EXPECT_EQ(b.head_dim_k, a.head_dim_k) << rank_path;
  EXPECT_EQ(b.head_dim_v, a.head_dim_v) << rank_path;
  EXPECT_EQ(b.n_embd, a.n_embd) << rank_path;
  EXPECT_EQ(b.n_vocab, a.n_vocab) << rank_path;
  EXPECT_EQ(rank.get_int(tp_keys::kSize), n);
  EXPECT_EQ(split_key_u64(rank, split_keys::kSourceHash), src.tensor_table_hash());
  EXPECT_EQ(verify_part(rank), "");
}

TEST(SplitTp, Stories260KRanksLoadAndMergeByteIdentical) {
  test::TempDir tmp;
  const std::string src = model_path("stories260K.gguf");
  CommandResult r = baton({"split", src, "--tp", "2", "-o", tmp.file("ranks")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> files = files_in(tmp.path() / "ranks");
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(fs::path(files[0]).filename(), "stories260K.tp2-r0.gguf");
  EXPECT_EQ(fs::path(files[1]).filename(), "stories260K.tp2-r1.gguf");
  EXPECT_EQ(split_source_stem(fs::path(files[1]).stem().string()), "stories260K");
  for (int i = 0; i < 2; ++i) {
    expect_divided(src, files[size_t(i)], 2);
    EXPECT_EQ(GgufFile::open(files[size_t(i)]).get_int(tp_keys::kRank), i);
  }
  CommandResult in = baton({"inspect", files[1]});
  ASSERT_EQ(in.exit_code, 0) << in.err;
  EXPECT_NE(in.out.find("tensor-parallel rank 1 of 2"), std::string::npos) << in.out;
  EXPECT_NE(in.out.find("baton.tp.rank"), std::string::npos) << in.out;

  // Alone, a rank file is refused by the commands that run a model.
  CommandResult run = baton({"run", "-m", files[0], "-n", "1", "-p", "x"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("tensor-parallel rank 0 of 2"), std::string::npos) << run.err;

  CommandResult m = baton({"merge", files[1], files[0], "-o", tmp.file("merged.gguf")});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_TRUE(bytes_of(tmp.file("merged.gguf")) == bytes_of(src));

  // A missing rank and a repeated one are refused by name, and nothing is written.
  CommandResult missing = baton({"merge", files[0], "-o", tmp.file("m2.gguf")});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("rank 1 of 2 of part 1 of 1 is missing"), std::string::npos) << missing.err;
  CommandResult twice = baton({"merge", files[0], files[0], files[1], "-o", tmp.file("m3.gguf")});
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_NE(twice.err.find("given twice"), std::string::npos) << twice.err;
  EXPECT_FALSE(fs::exists(tmp.file("m2.gguf")));
  EXPECT_FALSE(fs::exists(tmp.file("m3.gguf")));

  // --rank writes one node's own file, the same bytes as in the full split.
  CommandResult one = baton({"split", src, "--tp", "2", "--rank", "1", "-o", tmp.file("one")});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::vector<std::string> own = files_in(tmp.path() / "one");
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(fs::path(own[0]).filename(), "stories260K.tp2-r1.gguf");
  EXPECT_TRUE(bytes_of(own[0]) == bytes_of(files[1]));
  CommandResult bad = baton({"split", src, "--tp", "2", "--rank", "2", "-o", tmp.file("bad")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--rank"), std::string::npos) << bad.err;
}

TEST(SplitTp, Stories260KStagesTimesRanksMergeByteIdentical) {
  test::TempDir tmp;
  const std::string src = model_path("stories260K.gguf");
  CommandResult r = baton({"split", src, "--tp", "2", "--layers", "0:2,3:output", "-o", tmp.file("ranks")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> files = files_in(tmp.path() / "ranks");
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(fs::path(files[0]).filename(), "stories260K-part1-of-2-layers-0-2.tp2-r0.gguf");
  EXPECT_EQ(fs::path(files[3]).filename(), "stories260K-part2-of-2-layers-3-4.tp2-r1.gguf");
  EXPECT_EQ(split_source_stem(fs::path(files[3]).stem().string()), "stories260K");
  for (const std::string& f : files) expect_divided(src, f, 2);
  const std::optional<PartInfo> last = read_part_info(GgufFile::open(files[3]));
  ASSERT_TRUE(last);
  EXPECT_EQ(last->range.first, 3);
  EXPECT_TRUE(last->has_output);

  std::vector<std::string> args = {"merge"};
  args.insert(args.end(), files.rbegin(), files.rend());
  args.insert(args.end(), {"-o", tmp.file("merged.gguf")});
  CommandResult m = baton(args);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_TRUE(bytes_of(tmp.file("merged.gguf")) == bytes_of(src));
  // Without the second stage's rank 0.
  CommandResult missing = baton({"merge", files[0], files[1], files[3], "-o", tmp.file("m2.gguf")});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("rank 0 of 2 of part 2 of 2 is missing"), std::string::npos) << missing.err;
}

struct SynthCase {
  DType type;
  int64_t n_embd, n_ff;
  int n_head, n_head_kv;
  bool tied;
};

// Synthetic GQA llamas through the function the engine's tests use, merged back.
TEST(SplitTp, SyntheticGqaLlamasMergeByteIdentical) {
  const SynthCase cases[] = {
      {DType::F32, 64, 128, 4, 2, false},   {DType::F32, 64, 128, 8, 4, true},
      {DType::Q8_0, 128, 256, 4, 2, false}, {DType::Q8_0, 128, 256, 8, 4, true},
      {DType::Q4_K, 512, 512, 4, 2, false},
  };
  for (const SynthCase& c : cases) {
    for (int n : {2, 4}) {
      if (c.n_head_kv % n != 0) continue;
      SCOPED_TRACE(std::string(dtype_name(c.type)) + " tp" + std::to_string(n) + (c.tied ? " tied" : ""));
      if (c.type == DType::Q4_K && n == 4) continue;  // 128-column cuts are not Q4_K block boundaries
      test::TempDir tmp;
      SynthConfig cfg;
      cfg.n_layer = 2;
      cfg.n_embd = c.n_embd;
      cfg.n_ff = c.n_ff;
      cfg.n_head = c.n_head;
      cfg.n_head_kv = c.n_head_kv;
      cfg.weight_type = c.type;
      cfg.tied_output = c.tied;
      const std::string src = tmp.file("synth.gguf");
      write_synthetic_model(src, cfg);
      for (const std::string layers : {"", "0:0,1:output"}) {
        const fs::path out = tmp.path() / (layers.empty() ? "one" : "two");
        const std::vector<std::string> files = write_tp_ranks(src, n, out.string(), layers);
        ASSERT_EQ(files.size(), size_t(n) * (layers.empty() ? 1 : 2));
        for (const std::string& f : files) expect_divided(src, f, n);
        // A tied head is split into each last-stage rank's own output.weight.
        const GgufFile last = GgufFile::open(files.back());
        ASSERT_NE(last.find_tensor("output.weight"), nullptr);
        std::vector<GgufFile> opened;
        for (const std::string& f : files) opened.push_back(GgufFile::open(f));
        const std::string merged = (out / "merged.gguf").string();
        merge_tp_ranks(opened, merged, nullptr);
        EXPECT_TRUE(bytes_of(merged) == bytes_of(src)) << layers;
      }
    }
  }
}

TEST(SplitTp, RefusesCutsThatCannotBeMadeBeforeWriting) {
  test::TempDir tmp;
  SynthConfig cfg;
  cfg.n_embd = 256;
  cfg.n_ff = 512;
  cfg.weight_type = DType::Q4_K;  // 4 heads of 64: half the heads is 128 columns, not a Q4_K block
  const std::string src = tmp.file("q4k.gguf");
  write_synthetic_model(src, cfg);
  CommandResult r = baton({"split", src, "--tp", "2", "-o", tmp.file("ranks")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("attn_output.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Q4_K"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 tensor-parallel ranks"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("ranks")) && !fs::is_empty(tmp.file("ranks")));
  // 4 ranks do not divide the default 2 KV heads.
  SynthConfig f32;
  write_synthetic_model(tmp.file("f32.gguf"), f32);
  CommandResult kv = baton({"split", tmp.file("f32.gguf"), "--tp", "4", "-o", tmp.file("ranks4")});
  EXPECT_NE(kv.exit_code, 0);
  EXPECT_NE(kv.err.find("head_count_kv = 2 is not a multiple of 4"), std::string::npos) << kv.err;
  EXPECT_FALSE(fs::exists(tmp.file("ranks4")) && !fs::is_empty(tmp.file("ranks4")));
}

TEST(SplitTp, Deepseek4TinyRanksMergeByteIdentical) {
  test::TempDir tmp;
  const std::string src = tmp.file("ds4.gguf");
  CommandResult s = baton({"synth", "--quiet", "--shape", "deepseek4-tiny", "-o", src});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  CommandResult r = baton({"split", src, "--tp", "2", "--layers", "0:2,3:output", "-o", tmp.file("ranks")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> files = files_in(tmp.path() / "ranks");
  ASSERT_EQ(files.size(), 4u);
  const GgufFile rank = GgufFile::open(files[3]);
  EXPECT_EQ(rank.get_int("deepseek4.attention.head_count"), 2);
  EXPECT_EQ(rank.get_int("deepseek4.attention.output_group_count"), 1);
  EXPECT_EQ(rank.get_int("deepseek4.expert_feed_forward_length"), 256);
  std::vector<std::string> args = {"merge"};
  args.insert(args.end(), files.begin(), files.end());
  args.insert(args.end(), {"-o", tmp.file("merged.gguf")});
  CommandResult m = baton(args);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_TRUE(bytes_of(tmp.file("merged.gguf")) == bytes_of(src));
  // 4 ranks do not divide its 2 output groups: refused naming the tensor, nothing written.
  CommandResult four = baton({"split", src, "--tp", "4", "-o", tmp.file("ranks4")});
  EXPECT_EQ(four.exit_code, 1) << four.err;
  EXPECT_NE(four.err.find("blk.0.attn_q_b.weight"), std::string::npos) << four.err;
  EXPECT_FALSE(fs::exists(tmp.file("ranks4")) && !fs::is_empty(tmp.file("ranks4")));
}

}  // namespace
}  // namespace baton
