// GGUF reader and writer: the fixtures, a seeded round trip of every value
// type, a rewrite of stories260K, every truncation of the header and the
// hostile images of gguf_hostile.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include <sys/stat.h>

#include "engine/gguf/file.h"
#include "tests/gguf_hostile.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::model_path;

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case GgufType::STRING: return a.str == b.str;
    case GgufType::ARRAY:
      if (a.elem_type != b.elem_type || a.items.size() != b.items.size()) return false;
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (!same_value(a.items[i], b.items[i])) return false;
      }
      return true;
    default: return a.num.u == b.num.u;  // bit-exact, floats included
  }
}

// A random value of type t; arrays nest up to `depth` more levels.
GgufValue random_value(std::mt19937_64& rng, GgufType t, int depth) {
  GgufValue v;
  v.type = t;
  uint64_t r = rng();
  switch (t) {
    case GgufType::UINT8: v.num.u = uint8_t(r); break;
    case GgufType::INT8: v.num.i = int8_t(r); break;
    case GgufType::UINT16: v.num.u = uint16_t(r); break;
    case GgufType::INT16: v.num.i = int16_t(r); break;
    case GgufType::UINT32: v.num.u = uint32_t(r); break;
    case GgufType::INT32: v.num.i = int32_t(r); break;
    case GgufType::UINT64: v.num.u = r; break;
    case GgufType::INT64: v.num.i = int64_t(r); break;
    case GgufType::BOOL: v.num.u = r & 1; break;
    case GgufType::FLOAT32: v.num.f = double(float(std::normal_distribution<double>(0, 1e3)(rng))); break;
    case GgufType::FLOAT64: v.num.f = std::normal_distribution<double>(0, 1e9)(rng); break;
    case GgufType::STRING: {
      v.str.resize(r % 24);  // any bytes, NUL and non-ASCII included
      for (char& c : v.str) c = char(rng());
      break;
    }
    case GgufType::ARRAY: {
      int n_types = depth > 0 ? 13 : 12;  // no arrays of arrays below the last level
      uint32_t e = uint32_t(rng() % n_types);
      if (depth == 0 && e >= uint32_t(GgufType::ARRAY)) ++e;  // skip ARRAY
      v.elem_type = GgufType(e);
      size_t n = rng() % 7;
      for (size_t i = 0; i < n; ++i) v.items.push_back(random_value(rng, v.elem_type, depth - 1));
      break;
    }
  }
  return v;
}

// Bytes of a value's encoding (without its type tag), per the GGUF spec.
uint64_t encoded_size(const GgufValue& v) {
  switch (v.type) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: return 8 + v.str.size();
    case GgufType::ARRAY: {
      uint64_t n = 4 + 8;
      for (const auto& item : v.items) n += encoded_size(item);
      return n;
    }
  }
  return 0;
}

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, uint64_t n) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// --- fixtures ---------------------------------------------------------------

TEST(GgufReader, Stories260K) {
  GgufFile f = GgufFile::open(model_path("stories260K.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.file_size(), 1185376u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset(), 14176u);
  EXPECT_EQ(f.metadata().size(), 19u);
  EXPECT_EQ(f.metadata().front().first, "tokenizer.ggml.tokens");
  EXPECT_EQ(f.get_str("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 5);
  EXPECT_EQ(f.get_int("tokenizer.ggml.padding_token_id"), 0xFFFFFFFFll);
  EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-10);
  const GgufValue& tokens = f.get_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.elem_type, GgufType::STRING);
  ASSERT_EQ(tokens.items.size(), 512u);
  EXPECT_EQ(tokens.items[0].as_str(), "<unk>");
  EXPECT_EQ(tokens.items[1].as_str(), "<s>");
  EXPECT_EQ(f.get_array("tokenizer.ggml.token_type").items[0].as_int(), 2);

  EXPECT_EQ(f.get_int("no.such.key", 7), 7);
  EXPECT_EQ(f.get_str("no.such.key", "x"), "x");
  EXPECT_TRUE(f.get_bool("no.such.key", true));
  EXPECT_THROW(f.get_int("no.such.key"), std::runtime_error);
  try {
    f.get_int("general.name");
    FAIL() << "a string read as an integer";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("general.name"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.get_array("llama.block_count"), std::runtime_error);
  EXPECT_THROW(f.get_bool("llama.block_count", false), std::runtime_error);

  ASSERT_EQ(f.tensors().size(), 48u);
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->n_dims, 2u);
  EXPECT_EQ(emb->ne[0], 64);
  EXPECT_EQ(emb->ne[1], 512);
  EXPECT_EQ(emb->type, DType::F32);
  EXPECT_EQ(emb->nbytes, 131072u);
  EXPECT_EQ(emb->row_bytes(), 256u);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->ne[0], 172);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);

  uint64_t params = 0;
  for (const auto& t : f.tensors()) {
    params += t.n_elements();
    EXPECT_EQ(t.file_offset, f.data_offset() + t.offset);
    EXPECT_EQ(t.file_offset % f.alignment(), 0u);
  }
  EXPECT_EQ(params, 292800u);

  // read_tensor returns the file's bytes at the tensor's place.
  std::vector<uint8_t> file = test::read_file(model_path("stories260K.gguf"));
  for (const char* name : {"token_embd.weight", "blk.4.ffn_up.weight", "output.weight"}) {
    const GgufTensorInfo* t = f.find_tensor(name);
    std::vector<uint8_t> got(t->nbytes);
    f.read_tensor(*t, got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), file.begin() + t->file_offset)) << name;
  }
  uint8_t byte;
  EXPECT_THROW(f.read_bytes(f.file_size(), 1, &byte), GgufError);
  EXPECT_NO_THROW(f.read_bytes(f.file_size() - 1, 1, &byte));
  EXPECT_EQ(byte, file.back());

  // v2 shares the v3 layout (v3 only added big-endian files).
  test::poke_u32(file, 4, 2);
  GgufFile v2 = GgufFile::parse(file.data(), file.size());
  EXPECT_EQ(v2.version(), 2u);
  EXPECT_EQ(v2.tensor_table_hash(), f.tensor_table_hash());
}

TEST(GgufReader, OpenAndParseAgree) {
  std::vector<uint8_t> bytes = test::read_file(model_path("llama-2-tiny-random.gguf"));
  GgufFile a = GgufFile::open(model_path("llama-2-tiny-random.gguf"));
  GgufFile b = GgufFile::parse(bytes.data(), bytes.size());
  EXPECT_EQ(a.version(), 3u);
  EXPECT_EQ(a.tensor_table_hash(), b.tensor_table_hash());
  EXPECT_EQ(a.data_offset(), b.data_offset());
  ASSERT_EQ(a.metadata().size(), b.metadata().size());
  for (size_t i = 0; i < a.metadata().size(); ++i) {
    EXPECT_EQ(a.metadata()[i].first, b.metadata()[i].first);
    EXPECT_TRUE(same_value(a.metadata()[i].second, b.metadata()[i].second)) << a.metadata()[i].first;
  }
  EXPECT_EQ(a.get_array("tokenizer.ggml.tokens").items.size(), 32000u);
  EXPECT_EQ(a.find_tensor("token_embd.weight")->type, DType::F16);
  const GgufTensorInfo& t = *b.find_tensor("output.weight");
  std::vector<uint8_t> x(t.nbytes), y(t.nbytes);
  a.read_tensor(*a.find_tensor("output.weight"), x.data());
  b.read_tensor(t, y.data());
  EXPECT_EQ(x, y);

  // A moved-from file hands over its descriptor.
  GgufFile c = std::move(a);
  c.read_tensor(*c.find_tensor("output.weight"), y.data());
  EXPECT_EQ(x, y);
}

TEST(GgufReader, LegacyVersionsRefused) {
  try {
    GgufFile::open(model_path("tinyllamas-stories-260k-f32.gguf"));
    FAIL() << "v1 accepted";
  } catch (const GgufError& e) {
    EXPECT_STREQ(e.what(), "GGUF version 1 is not supported (need 2 or 3) (at byte 4)");
    EXPECT_EQ(e.offset(), 4u);
  }
  // The v2 Q8_0 file stores ffn_down rows of 172 as a flat block stream;
  // rows must hold whole blocks, so it is refused by name.
  try {
    GgufFile::open(model_path("tinyllamas-stories-260k-q8_0.gguf"));
    FAIL() << "flat Q8_0 rows accepted";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.0.ffn_down.weight': row length 172 is not a "
                                         "multiple of the Q8_0 block size 32 (at byte "),
              std::string::npos)
        << e.what();
  }
}

TEST(GgufReader, VocabOnlyFilesEndAtTheHeader) {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::shared_dir() + "/models/vocab")) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().string());
    GgufFile f = GgufFile::open(entry.path().string());
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_GE(f.data_offset(), f.file_size());
    EXPECT_LT(f.data_offset() - f.file_size(), f.alignment());
    EXPECT_GT(f.get_array("tokenizer.ggml.tokens").items.size(), 30000u);
    ++seen;
  }
  EXPECT_EQ(seen, 7);
}

TEST(GgufReader, MissingFileIsASystemError) {
  EXPECT_THROW(GgufFile::open("/nonexistent/baton/model.gguf"), std::system_error);
  EXPECT_THROW(GgufFile::open(test::shared_dir()), std::runtime_error);  // a folder
}

// --- writer -------------------------------------------------------------------

struct TensorSpec {
  std::string name;
  DType type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> data;
};

void check_padding_is_zero(const std::vector<uint8_t>& file, const GgufFile& f, uint64_t header_end) {
  auto zero = [&](uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; ++i) {
      if (file[i] != 0) return false;
    }
    return true;
  };
  EXPECT_TRUE(zero(header_end, f.data_offset()));
  std::vector<GgufTensorInfo> ts = f.tensors();
  std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < ts.size(); ++i) {
    uint64_t end = ts[i].file_offset + ts[i].nbytes;
    uint64_t next = i + 1 < ts.size() ? ts[i + 1].file_offset : file.size();
    EXPECT_LT(next - end, f.alignment());
    EXPECT_TRUE(zero(end, next)) << ts[i].name;
  }
}

void round_trip(uint64_t seed, uint32_t alignment) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ", alignment " + std::to_string(alignment));
  std::mt19937_64 rng(seed);
  GgufWriter w;
  std::vector<std::pair<std::string, GgufValue>> expected_kv;
  if (alignment) expected_kv.emplace_back("general.alignment", GgufValue::of_u32(alignment));
  for (uint32_t t = 0; t <= uint32_t(GgufType::FLOAT64); ++t) {
    for (int copy = 0; copy < 3; ++copy) {
      expected_kv.emplace_back("test." + std::string(gguf_type_name(GgufType(t))) + "." + std::to_string(copy),
                               random_value(rng, GgufType(t), 3));
    }
  }
  // Arrays of arrays of strings, and an empty array.
  expected_kv.emplace_back("test.nested", GgufValue::of_array(GgufType::ARRAY, {
      GgufValue::of_array(GgufType::STRING, {GgufValue::of_str("a"), GgufValue::of_str("")}),
      GgufValue::of_array(GgufType::STRING, {})}));
  expected_kv.emplace_back("test.empty", GgufValue::of_array(GgufType::INT32, {}));
  for (const auto& [k, v] : expected_kv) w.set(k, v);

  std::vector<TensorSpec> tensors = {
      {"t.f32", DType::F32, {7, 3}, {}},           {"t.f16", DType::F16, {5}, {}},
      {"t.bf16", DType::BF16, {3, 2, 2}, {}},      {"t.q8_0", DType::Q8_0, {64, 3}, {}},
      {"t.q4_0", DType::Q4_0, {32, 1, 1, 2}, {}},  {"t.q4_k", DType::Q4_K, {256, 2}, {}},
      {"t.q6_k", DType::Q6_K, {512}, {}},          {"t.iq2_xxs", DType::IQ2_XXS, {256, 1, 3}, {}},
      {"t.i32", DType::I32, {9}, {}},
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorSpec& t = tensors[i];
    uint64_t n = 1;
    for (int64_t d : t.ne) n *= uint64_t(d);
    t.data = random_bytes(rng, *dtype_bytes(t.type, n));
    // Exercise the three ways of giving data.
    if (i % 3 == 0) {
      w.add_tensor(t.name, t.type, t.ne, t.data);
    } else if (i % 3 == 1) {
      w.add_tensor(t.name, t.type, t.ne, [&t](uint8_t* dst, uint64_t nb) {
        ASSERT_EQ(nb, t.data.size());
        std::memcpy(dst, t.data.data(), nb);
      });
    } else {
      w.add_tensor_chunked(t.name, t.type, t.ne, [&t](uint64_t off, uint8_t* dst, uint64_t nb) {
        ASSERT_LE(off + nb, t.data.size());
        std::memcpy(dst, t.data.data() + off, nb);
      });
    }
  }

  test::TempDir dir;
  std::string path = dir.file("rt.gguf");
  w.write(path);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1)
      << "the temporary file is left";
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment ? alignment : 32u);
  ASSERT_EQ(f.metadata().size(), expected_kv.size());
  for (size_t i = 0; i < expected_kv.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, expected_kv[i].first);
    EXPECT_TRUE(same_value(f.metadata()[i].second, expected_kv[i].second)) << expected_kv[i].first;
  }
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.type, tensors[i].type);
    ASSERT_EQ(t.n_dims, tensors[i].ne.size());
    for (uint32_t d = 0; d < t.n_dims; ++d) EXPECT_EQ(t.ne[d], tensors[i].ne[d]);
    EXPECT_EQ(t.file_offset % f.alignment(), 0u);
    std::vector<uint8_t> got(t.nbytes);
    f.read_tensor(t, got.data());
    EXPECT_EQ(got, tensors[i].data) << t.name;
  }
  // The header size from the encoding rules: 24 bytes, the entries, the infos.
  uint64_t header_end = 24;
  for (const auto& [k, v] : expected_kv) header_end += 8 + k.size() + 4 + encoded_size(v);
  for (const auto& t : tensors) header_end += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  uint64_t a = f.alignment();
  EXPECT_EQ(f.data_offset(), (header_end + a - 1) / a * a);
  check_padding_is_zero(test::read_file(path), f, header_end);
}

TEST(GgufWriter, RoundTripEveryValueType) {
  uint64_t seed = test::test_seed();
  round_trip(seed, 0);
  round_trip(seed + 1, 64);
  round_trip(seed + 2, 1);
}

TEST(GgufWriter, TensorlessFileIsPaddedAndReadable) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_str("llama"));
  w.set("general.architecture", GgufValue::of_str("gpt2"));  // replaces in place
  w.set("x", GgufValue::of_bool(true));
  w.set("y", GgufValue::of_i32(-3));
  w.remove("y");
  test::TempDir dir;
  w.write(dir.file("v.gguf"));
  GgufFile f = GgufFile::open(dir.file("v.gguf"));
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.get_str("general.architecture"), "gpt2");
  EXPECT_TRUE(f.get_bool("x", false));
  EXPECT_FALSE(f.has("y"));
  EXPECT_EQ(f.file_size() % 32, 0u);
  EXPECT_EQ(f.data_offset(), f.file_size());
}

// Chunks of zeros become holes, so splitting a sparse synthetic model (or any
// file with long zero runs) does not fill the disk; the bytes read back equal.
TEST(GgufWriter, ZeroChunksBecomeHoles) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const int64_t big = 3 << 20;  // F32 elements: 12 MiB, three 4 MiB chunks
  std::vector<uint8_t> zeros(size_t(big) * 4, 0), mixed(size_t(big) * 4, 0), tail(size_t(big) * 4, 0);
  for (size_t i = 4 << 20; i < (5u << 20); ++i) mixed[i] = uint8_t(rng() | 1);  // middle chunk nonzero, partly
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_str("llama"));
  auto add = [&](const char* name, const std::vector<uint8_t>& bytes) {
    w.add_tensor_chunked(name, DType::F32, {big}, [&bytes](uint64_t off, uint8_t* dst, uint64_t nb) {
      std::memcpy(dst, bytes.data() + off, nb);
    });
  };
  add("a.zeros", zeros);
  add("b.mixed", mixed);
  add("c.tail", tail);  // the file ends in a hole: it must still have its full size
  test::TempDir dir;
  const std::string path = dir.file("holes.gguf");
  w.write(path);
  GgufFile f = GgufFile::open(path);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.file_size(), std::filesystem::file_size(path));
  const std::vector<uint8_t>* want[] = {&zeros, &mixed, &tail};
  for (size_t i = 0; i < 3; ++i) {
    std::vector<uint8_t> got(f.tensors()[i].nbytes, 0xAB);
    f.read_tensor(f.tensors()[i], got.data());
    EXPECT_EQ(got, *want[i]) << f.tensors()[i].name << " seed " << seed;
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  // 36 MiB of tensors, of which one 4 MiB chunk holds data.
  EXPECT_LT(uint64_t(st.st_blocks) * 512, uint64_t(12) << 20) << "allocated " << st.st_blocks * 512;
}

TEST(GgufWriter, RefusesBadInput) {
  GgufWriter w;
  auto data = [](size_t n) { return std::vector<uint8_t>(n, 1); };
  EXPECT_THROW(w.add_tensor("a", DType::Q8_0, {33}, data(34)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {}, data(0)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {1, 1, 1, 1, 1}, data(4)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {0}, data(0)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, data(15)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("", DType::F32, {4}, data(16)), std::invalid_argument);
  w.add_tensor("a", DType::F32, {4}, data(16));
  EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, data(16)), std::invalid_argument);
  EXPECT_THROW(w.set("", GgufValue::of_u32(1)), std::invalid_argument);
  EXPECT_THROW(w.set("k", GgufValue::of_array(GgufType::UINT32, {GgufValue::of_i32(1)})),
               std::invalid_argument);
  EXPECT_THROW(w.write("/nonexistent/dir/x.gguf"), std::system_error);
  w.set("general.alignment", GgufValue::of_u32(48));
  test::TempDir dir;
  EXPECT_THROW(w.write(dir.file("bad.gguf")), std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad.gguf")));
}

// Rewrites stories260K key by key and tensor by tensor (streamed in chunks
// from the source), as the split tool will.
TEST(GgufWriter, RewriteStories260K) {
  const std::string src_path = model_path("stories260K.gguf");
  GgufFile src = GgufFile::open(src_path);
  GgufWriter w;
  for (const auto& [k, v] : src.metadata()) w.set(k, v);
  for (const auto& t : src.tensors()) {
    w.add_tensor_chunked(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                         [&src, &t](uint64_t off, uint8_t* dst, uint64_t n) {
                           src.read_bytes(t.file_offset + off, n, dst);
                         });
  }
  test::TempDir dir;
  std::string out = dir.file("stories-rewritten.gguf");
  w.write(out);
  GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.tensor_table_hash(), src.tensor_table_hash());
  EXPECT_EQ(f.data_offset(), src.data_offset());
  ASSERT_EQ(f.metadata().size(), src.metadata().size());
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, src.metadata()[i].first);
    EXPECT_TRUE(same_value(f.metadata()[i].second, src.metadata()[i].second));
  }
  ASSERT_EQ(f.tensors().size(), src.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensorInfo& a = src.tensors()[i];
    const GgufTensorInfo& b = f.tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.offset, b.offset);
    std::vector<uint8_t> x(a.nbytes), y(b.nbytes);
    src.read_tensor(a, x.data());
    f.read_tensor(b, y.data());
    EXPECT_EQ(x, y) << a.name;
  }
  // stories260K is packed the same way, so the rewrite is byte-identical.
  EXPECT_EQ(test::read_file(out), test::read_file(src_path));

  if (std::system("python3 --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  test::CommandResult r = test::run_command(
      {"/usr/bin/env", "python3", test::shared_dir() + "/models/gguf_dump.py", out, "--check"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check: OK"), std::string::npos) << r.out;
}

TEST(GgufWriter, TensorTableHashFollowsTheTable) {
  test::TempDir dir;
  auto write = [&](const std::string& name, int64_t rows, DType type) {
    GgufWriter w;
    w.set("general.architecture", GgufValue::of_str("llama"));
    uint64_t nbytes = *dtype_bytes(type, uint64_t(32 * rows));
    w.add_tensor("a", type, {32, rows}, std::vector<uint8_t>(nbytes, 7));
    w.write(dir.file(name));
    return GgufFile::open(dir.file(name)).tensor_table_hash();
  };
  uint64_t base = write("a.gguf", 2, DType::F32);
  EXPECT_EQ(base, write("b.gguf", 2, DType::F32));
  EXPECT_NE(base, write("c.gguf", 3, DType::F32));
  EXPECT_NE(base, write("d.gguf", 2, DType::F16));
  // FNV-1a 64 of an empty table is the offset basis.
  GgufWriter empty;
  empty.write(dir.file("e.gguf"));
  EXPECT_EQ(GgufFile::open(dir.file("e.gguf")).tensor_table_hash(), 0xcbf29ce484222325ull);
}

// The committed fuzz seeds (tests/fuzz/corpus/gguf, made by fuzz_gguf_corpus)
// must stay valid files, or the fuzzer starts from noise.
TEST(GgufReader, FuzzSeedCorpusIsValid) {
  const std::filesystem::path dir = test::source_path("tests/fuzz/corpus/gguf");
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().string());
    std::vector<uint8_t> b = test::read_file(entry.path().string());
    EXPECT_NO_THROW(GgufFile::parse(b.data(), b.size()));
    ++seen;
  }
  EXPECT_GE(seen, 4);
}

// --- hostile input ---------------------------------------------------------------

TEST(GgufHostile, EveryHeaderTruncationIsRefused) {
  for (const char* name : {"stories260K.gguf"}) {
    SCOPED_TRACE(name);
    std::vector<uint8_t> file = test::read_file(model_path(name));
    uint64_t data_offset = GgufFile::parse(file.data(), file.size()).data_offset();
    int refused = 0;
    for (uint64_t n = 0; n < data_offset; ++n) {
      // A fresh allocation of exactly n bytes lets ASan catch any overread.
      std::vector<uint8_t> prefix(file.begin(), file.begin() + n);
      try {
        GgufFile::parse(prefix.data(), prefix.size());
        ADD_FAILURE() << "prefix of " << n << " bytes accepted";
      } catch (const GgufError& e) {
        EXPECT_LE(e.offset(), n) << e.what();
        ++refused;
      }
    }
    EXPECT_EQ(uint64_t(refused), data_offset);
  }
}

TEST(GgufHostile, BrokenFieldsAreRefusedByName) {
  for (const auto& h : test::hostile_ggufs()) {
    SCOPED_TRACE(h.name);
    try {
      GgufFile::parse(h.bytes.data(), h.bytes.size());
      ADD_FAILURE() << "accepted";
    } catch (const GgufError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(h.expect), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find(" (at byte "), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace baton
