// libFuzzer target for the checks on split files: the parts of a
// `baton split` (data checksum, part count and index, source hash, source
// tensor index, in read_part_info, verify_part and merge_parts) and llama.cpp
// shard sets (split.no, split.count, split.tensors.count, duplicate tensors,
// in ModelFiles::open). Any input must end in a result or a
// std::runtime_error / std::invalid_argument naming the problem; any other
// exception (std::length_error, std::bad_alloc...), a crash or a sanitizer
// report is a bug.
//
// Input: up to four files separated by kSeparator. They are written as a
// shard set NAME-0000i-of-0000n.gguf in a private temporary folder, so the
// same bytes drive both the part checks and the shard checks.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/model/files.h"
#include "gguf_split/split.h"

using namespace baton;

namespace {

constexpr std::string_view kSeparator = "\n--next-part--\n";
constexpr size_t kMaxParts = 4;
std::filesystem::path g_dir;

void require(bool ok) {
  if (!ok) std::abort();
}

void remove_dir() {
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

template <class F>
void expect_clean(F f) {
  try {
    f();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "baton-fuzz-split-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) std::abort();
  g_dir = tmpl;
  std::atexit(remove_dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (parts.size() + 1 < kMaxParts) {
    const size_t at = in.find(kSeparator, pos);
    if (at == std::string_view::npos) break;
    parts.push_back(in.substr(pos, at - pos));
    pos = at + kSeparator.size();
  }
  parts.push_back(in.substr(pos));

  std::vector<std::string> paths;
  for (size_t i = 0; i < parts.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "m-%05zu-of-%05zu.gguf", i + 1, parts.size());
    paths.push_back((g_dir / name).string());
    std::ofstream(paths.back(), std::ios::binary | std::ios::trunc).write(parts[i].data(), std::streamsize(parts[i].size()));
  }

  for (std::string_view p : parts) {
    expect_clean([&] {
      const GgufFile f = GgufFile::parse(reinterpret_cast<const uint8_t*>(p.data()), p.size());
      // A part's slice must be exactly what its keys say (no value narrowed
      // into range on the way).
      if (const std::optional<PartInfo> info = read_part_info(f)) {
        require(f.get_int(split_keys::kIndex) == info->index && f.get_int(split_keys::kCount) == info->count);
        require(f.get_int(split_keys::kLayerFirst) == info->range.first);
        require(f.get_int(split_keys::kLayerLast) == info->range.last);
        require(info->index >= 0 && info->index < info->count && info->range.first <= info->range.last);
      }
      (void)verify_part(f);
    });
  }
  expect_clean([&] { merge_parts(paths, (g_dir / "merged.gguf").string(), nullptr); });
  expect_clean([&] {
    const ModelFiles m = ModelFiles::open(paths.front());
    volatile uint64_t sink = m.tensor_table_hash() + m.tensor_bytes();
    for (const TensorRef& t : m.tensors()) sink = sink + uint64_t(tensor_place(t.info->name).kind);
    (void)sink;
    (void)model_layer_count(m.meta());
  });
  for (const std::string& p : paths) ::unlink(p.c_str());
  ::unlink((g_dir / "merged.gguf").c_str());
  return 0;
}
