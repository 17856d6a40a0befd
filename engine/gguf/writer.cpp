// GGUF v3 writer. Everything is validated before the file is created; the
// file is written under a temporary name beside the target (TempFile) and
// renamed into place only when complete, so a reader never sees a
// half-written model.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "engine/gguf/file.h"

namespace baton {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint64_t kChunkBytes = 4 << 20;  // staging for chunked tensor fills

// Buffered sequential writer over a file descriptor.
class FileOut {
 public:
  FileOut(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(1 << 20); }

  uint64_t pos() const { return pos_; }

  void put(const void* p, uint64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (buf_.size() + n > buf_.capacity()) {
      flush();
      if (n >= buf_.capacity()) {
        raw(b, n);
        pos_ += n;
        return;
      }
    }
    buf_.insert(buf_.end(), b, b + n);
    pos_ += n;
  }

  template <class T>
  void scalar(T v) { put(&v, sizeof v); }

  void string(const std::string& s) {
    scalar<uint64_t>(s.size());
    put(s.data(), s.size());
  }

  void zeros(uint64_t n) {
    static constexpr uint8_t kZero[256] = {};
    while (n > 0) {
      uint64_t k = std::min<uint64_t>(n, sizeof kZero);
      put(kZero, k);
      n -= k;
    }
  }

  void pad_to(uint64_t alignment) {
    zeros((alignment - pos_ % alignment) % alignment);
  }

  void flush() {
    raw(buf_.data(), buf_.size());
    buf_.clear();
  }

  // n zero bytes as a hole: the file stays sparse where its source was.
  // The caller extends the file to pos() before closing (a trailing hole).
  void hole(uint64_t n) {
    flush();
    if (::lseek(fd_, off_t(n), SEEK_CUR) < 0) {
      throw std::system_error(errno, std::generic_category(), "cannot seek in " + path_);
    }
    pos_ += n;
  }

 private:
  void raw(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)));
      if (w < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(), "cannot write " + path_);
      }
      p += w;
      n -= uint64_t(w);
    }
  }

  int fd_;
  std::string path_;
  std::vector<uint8_t> buf_;
  uint64_t pos_ = 0;
};

bool all_zero(const uint8_t* p, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != 0) return false;
  }
  for (; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

void check_value(const std::string& key, const GgufValue& v, int depth) {
  if (uint32_t(v.type) > uint32_t(GgufType::FLOAT64)) {
    throw std::invalid_argument("key '" + key + "': invalid value type " + std::to_string(uint32_t(v.type)));
  }
  if (v.type != GgufType::ARRAY) return;
  if (depth >= 8) throw std::invalid_argument("key '" + key + "': arrays nested deeper than 8 levels");
  for (const GgufValue& item : v.items) {
    if (item.type != v.elem_type) {
      throw std::invalid_argument("key '" + key + "': array of " + gguf_type_name(v.elem_type) +
                                  " holds a " + gguf_type_name(item.type) + " item");
    }
    check_value(key, item, depth + 1);
  }
}

void put_value(FileOut& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::UINT8: out.scalar(uint8_t(v.num.u)); break;
    case GgufType::INT8: out.scalar(int8_t(v.num.i)); break;
    case GgufType::UINT16: out.scalar(uint16_t(v.num.u)); break;
    case GgufType::INT16: out.scalar(int16_t(v.num.i)); break;
    case GgufType::UINT32: out.scalar(uint32_t(v.num.u)); break;
    case GgufType::INT32: out.scalar(int32_t(v.num.i)); break;
    case GgufType::UINT64: out.scalar(uint64_t(v.num.u)); break;
    case GgufType::INT64: out.scalar(int64_t(v.num.i)); break;
    case GgufType::FLOAT32: out.scalar(float(v.num.f)); break;
    case GgufType::FLOAT64: out.scalar(double(v.num.f)); break;
    case GgufType::BOOL: out.scalar(uint8_t(v.num.u != 0)); break;
    case GgufType::STRING: out.string(v.str); break;
    case GgufType::ARRAY:
      out.scalar(uint32_t(v.elem_type));
      out.scalar(uint64_t(v.items.size()));
      for (const GgufValue& item : v.items) put_value(out, item);
      break;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

bool is_numeric_scalar(GgufType t) {
  return t != GgufType::STRING && t != GgufType::ARRAY;
}

// Little-endian bytes of a numeric scalar, as put_value writes it.
std::vector<uint8_t> scalar_bytes(const GgufValue& v) {
  std::vector<uint8_t> b(16);
  size_t n = 0;
  auto put = [&](auto x) {
    std::memcpy(b.data(), &x, sizeof x);
    n = sizeof x;
  };
  switch (v.type) {
    case GgufType::UINT8: put(uint8_t(v.num.u)); break;
    case GgufType::INT8: put(int8_t(v.num.i)); break;
    case GgufType::UINT16: put(uint16_t(v.num.u)); break;
    case GgufType::INT16: put(int16_t(v.num.i)); break;
    case GgufType::UINT32: put(uint32_t(v.num.u)); break;
    case GgufType::INT32: put(int32_t(v.num.i)); break;
    case GgufType::UINT64: put(uint64_t(v.num.u)); break;
    case GgufType::INT64: put(int64_t(v.num.i)); break;
    case GgufType::FLOAT32: put(float(v.num.f)); break;
    case GgufType::FLOAT64: put(double(v.num.f)); break;
    case GgufType::BOOL: put(uint8_t(v.num.u != 0)); break;
    case GgufType::STRING:
    case GgufType::ARRAY: break;
  }
  b.resize(n);
  return b;
}

// Written data is pushed to disk and dropped from the page cache every this
// many bytes, so a multi-GiB copy does not crowd out the rest of the machine.
constexpr uint64_t kDropWindow = 64ull << 20;

}  // namespace

void GgufWriter::set(std::string key, GgufValue v) {
  if (key.empty()) throw std::invalid_argument("GGUF metadata key must not be empty");
  check_value(key, v, 0);
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(v));
}

void GgufWriter::set_deferred(std::string key, GgufValue placeholder, std::function<GgufValue()> final_value) {
  if (!is_numeric_scalar(placeholder.type)) {
    throw std::invalid_argument("deferred key '" + key + "' must have a numeric scalar type");
  }
  set(key, std::move(placeholder));
  std::erase_if(deferred_, [&](const auto& d) { return d.first == key; });
  deferred_.emplace_back(std::move(key), std::move(final_value));
}

void GgufWriter::remove(std::string_view key) {
  std::erase_if(deferred_, [&](const auto& d) { return d.first == key; });
  std::erase_if(kv_, [&](const auto& kv) { return kv.first == key; });
}

uint64_t GgufWriter::checked_tensor_bytes(const std::string& name, DType type,
                                          const std::vector<int64_t>& ne) const {
  auto fail = [&](const std::string& msg) {
    throw std::invalid_argument("tensor '" + name + "': " + msg);
  };
  if (name.empty()) throw std::invalid_argument("tensor name must not be empty");
  for (const Pending& p : tensors_) {
    if (p.name == name) fail("added twice");
  }
  const DTypeInfo* info = dtype_info(uint32_t(type));
  if (!info) fail("unknown type id " + std::to_string(uint32_t(type)));
  if (ne.empty() || ne.size() > 4) fail("dimension count " + std::to_string(ne.size()) + " is outside 1..4");
  uint64_t elements = 1;
  for (int64_t d : ne) {
    if (d < 1) fail("dimension " + std::to_string(d) + " is not positive");
    if (uint64_t(d) > uint64_t(INT64_MAX) / elements) fail("element count overflows");
    elements *= uint64_t(d);
  }
  if (uint64_t(ne[0]) % info->block_elems != 0) {
    fail("row length " + std::to_string(ne[0]) + " is not a multiple of the " + info->name +
         " block size " + std::to_string(info->block_elems));
  }
  auto nbytes = dtype_bytes(type, elements);
  if (!nbytes) fail("byte size overflows");
  return *nbytes;
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne, Fill fill) {
  uint64_t nbytes = checked_tensor_bytes(name, type, ne);
  tensors_.push_back(Pending{std::move(name), type, std::move(ne), nbytes, std::move(fill), {}});
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne,
                            std::vector<uint8_t> data) {
  uint64_t nbytes = checked_tensor_bytes(name, type, ne);
  if (data.size() != nbytes) {
    throw std::invalid_argument("tensor '" + name + "': " + std::to_string(data.size()) +
                                " bytes given, " + std::to_string(nbytes) + " needed");
  }
  auto bytes = std::make_shared<const std::vector<uint8_t>>(std::move(data));
  ChunkFill fill = [bytes](uint64_t offset, uint8_t* dst, uint64_t n) {
    std::memcpy(dst, bytes->data() + offset, size_t(n));
  };
  tensors_.push_back(Pending{std::move(name), type, std::move(ne), nbytes, {}, std::move(fill)});
}

void GgufWriter::add_tensor_chunked(std::string name, DType type, std::vector<int64_t> ne,
                                    ChunkFill fill) {
  uint64_t nbytes = checked_tensor_bytes(name, type, ne);
  tensors_.push_back(Pending{std::move(name), type, std::move(ne), nbytes, {}, std::move(fill)});
}

uint64_t GgufWriter::alignment() const {
  for (const auto& [key, v] : kv_) {
    if (key != "general.alignment") continue;
    if (v.type != GgufType::UINT32 || v.num.u == 0 || !std::has_single_bit(v.num.u)) {
      throw std::invalid_argument("general.alignment must be a u32 nonzero power of two");
    }
    return v.num.u;
  }
  return kDefaultAlignment;
}

void GgufWriter::write(const std::string& path) const { write_file(path, false).commit(); }

void GgufWriter::write_sparse(const std::string& path) const { write_file(path, true).commit(); }

TempFile GgufWriter::write_uncommitted(const std::string& path) const { return write_file(path, false); }

TempFile GgufWriter::write_file(const std::string& path, bool sparse) const {
  const uint64_t align = alignment();
  TempFile file(path);  // removed again if anything below throws
  const int fd = file.fd();
  const std::string& tmp = file.path();
  {
    FileOut out(fd, tmp);
    out.put("GGUF", 4);
    out.scalar<uint32_t>(kVersion);
    out.scalar<uint64_t>(tensors_.size());
    out.scalar<uint64_t>(kv_.size());
    struct Patch {
      uint64_t pos;  // file offset of the placeholder's bytes
      GgufType type;
      const std::function<GgufValue()>* final_value;
      const std::string* key;
    };
    std::vector<Patch> patches;
    for (const auto& [key, v] : kv_) {
      out.string(key);
      out.scalar(uint32_t(v.type));
      for (const auto& d : deferred_) {
        if (d.first == key) patches.push_back({out.pos(), v.type, &d.second, &d.first});
      }
      put_value(out, v);
    }
    // Offsets are relative to the data section; each tensor starts aligned.
    uint64_t offset = 0;
    for (const Pending& t : tensors_) {
      out.string(t.name);
      out.scalar(uint32_t(t.ne.size()));
      for (int64_t d : t.ne) out.scalar(d);
      out.scalar(uint32_t(t.type));
      out.scalar(offset);
      offset = align_up(offset + t.nbytes, align);
    }
    // A tensor-less file is padded too: the data section always starts aligned.
    out.pad_to(align);
    std::vector<uint8_t> staging;
    uint64_t dropped = 0;  // bytes before this offset are out of the page cache
    if (sparse) {
      out.flush();
      if (::ftruncate(fd, off_t(out.pos() + offset)) != 0) {
        throw std::system_error(errno, std::generic_category(), "cannot extend " + tmp);
      }
    }
    for (const Pending& t : tensors_) {
      if (sparse) break;
      out.flush();
      if (t.chunk_fill) {
        staging.resize(size_t(std::min(kChunkBytes, t.nbytes)));
        for (uint64_t done = 0; done < t.nbytes;) {
          uint64_t n = std::min<uint64_t>(kChunkBytes, t.nbytes - done);
          t.chunk_fill(done, staging.data(), n);
          if (all_zero(staging.data(), n)) {
            out.hole(n);  // e.g. a split of a sparse synthetic model stays sparse
          } else {
            out.put(staging.data(), n);
          }
          done += n;
          if (out.pos() - dropped >= kDropWindow) {
            out.flush();
            // Wait for the window to reach the disk, then forget it.
            ::sync_file_range(fd, off_t(dropped), off_t(out.pos() - dropped),
                              SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
            ::posix_fadvise(fd, off_t(dropped), off_t(out.pos() - dropped), POSIX_FADV_DONTNEED);
            dropped = out.pos();
          }
        }
      } else {
        // A plain Fill produces the whole tensor at once: memory is one tensor.
        std::vector<uint8_t> whole(size_t(t.nbytes));
        t.fill(whole.data(), t.nbytes);
        out.put(whole.data(), whole.size());
      }
      out.pad_to(align);
    }
    out.flush();
    if (!sparse && ::ftruncate(fd, off_t(out.pos())) != 0) {  // a final hole has no bytes written yet
      throw std::system_error(errno, std::generic_category(), "cannot size " + tmp);
    }
    for (const Patch& p : patches) {
      const GgufValue v = (*p.final_value)();
      if (v.type != p.type) {
        throw std::invalid_argument("deferred key '" + *p.key + "': final value has another type than its placeholder");
      }
      const std::vector<uint8_t> bytes = scalar_bytes(v);
      if (::pwrite(fd, bytes.data(), bytes.size(), off_t(p.pos)) != ssize_t(bytes.size())) {
        throw std::system_error(errno, std::generic_category(), "cannot patch " + *p.key + " in " + tmp);
      }
    }
  }
  file.finish();
  return file;
}

}  // namespace baton
