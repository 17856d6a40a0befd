#include "engine/model/files.h"

#include <charconv>
#include <cstdio>
#include <stdexcept>

namespace baton {

std::string shard_path(const std::string& path, int index, int* count) {
  // llama.cpp names shards "%s-%05d-of-%05d.gguf".
  constexpr std::string_view kSuffix = ".gguf";
  if (path.size() < 20 || path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return "";
  const size_t tail = path.size() - kSuffix.size();  // "-NNNNN-of-MMMMM" ends here
  const size_t start = tail - 15;
  auto digits = [&](size_t pos, int* out) {
    const char* b = path.data() + pos;
    auto r = std::from_chars(b, b + 5, *out);
    return r.ec == std::errc() && r.ptr == b + 5;
  };
  int no = 0, n = 0;
  if (path[start] != '-' || path.compare(start + 6, 4, "-of-") != 0 || !digits(start + 1, &no) ||
      !digits(start + 10, &n) || no < 1 || n < 1 || no > n) {
    return "";
  }
  if (count) *count = n;
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05d-of-%05d", index, n);
  return path.substr(0, start) + buf + std::string(kSuffix);
}

ModelFiles ModelFiles::open(const std::string& path) {
  ModelFiles m;
  int count = 0;
  if (shard_path(path, 1, &count).empty()) {
    m.files_.push_back(GgufFile::open(path));
  } else {
    for (int i = 1; i <= count; ++i) {
      std::string p = shard_path(path, i);
      GgufFile f = GgufFile::open(p);
      const int64_t no = f.get_int("split.no", -1);
      const int64_t n = f.get_int("split.count", -1);
      if (no != i - 1 || n != count) {
        throw std::runtime_error(p + ": split.no/split.count are " + std::to_string(no) + "/" +
                                 std::to_string(n) + ", expected " + std::to_string(i - 1) + "/" +
                                 std::to_string(count));
      }
      m.files_.push_back(std::move(f));
    }
  }
  std::vector<const GgufTensorInfo*> infos;
  for (const GgufFile& f : m.files_) {
    for (const GgufTensorInfo& t : f.tensors()) {
      if (m.index_.count(t.name)) {
        throw std::runtime_error(f.path() + ": tensor '" + t.name + "' also appears in an earlier shard");
      }
      m.index_.emplace(t.name, m.tensors_.size());
      m.tensors_.push_back({&f, &t});
      infos.push_back(&t);
    }
  }
  const int64_t expected = m.meta().get_int("split.tensors.count", -1);
  if (m.files_.size() > 1 && expected >= 0 && size_t(expected) != m.tensors_.size()) {
    throw std::runtime_error(path + ": split.tensors.count is " + std::to_string(expected) + " but the shards hold " +
                             std::to_string(m.tensors_.size()) + " tensors");
  }
  m.hash_ = hash_tensor_table(infos);
  return m;
}

const TensorRef* ModelFiles::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

TensorPlace tensor_place(std::string_view name) {
  if (name.starts_with("blk.")) {
    int layer = -1;
    const char* end = name.data() + name.size();
    auto r = std::from_chars(name.data() + 4, end, layer);
    if (r.ec == std::errc() && r.ptr < end && *r.ptr == '.' && layer >= 0) return {TensorPlace::kLayer, layer};
  }
  if (name.starts_with("token_embd.")) return {TensorPlace::kEmbedding};
  if (name.starts_with("output")) return {TensorPlace::kOutput};
  if (name.starts_with("mtp.")) return {TensorPlace::kOutput};  // a drafter (DSpark): beside the output head
  return {TensorPlace::kShared};
}

uint64_t ModelFiles::tensor_bytes() const {
  uint64_t sum = 0;
  for (const TensorRef& t : tensors_) sum += t.info->nbytes;
  return sum;
}

}  // namespace baton
