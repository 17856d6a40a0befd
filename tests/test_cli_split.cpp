// `baton split` and `baton merge`: parts hold only their slice, carry the
// baton.split.* keys and a valid checksum, and merging gives back the source
// byte for byte (also from a llama.cpp shard set).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <optional>

#include "coordinator/api/generation.h"
#include "engine/gguf/file.h"
#include "engine/model/files.h"
#include "engine/model/part_info.h"
#include "engine/base/temp_file.h"
#include "gguf_split/split.h"
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

std::vector<uint8_t> tensor_bytes(const GgufFile& f, const GgufTensorInfo& t) {
  std::vector<uint8_t> b(t.nbytes);
  f.read_tensor(t, b.data());
  return b;
}

TEST(Split, PartsHoldOnlyTheirSliceAndMergeBackByteIdentical) {
  test::TempDir tmp;
  const std::string src = model_path("stories260K.gguf");
  CommandResult r = baton({"split", src, "--layers", "0:2,3:output", "-o", tmp.file("parts")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> parts = files_in(tmp.path() / "parts");
  ASSERT_EQ(parts.size(), 2u);

  GgufFile source = GgufFile::open(src);
  GgufFile p0 = GgufFile::open(parts[0]);
  GgufFile p1 = GgufFile::open(parts[1]);
  EXPECT_EQ(p0.get_int(split_keys::kLayerFirst), 0);
  EXPECT_EQ(p0.get_int(split_keys::kLayerLast), 2);
  EXPECT_TRUE(p0.get_bool(split_keys::kHasEmbedding, false));
  EXPECT_FALSE(p0.get_bool(split_keys::kHasOutput, true));
  EXPECT_EQ(p1.get_int(split_keys::kLayerFirst), 3);
  EXPECT_EQ(p1.get_int(split_keys::kLayerLast), 4);
  EXPECT_TRUE(p1.get_bool(split_keys::kHasOutput, false));
  EXPECT_EQ(p1.get_int(split_keys::kIndex), 1);
  EXPECT_EQ(p1.get_int(split_keys::kCount), 2);
  for (const GgufFile* p : {&p0, &p1}) {
    const GgufValue* hash = p->find(split_keys::kSourceHash);
    ASSERT_NE(hash, nullptr);
    EXPECT_EQ(hash->type, GgufType::UINT64);
    EXPECT_EQ(hash->num.u, source.tensor_table_hash());
    EXPECT_EQ(verify_part(*p), "");
    // All source metadata is there, unchanged.
    for (const auto& [key, value] : source.metadata()) {
      const GgufValue* v = p->find(key);
      ASSERT_NE(v, nullptr) << key;
      EXPECT_EQ(v->type, value.type) << key;
    }
  }
  // Each part holds exactly its layers, embedding or head, with the source's bytes.
  size_t total = 0;
  for (const GgufFile* p : {&p0, &p1}) {
    const int first = int(p->get_int(split_keys::kLayerFirst)), last = int(p->get_int(split_keys::kLayerLast));
    for (const GgufTensorInfo& t : p->tensors()) {
      TensorPlace place = tensor_place(t.name);
      if (place.kind == TensorPlace::kLayer) {
        EXPECT_TRUE(place.layer >= first && place.layer <= last) << t.name << " in part " << first << ":" << last;
      } else if (place.kind == TensorPlace::kEmbedding) {
        EXPECT_EQ(p, &p0) << t.name;
      } else if (place.kind == TensorPlace::kOutput) {
        EXPECT_EQ(p, &p1) << t.name;
      }
      const GgufTensorInfo* s = source.find_tensor(t.name);
      ASSERT_NE(s, nullptr) << t.name;
      EXPECT_EQ(tensor_bytes(*p, t), tensor_bytes(source, *s)) << t.name;
      ++total;
    }
  }
  EXPECT_EQ(total, source.tensors().size());

  // Merging (parts given in any order) rebuilds the source file exactly.
  const std::string merged = tmp.file("merged.gguf");
  r = baton({"merge", parts[1], parts[0], "-o", merged});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(merged), test::read_file(src));
}

// The model id a server reports for a part is the model's name, not the
// part's: the stem its file name was made from.
TEST(Split, APartServesUnderTheNameOfItsModel) {
  EXPECT_EQ(split_source_stem("ds4-q4-part1-of-2-layers-0-21"), "ds4-q4");
  EXPECT_EQ(split_source_stem("stories260K-part2-of-2-layers-3-4"), "stories260K");
  EXPECT_EQ(split_source_stem("stories260K"), "stories260K");
  EXPECT_EQ(split_source_stem("-part1-of-2-layers-0-2"), "-part1-of-2-layers-0-2");  // nothing would be left
  EXPECT_EQ(split_source_stem("x-part1-of-2-layers-0-2b"), "x-part1-of-2-layers-0-2b");
  test::TempDir tmp;
  CommandResult r = baton({"split", model_path("stories260K.gguf"), "--layers", "0:2,3:output", "-o", tmp.file("p")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string part = files_in(tmp.path() / "p")[0];
  EXPECT_EQ(model_info_from_gguf(GgufFile::open(part), part, "", 256).id, "stories260K");
}

TEST(Split, DryRunWritesNothing) {
  test::TempDir tmp;
  CommandResult r = baton({"split", model_path("stories260K.gguf"), "--layers", "0:1,2:3,4:output", "-o",
                           tmp.file("out"), "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("part 3/3  layers 4:4 +output"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dry run: nothing written"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(tmp.path() / "out"));
  EXPECT_TRUE(files_in(tmp.path()).empty());
}

TEST(Split, BadRangesAndBadPartsAreRefused) {
  test::TempDir tmp;
  const std::string src = model_path("stories260K.gguf");
  struct Case {
    std::string layers, expect;
  } cases[] = {
      {"0:2,4:output", "contiguously"},  // gap
      {"0:2", "end at layer 2"},         // short
      {"0:9", "contiguously"},           // past the end
      {"0-4", "expected FIRST:LAST"},
      {"0:x", "not a layer number"},
  };
  for (const Case& c : cases) {
    CommandResult r = baton({"split", src, "--layers", c.layers, "-o", tmp.file("p")});
    EXPECT_EQ(r.exit_code, 1) << c.layers;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.layers << ": " << r.err;
    EXPECT_FALSE(fs::exists(tmp.path() / "p")) << c.layers;
  }
  CommandResult r = baton({"split", src, "--layers", "0:2,3:4", "-o", tmp.file("p")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> parts = files_in(tmp.path() / "p");
  ASSERT_EQ(parts.size(), 2u);
  // A missing part is named.
  r = baton({"merge", parts[0], "-o", tmp.file("m.gguf")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("part 2 of 2 is missing"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("m.gguf")));
  // A damaged part fails its checksum, and merge refuses it.
  std::vector<uint8_t> bytes = test::read_file(parts[1]);
  bytes[bytes.size() - 5] ^= 0x5a;
  test::write_file(parts[1], bytes);
  EXPECT_NE(verify_part(GgufFile::open(parts[1])).find("checksum mismatch"), std::string::npos);
  r = baton({"merge", parts[0], parts[1], "-o", tmp.file("m.gguf")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("m.gguf")));
  for (const std::string& f : files_in(tmp.path())) EXPECT_EQ(f.find(".tmp"), std::string::npos) << f << " is left";
}

// Regression (the split fuzz target's invariants): part keys are range
// checked before they are narrowed or size anything. A u64 index of 2^32 read
// as part 0, and a part count of 4e9 sized a 32 GB table in merge.
TEST(Split, PartKeysOutOfRangeAreRefused) {
  test::TempDir tmp;
  auto part = [&](const std::string& name, GgufValue index, GgufValue count) {
    GgufWriter w;
    w.set("general.architecture", GgufValue::of_str("llama"));
    w.set(split_keys::kSourceHash, GgufValue::of_u64(42));
    w.set(split_keys::kIndex, index);
    w.set(split_keys::kCount, count);
    w.set(split_keys::kLayerFirst, GgufValue::of_u32(0));
    w.set(split_keys::kLayerLast, GgufValue::of_u32(0));
    w.set(split_keys::kDataChecksum, GgufValue::of_u64(0x2d06800538d394c2ull));  // XXH3-64 of no bytes
    w.write(tmp.file(name));
    return tmp.file(name);
  };
  const std::string wide = part("wide.gguf", GgufValue::of_u64(uint64_t(1) << 32), GgufValue::of_u32(2));
  EXPECT_THROW(read_part_info(GgufFile::open(wide)), std::runtime_error);
  const std::string many = part("many.gguf", GgufValue::of_u32(0), GgufValue::of_u32(4000000000u));
  EXPECT_THROW(read_part_info(GgufFile::open(many)), std::runtime_error);
  ASSERT_EQ(verify_part(GgufFile::open(many)), "");
  try {
    merge_parts({many}, tmp.file("m.gguf"), nullptr);
    ADD_FAILURE() << "merge accepted a part count of 4e9";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("part count"), std::string::npos) << e.what();
  }
  // In range, the same keys read back exactly.
  const auto ok = read_part_info(GgufFile::open(part("ok.gguf", GgufValue::of_u64(1), GgufValue::of_u32(2))));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->index, 1);
  EXPECT_EQ(ok->count, 2);
}

// A llama.cpp shard set as input: shard 1 carries the metadata and split.*
// keys, the tensors are spread over both shards.
TEST(Split, ShardSetInputIsReadAsOneModel) {
  test::TempDir tmp;
  const std::string src = model_path("stories260K.gguf");
  GgufFile source = GgufFile::open(src);
  const auto& ts = source.tensors();
  const size_t half = ts.size() / 2;
  for (int shard = 0; shard < 2; ++shard) {
    GgufWriter w;
    if (shard == 0) {
      for (const auto& [k, v] : source.metadata()) w.set(k, v);
    }
    w.set("split.no", GgufValue::of_u32(uint32_t(shard)));  // u16 in llama.cpp; any integer reads
    w.set("split.count", GgufValue::of_u32(2));
    w.set("split.tensors.count", GgufValue::of_i32(int32_t(ts.size())));
    for (size_t i = shard == 0 ? 0 : half; i < (shard == 0 ? half : ts.size()); ++i) {
      w.add_tensor(ts[i].name, ts[i].type, std::vector<int64_t>(ts[i].ne, ts[i].ne + ts[i].n_dims),
                   tensor_bytes(source, ts[i]));
    }
    w.write(tmp.file("model-0000" + std::to_string(shard + 1) + "-of-00002.gguf"));
  }
  ModelFiles m = ModelFiles::open(tmp.file("model-00002-of-00002.gguf"));
  EXPECT_EQ(m.files().size(), 2u);
  EXPECT_EQ(m.tensors().size(), ts.size());
  EXPECT_EQ(m.tensor_table_hash(), source.tensor_table_hash());

  CommandResult r = baton({"split", tmp.file("model-00001-of-00002.gguf"), "--layers", "0:1,2:output", "-o",
                           tmp.file("parts")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> parts = files_in(tmp.path() / "parts");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_FALSE(GgufFile::open(parts[0]).has("split.count"));  // a part is a whole file, not a shard
  r = baton({"merge", parts[0], parts[1], "-o", tmp.file("merged.gguf")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(tmp.file("merged.gguf")), test::read_file(src));

  // A shard set with a shard missing is refused by name.
  fs::remove(tmp.file("model-00002-of-00002.gguf"));
  r = baton({"inspect", tmp.file("model-00002-of-00002.gguf")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THROW(ModelFiles::open(tmp.file("model-00001-of-00002.gguf")), std::exception);
}

// Regression: the writers opened PATH.tmp with O_CREAT|O_TRUNC, so a link
// planted at that name made split, synth and logits overwrite the link's
// target, and the link was then renamed into place.
TEST(Split, WritersNeverFollowALinkPlantedBesideTheirOutput) {
  test::TempDir tmp;
  const std::vector<uint8_t> keep = {'k', 'e', 'e', 'p'};
  const std::string victim = tmp.file("victim");
  test::write_file(victim, keep);
  fs::create_directories(tmp.path() / "parts");
  const std::vector<std::string> outs = {tmp.file("parts/stories260K-part1-of-2-layers-0-0.gguf"),
                                         tmp.file("parts/stories260K-part2-of-2-layers-1-4.gguf"),
                                         tmp.file("synth.gguf"), tmp.file("logits.npy")};
  for (const std::string& o : outs) fs::create_symlink(victim, o + ".tmp");
  CommandResult r = baton({"split", model_path("stories260K.gguf"), "--layers", "0:0,1:output", "-o", tmp.file("parts")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = baton({"synth", "--shape", "llama-tiny", "--quiet", "-o", outs[2]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = baton({"logits", "-m", model_path("stories260K.gguf"), "--tokens", "1,2", "-o", outs[3]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(victim), keep);
  for (const std::string& o : outs) {
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(o))) << o;
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(o + ".tmp"))) << o << ".tmp was replaced";
  }
}

// Regression: when part 2 failed (a full disk), part 1 stayed. All parts or
// none; the error starts a line of its own after the progress line. The
// file size limit stands in for the full disk: part 1 (318 KiB) fits under
// 600 KiB (POSIX sh counts ulimit -f in 512-byte blocks), part 2 (852 KiB)
// does not.
TEST(Split, AFailedPartLeavesNoPartAndNoTemporaryFile) {
  test::TempDir tmp;
  fs::create_directories(tmp.path() / "parts");
  const std::string cmd = "trap '' XFSZ; ulimit -f 1200; exec \"$0\" \"$@\"";
  CommandResult r = test::run_command({"/bin/sh", "-c", cmd, test::baton_binary(), "split",
                                       model_path("stories260K.gguf"), "--layers", "0:0,1:output", "-o",
                                       tmp.file("parts")});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\nbaton split: "), std::string::npos) << "the error shares the progress line: " << r.err;
  EXPECT_EQ(files_in(tmp.path() / "parts"), std::vector<std::string>{});
}

// Regression: a writer killed mid-write (SIGKILL, or SIGXFSZ as here: the
// file size limit with the signal's default action) left its temporary
// parts in the output folder for good. Temporary names carry the writer's
// host and pid (engine/base/temp_file.h); the next split into the folder removes
// those whose process is gone, and leaves a live process's and another
// machine's (a shared folder) alone.
TEST(Split, TheNextSplitRemovesWhatAKilledSplitLeft) {
  test::TempDir tmp;
  const std::string src = model_path("stories260K.gguf");
  const std::string parts = tmp.file("parts");
  fs::create_directories(parts);
  CommandResult r = test::run_command({"/bin/sh", "-c", "ulimit -f 1200; exec \"$0\" \"$@\"", test::baton_binary(),
                                       "split", src, "--layers", "0:0,1:output", "-o", parts});
  ASSERT_EQ(r.exit_code, -1) << "not killed by SIGXFSZ: " << r.err;
  const std::vector<std::string> left = files_in(parts);
  ASSERT_EQ(left.size(), 2u) << "part 1 complete and part 2 cut short, both under temporary names";
  std::optional<TempFileOwner> owner;
  for (const std::string& f : left) {
    owner = temp_file_owner(fs::path(f).filename().string());
    ASSERT_TRUE(owner.has_value()) << f;
    EXPECT_NE(owner->target.find("stories260K"), std::string::npos) << f;
  }
  // Beside them: a live process's temporary (this test's) and one of the
  // killed pid on another machine.
  const std::string other_host = owner->host == "elsewhere" ? "elsewhere2" : "elsewhere";
  const std::string live = parts + "/x.gguf.baton-" + owner->host + "-" + std::to_string(getpid()) + "-AbCd12.tmp";
  const std::string foreign = parts + "/x.gguf.baton-" + other_host + "-" + std::to_string(owner->pid) + "-AbCd12.tmp";
  test::write_file(live, {1});
  test::write_file(foreign, {2});

  r = baton({"split", src, "--layers", "0:0,1:output", "-o", parts});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& f : left) {
    EXPECT_FALSE(fs::exists(f)) << f << " is left";
    EXPECT_NE(r.out.find("removed " + f), std::string::npos) << r.out;
  }
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(foreign));
  fs::remove(live);
  fs::remove(foreign);
  // The parts are those of a split that nothing interrupted.
  r = baton({"split", src, "--layers", "0:0,1:output", "-o", tmp.file("ref")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> got = files_in(parts), want = files_in(tmp.path() / "ref");
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(want.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(fs::path(got[i]).filename(), fs::path(want[i]).filename());
    EXPECT_EQ(test::read_file(got[i]), test::read_file(want[i])) << got[i];
  }
}

TEST(Split, TemporaryNamesSayWhoWroteThem) {
  test::TempDir tmp;
  const std::string target = tmp.file("m-host-1.gguf");
  TempFile t(target);
  const std::string name = fs::path(t.path()).filename().string();
  const std::optional<TempFileOwner> o = temp_file_owner(name);
  ASSERT_TRUE(o.has_value()) << name;
  EXPECT_EQ(o->target, "m-host-1.gguf");
  EXPECT_EQ(o->pid, long(getpid()));
  EXPECT_FALSE(o->host.empty());
  EXPECT_EQ(name, "m-host-1.gguf.baton-" + o->host + "-" + std::to_string(getpid()) + "-" +
                      name.substr(name.size() - 10, 6) + ".tmp");
  // A live writer's file is never removed.
  EXPECT_EQ(remove_stale_temp_files(tmp.path().string()), std::vector<std::string>{});
  EXPECT_TRUE(fs::exists(t.path()));
  // Names that are not Baton's temporaries.
  for (const char* other : {"m.gguf", "m.gguf.tmp", "m.gguf.AbCdEf.tmp", "m.gguf.baton-h-12-AbCd.tmp",
                            "m.gguf.baton-h-x1-AbCdEf.tmp", "m.gguf.baton--12-AbCdEf.tmp", ".baton-h-12-AbCdEf.tmp",
                            "m.gguf.baton-h.x-12-AbCdEf.tmp", "m.gguf.baton-12-AbCdEf.tmp"}) {
    EXPECT_FALSE(temp_file_owner(other).has_value()) << other;
  }
  const std::optional<TempFileOwner> dashed = temp_file_owner("a.b.baton-my-host-7-AbCdEf.tmp");
  ASSERT_TRUE(dashed.has_value());
  EXPECT_EQ(dashed->target, "a.b");
  EXPECT_EQ(dashed->host, "my-host");
  EXPECT_EQ(dashed->pid, 7);
}

TEST(Split, ShardPathNaming) {
  int n = 0;
  EXPECT_EQ(shard_path("/a/m-00002-of-00005.gguf", 4, &n), "/a/m-00004-of-00005.gguf");
  EXPECT_EQ(n, 5);
  EXPECT_EQ(shard_path("/a/m.gguf", 1), "");
  EXPECT_EQ(shard_path("/a/m-00006-of-00005.gguf", 1), "");
  EXPECT_EQ(shard_path("/a/m-0000x-of-00005.gguf", 1), "");
}

}  // namespace
}  // namespace baton
