// safetensors reader: well-formed files (every dtype, rows, metadata, shards)
// and hostile ones (truncated, huge or short header length, bad JSON, offsets
// outside the data, overlaps, holes, size mismatches, unknown dtypes, shard
// names that leave the folder). Files are written by hand here.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf/safetensors.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;

std::vector<uint8_t> with_header(const std::string& header, const std::vector<uint8_t>& data, uint64_t len_override = 0) {
  std::vector<uint8_t> out(8);
  const uint64_t len = len_override ? len_override : header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(len >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Two tensors: "a" F32 [2, 3] at [0, 24), "b" BF16 [4] at [24, 32).
struct Sample {
  std::vector<float> a;
  std::vector<uint16_t> b;
  std::vector<uint8_t> file;
};

Sample sample(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  Sample s;
  for (int i = 0; i < 6; ++i) s.a.push_back(u(rng));
  for (int i = 0; i < 4; ++i) s.b.push_back(fp32_to_bf16(u(rng)));
  json h = {{"__metadata__", {{"format", "pt"}}},
            {"b", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {24, 32}}}},
            {"a", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}}};
  std::vector<uint8_t> data(32);
  std::memcpy(data.data(), s.a.data(), 24);
  std::memcpy(data.data() + 24, s.b.data(), 8);
  std::string text = h.dump();
  text.append(3, ' ');  // the format allows trailing spaces as padding
  s.file = with_header(text, data);
  return s;
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    SafetensorsFile::parse(bytes.data(), bytes.size(), "t.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

std::string header_error(const json& h, size_t data_bytes) {
  return parse_error(with_header(h.dump(), std::vector<uint8_t>(data_bytes, 0x5a)));
}

TEST(Safetensors, ReadsTensorsRowsAndMetadata) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Sample s = sample(seed);
  test::TempDir dir;
  test::write_file(dir.file("m.safetensors"), s.file);
  SafetensorsFile f = SafetensorsFile::open(dir.file("m.safetensors"));
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // data order
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const SafetensorsTensor* a = f.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->n_rows(), 2u);
  std::vector<float> row(3);
  f.read_rows(*a, 1, 1, row.data());
  EXPECT_EQ(std::vector<float>(s.a.begin() + 3, s.a.end()), row);
  const SafetensorsTensor* b = f.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::BF16);
  std::vector<uint16_t> bb(4);
  f.read(*b, bb.data());
  EXPECT_EQ(bb, s.b);
  EXPECT_EQ(f.find("c"), nullptr);
  EXPECT_THROW(f.read_rows(*a, 1, 2, row.data()), SafetensorsError);
}

TEST(Safetensors, RefusesTruncatedAndBadLengths) {
  Sample s = sample(1);
  std::vector<uint8_t> cut(s.file.begin(), s.file.end() - 1);
  EXPECT_NE(parse_error(cut).find("run past the 31-byte data section"), std::string::npos) << parse_error(cut);
  EXPECT_NE(parse_error({1, 2, 3}).find("too short"), std::string::npos);
  auto huge = s.file;
  for (int i = 0; i < 8; ++i) huge[size_t(i)] = 0xff;
  EXPECT_NE(parse_error(huge).find("above the limit"), std::string::npos) << parse_error(huge);
  auto past = with_header("{}", {}, 1000);
  EXPECT_NE(parse_error(past).find("runs past the end"), std::string::npos) << parse_error(past);
  // A header that ends inside the JSON.
  std::string text = json{{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}.dump();
  auto half = with_header(text.substr(0, text.size() / 2), std::vector<uint8_t>(4));
  EXPECT_NE(parse_error(half).find("does not parse"), std::string::npos) << parse_error(half);
  EXPECT_NE(parse_error(with_header("[1, 2]", {})).find("not an object"), std::string::npos);
}

TEST(Safetensors, RefusesBadTensorEntries) {
  auto entry = [](const char* dtype, json shape, json offsets) {
    return json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", offsets}};
  };
  // Offsets past the data, backwards, wrong size, overlapping, a hole.
  EXPECT_NE(header_error({{"a", entry("F32", {2}, {0, 16})}}, 8).find("run past"), std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {2}, {8, 0})}}, 8).find("backwards"), std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {3}, {0, 8})}}, 8).find("need 12"), std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {2}, {0, 8})}, {"b", entry("F16", {4}, {0, 8})}}, 8).find("overlaps"),
            std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {1}, {4, 8})}}, 8).find("unindexed bytes before"), std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {1}, {0, 4})}}, 8).find("after the last tensor"), std::string::npos);
  // Types and shapes.
  EXPECT_NE(header_error({{"a", entry("U8", {1}, {0, 1})}}, 1).find("dtype U8"), std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {-2}, {0, 8})}}, 8).find("not a non-negative integer"), std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {1.5}, {0, 8})}}, 8).find("not a non-negative integer"), std::string::npos);
  EXPECT_NE(header_error({{"a", entry("F32", {1ull << 40, 1ull << 40}, {0, 8})}}, 8).find("too many elements"),
            std::string::npos);
  EXPECT_NE(header_error({{"a", {{"dtype", "F32"}, {"shape", {2}}}}}, 8).find("data_offsets"), std::string::npos);
  EXPECT_NE(header_error({{"a", 7}}, 0).find("not an object"), std::string::npos);
  EXPECT_NE(header_error({{"__metadata__", {{"k", 1}}}}, 0).find("not a string"), std::string::npos);
  // An empty file with an empty header is valid.
  EXPECT_EQ(header_error(json::object(), 0), "");
}

TEST(Safetensors, OpensShardedCheckpoints) {
  test::TempDir dir;
  auto one = [](const char* name, float v) {
    json h = {{name, {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
    std::vector<uint8_t> d(4);
    std::memcpy(d.data(), &v, 4);
    return with_header(h.dump(), d);
  };
  test::write_file(dir.file("s1.safetensors"), one("x", 1.5f));
  test::write_file(dir.file("s2.safetensors"), one("y", -2.0f));
  auto index = [&](const json& map) {
    std::string t = json{{"metadata", json::object()}, {"weight_map", map}}.dump();
    test::write_file(dir.file("model.safetensors.index.json"), std::vector<uint8_t>(t.begin(), t.end()));
  };
  index({{"x", "s1.safetensors"}, {"y", "s2.safetensors"}});
  SafetensorsCheckpoint c = SafetensorsCheckpoint::open(dir.path().string());
  ASSERT_NE(c.find("y"), nullptr);
  float v = 0;
  c.find("y")->file->read(*c.find("y")->tensor, &v);
  EXPECT_EQ(v, -2.0f);
  EXPECT_EQ(c.tensors().size(), 2u);

  auto open_error = [&]() -> std::string {
    try {
      SafetensorsCheckpoint::open(dir.path().string());
    } catch (const SafetensorsError& e) {
      return e.what();
    }
    return "";
  };
  index({{"x", "s1.safetensors"}, {"y", "s1.safetensors"}});
  EXPECT_NE(open_error().find("no tensor 'y'"), std::string::npos) << open_error();
  index({{"x", "../s1.safetensors"}});
  EXPECT_NE(open_error().find("not a file name"), std::string::npos) << open_error();
  test::write_file(dir.file("s2.safetensors"), one("x", 3.0f));
  index({{"x", "s1.safetensors"}, {"z", "s2.safetensors"}});
  EXPECT_NE(open_error().find("no tensor 'z'"), std::string::npos) << open_error();
  test::write_file(dir.file("model.safetensors.index.json"), {'{', '['});
  EXPECT_NE(open_error().find("does not parse"), std::string::npos) << open_error();

  test::TempDir empty;
  try {
    SafetensorsCheckpoint::open(empty.path().string());
    ADD_FAILURE() << "opened an empty folder";
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("no model.safetensors"), std::string::npos);
  }
}

TEST(Safetensors, RefusesATensorInTwoShards) {
  test::TempDir dir;
  json h1 = {{"x", {{"dtype", "F16"}, {"shape", {1}}, {"data_offsets", {0, 2}}}}};
  json h2 = {{"x", {{"dtype", "F16"}, {"shape", {1}}, {"data_offsets", {0, 2}}}},
             {"w", {{"dtype", "F16"}, {"shape", {1}}, {"data_offsets", {2, 4}}}}};
  test::write_file(dir.file("s1.safetensors"), with_header(h1.dump(), {0, 0x3c}));
  test::write_file(dir.file("s2.safetensors"), with_header(h2.dump(), {0, 0x3c, 0, 0x40}));
  std::string t = json{{"weight_map", {{"x", "s1.safetensors"}, {"w", "s2.safetensors"}}}}.dump();
  test::write_file(dir.file("model.safetensors.index.json"), std::vector<uint8_t>(t.begin(), t.end()));
  try {
    SafetensorsCheckpoint::open(dir.path().string());
    ADD_FAILURE() << "accepted a tensor stored in two shards";
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("'x' is in both"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace baton
