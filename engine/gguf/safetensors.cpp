#include "engine/gguf/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

namespace baton {
namespace {

using json = nlohmann::json;

// Dimensions and element counts above this are refused as corrupt; it keeps
// every byte product far from overflow.
constexpr uint64_t kMaxElements = uint64_t(1) << 48;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw SafetensorsError(file + ": " + what);
}

std::optional<DType> dtype_from_st(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I32") return DType::I32;  // integer tables (DeepSeek V4's tid2eid)
  if (s == "I64") return DType::I64;
  return std::nullopt;
}

// A non-negative integer of a JSON header field, or a clear error.
uint64_t as_u64(const std::string& file, const std::string& what, const json& v) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    fail(file, what + " is not a non-negative integer");
  }
  return v.get<uint64_t>();
}

void pread_exact(int fd, const std::string& path, uint64_t offset, uint64_t n, void* dst) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const size_t chunk = size_t(std::min<uint64_t>(n, uint64_t(1) << 30));
    ssize_t got = ::pread(fd, p, chunk, off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw SafetensorsError(path + ": read failed: " + std::strerror(errno));
    }
    if (got == 0) fail(path, fmt::format("unexpected end of file at byte {}", offset));
    p += got;
    offset += uint64_t(got);
    n -= uint64_t(got);
  }
}

}  // namespace

uint64_t SafetensorsTensor::n_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

uint64_t SafetensorsTensor::n_rows() const {
  const int64_t r = row_length();
  return r == 0 ? 0 : n_elements() / uint64_t(r);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    mem_ = std::exchange(o.mem_, nullptr);
    file_size_ = o.file_size_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) throw SafetensorsError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st{};
  if (::fstat(f.fd_, &st) != 0) throw SafetensorsError("cannot stat " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  f.file_size_ = uint64_t(st.st_size);
  if (f.file_size_ < 8) fail(path, fmt::format("{} bytes is too short for a safetensors file", f.file_size_));
  uint8_t len_bytes[8];
  f.read_bytes(0, 8, len_bytes);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];
  if (header_len > kMaxHeaderBytes) {
    fail(path, fmt::format("header length {} is above the limit of {} bytes", header_len, kMaxHeaderBytes));
  }
  if (header_len > f.file_size_ - 8) {
    fail(path, fmt::format("header length {} runs past the end of the {}-byte file", header_len, f.file_size_));
  }
  std::vector<uint8_t> header(static_cast<size_t>(header_len));
  f.read_bytes(8, header_len, header.data());
  f.parse_header(header.data(), header_len);
  return f;
}

SafetensorsFile SafetensorsFile::parse(const uint8_t* data, size_t size, std::string name) {
  SafetensorsFile f;
  f.path_ = std::move(name);
  f.mem_ = data;
  f.file_size_ = size;
  if (size < 8) fail(f.path_, fmt::format("{} bytes is too short for a safetensors file", size));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | data[i];
  if (header_len > kMaxHeaderBytes) {
    fail(f.path_, fmt::format("header length {} is above the limit of {} bytes", header_len, kMaxHeaderBytes));
  }
  if (header_len > size - 8) {
    fail(f.path_, fmt::format("header length {} runs past the end of the {}-byte file", header_len, size));
  }
  f.parse_header(data + 8, header_len);
  return f;
}

void SafetensorsFile::parse_header(const uint8_t* header, uint64_t header_len) {
  const std::string& p = path_;
  json h;
  try {
    h = json::parse(header, header + header_len);
  } catch (const json::exception& e) {
    fail(p, std::string("the JSON header does not parse: ") + e.what());
  }
  if (!h.is_object()) fail(p, "the JSON header is not an object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size_ - data_start;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(p, "__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(p, "__metadata__ value of '" + k + "' is not a string");
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + name + "'";
    if (!v.is_object()) fail(p, what + " is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail(p, what + " has no dtype string");
    if (!v.contains("shape") || !v["shape"].is_array()) fail(p, what + " has no shape array");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      fail(p, what + " has no data_offsets [begin, end]");
    }
    SafetensorsTensor t;
    t.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    auto dtype = dtype_from_st(dt);
    if (!dtype) fail(p, what + " has dtype " + dt + "; only F32, F16, BF16, I32 and I64 are supported");
    t.dtype = *dtype;
    if (v["shape"].size() > 8) fail(p, what + " has more than 8 dimensions");
    uint64_t elements = 1;
    for (const json& d : v["shape"]) {
      const uint64_t n = as_u64(p, what + " shape entry", d);
      if (n > kMaxElements || (n != 0 && elements > kMaxElements / n)) fail(p, what + " has too many elements");
      elements *= n;
      t.shape.push_back(int64_t(n));
    }
    const uint64_t begin = as_u64(p, what + " data_offsets[0]", v["data_offsets"][0]);
    const uint64_t end = as_u64(p, what + " data_offsets[1]", v["data_offsets"][1]);
    if (begin > end) fail(p, fmt::format("{} data_offsets [{}, {}] run backwards", what, begin, end));
    if (end > data_size) {
      fail(p, fmt::format("{} data_offsets [{}, {}] run past the {}-byte data section", what, begin, end, data_size));
    }
    t.nbytes = elements * dtype_info(t.dtype).block_bytes;
    if (end - begin != t.nbytes) {
      fail(p, fmt::format("{} holds {} bytes; its shape and dtype {} need {}", what, end - begin, dt, t.nbytes));
    }
    t.file_offset = data_start + begin;
    tensors_.push_back(std::move(t));
  }
  // The tensors must tile the data section: sorted by offset, each starts
  // where the previous ends, the last ends at the end of the file.
  std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
    return a.file_offset != b.file_offset ? a.file_offset < b.file_offset : a.nbytes < b.nbytes;
  });
  uint64_t at = data_start;
  for (const auto& t : tensors_) {
    if (t.file_offset < at) fail(p, "tensor '" + t.name + "' overlaps the tensor before it");
    if (t.file_offset > at) {
      fail(p, fmt::format("{} unindexed bytes before tensor '{}'", t.file_offset - at, t.name));
    }
    at = t.file_offset + t.nbytes;
  }
  if (at != file_size_) fail(p, fmt::format("{} bytes after the last tensor are unindexed", file_size_ - at));
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read_bytes(uint64_t offset, uint64_t size, void* dst) const {
  if (offset > file_size_ || size > file_size_ - offset) {
    fail(path_, fmt::format("read of {} bytes at {} runs past the end of the file", size, offset));
  }
  if (mem_) {
    std::memcpy(dst, mem_ + offset, size_t(size));
    return;
  }
  pread_exact(fd_, path_, offset, size, dst);
}

void SafetensorsFile::read_rows(const SafetensorsTensor& t, uint64_t first_row, uint64_t n_rows, void* dst) const {
  const uint64_t rows = t.n_rows();
  if (first_row > rows || n_rows > rows - first_row) {
    fail(path_, fmt::format("rows [{}, {}) of tensor '{}' are outside its {} rows", first_row, first_row + n_rows,
                            t.name, rows));
  }
  const uint64_t row_bytes = uint64_t(t.row_length()) * dtype_info(t.dtype).block_bytes;
  read_bytes(t.file_offset + first_row * row_bytes, n_rows * row_bytes, dst);
}

void SafetensorsFile::drop_cache(uint64_t offset, uint64_t size) const {
  if (fd_ >= 0) ::posix_fadvise(fd_, off_t(offset), off_t(size), POSIX_FADV_DONTNEED);
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint c;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  std::vector<std::string> shard_names;
  json weight_map;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    if (!in) throw SafetensorsError("cannot read " + index_path.string());
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      throw SafetensorsError(index_path.string() + ": does not parse: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw SafetensorsError(index_path.string() + ": no \"weight_map\" object");
    }
    weight_map = index["weight_map"];
    for (const auto& [name, shard] : weight_map.items()) {
      if (!shard.is_string()) throw SafetensorsError(index_path.string() + ": shard of '" + name + "' is not a string");
      const std::string s = shard.get<std::string>();
      // Shards are files beside the index: no folders, no way out of DIR.
      if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..") {
        throw SafetensorsError(index_path.string() + ": shard name '" + s + "' of '" + name + "' is not a file name");
      }
      if (std::find(shard_names.begin(), shard_names.end(), s) == shard_names.end()) shard_names.push_back(s);
    }
  } else if (fs::exists(single, ec)) {
    shard_names.push_back("model.safetensors");
  } else {
    throw SafetensorsError("no model.safetensors or model.safetensors.index.json in " + dir);
  }
  std::map<std::string, const SafetensorsFile*> by_name;
  for (const std::string& s : shard_names) {
    c.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open((fs::path(dir) / s).string())));
    by_name[s] = c.files_.back().get();
  }
  if (weight_map.is_object()) {
    for (const auto& [name, shard] : weight_map.items()) {
      const SafetensorsFile* f = by_name.at(shard.get<std::string>());
      const SafetensorsTensor* t = f->find(name);
      if (!t) throw SafetensorsError(f->path() + ": no tensor '" + name + "', which the index places there");
      c.entries_.emplace(name, Entry{t, f});
    }
  }
  // Tensors a shard holds beyond the index still count, once.
  for (const auto& f : c.files_) {
    for (const auto& t : f->tensors()) {
      auto [it, inserted] = c.entries_.emplace(t.name, Entry{&t, f.get()});
      if (!inserted && it->second.file != f.get()) {
        throw SafetensorsError("tensor '" + t.name + "' is in both " + it->second.file->path() + " and " + f->path());
      }
    }
  }
  return c;
}

const SafetensorsCheckpoint::Entry* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace baton
