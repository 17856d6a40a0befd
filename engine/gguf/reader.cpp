// GGUF reader: header, metadata and tensor table, validated against the file
// size before anything is allocated from a count or length found in the file.
//
// Layout (v2 and v3 share it; all integers little-endian):
//   magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x { string key | u32 type | value }
//   tensor_count x { string name | u32 n_dims | n_dims x i64 ne | u32 type | u64 offset }
//   padding to the alignment | data section
// where a string is { u64 length | bytes } and an array value is
// { u32 element type | u64 count | count x value }.
//
// The file is long because validation is the point: every count, length, type, dimension,
// offset and overlap is checked with its own message and byte offset (docs/GGUF.md), and those
// checks share one parser state; splitting them would spread one file format over several.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <system_error>
#include <utility>

#include "engine/gguf/file.h"

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace baton {
namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kMaxDims = 4;
// Arrays of arrays are legal; the limit keeps recursion bounded on hostile input.
constexpr int kMaxArrayDepth = 8;
// Each parsed value costs sizeof(GgufValue) (~80 bytes) of memory while it
// occupies as little as one byte in the file; this caps that amplification
// (real vocabularies hold well under a million values).
constexpr uint64_t kMaxMetadataValues = uint64_t(1) << 24;
// The smallest possible encodings, used to refuse counts that cannot fit in
// the bytes that remain: key length + 1-byte key + type + 1-byte value, and
// name length + 1-byte name + n_dims + one dim + type + offset.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

std::string quoted(std::string_view s) {
  // Names come from the file: keep messages on one line and readable.
  std::string out = "'";
  for (char c : s.substr(0, 200)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  if (s.size() > 200) out += "...";
  return out + "'";
}

// Reads exactly n bytes at offset, retrying on EINTR and short reads.
void pread_exact(int fd, uint64_t offset, uint64_t n, void* dst) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    size_t chunk = size_t(std::min<uint64_t>(n, uint64_t(1) << 30));
    ssize_t got = ::pread(fd, p, chunk, off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "pread failed");
    }
    if (got == 0) throw GgufError("unexpected end of file (was the file truncated?)", offset);
    p += got;
    offset += uint64_t(got);
    n -= uint64_t(got);
  }
}

// Sequential reader over the header: a small buffer in front of pread, or the
// caller's memory image. Bounds are the caller's job (GgufParser::need).
class HeaderReader {
 public:
  HeaderReader(int fd, const uint8_t* mem, uint64_t size) : fd_(fd), mem_(mem), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void bytes(void* dst, uint64_t n) {
    if (n > remaining()) throw GgufError("internal error: read past the end", pos_);
    if (mem_) {
      if (n) std::memcpy(dst, mem_ + pos_, size_t(n));
      pos_ += n;
      return;
    }
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (pos_ >= buf_start_ && pos_ < buf_start_ + buf_len_) {
        uint64_t from = pos_ - buf_start_;
        uint64_t take = std::min(n, buf_len_ - from);
        std::memcpy(out, buf_.data() + from, size_t(take));
        out += take;
        pos_ += take;
        n -= take;
      } else if (n >= kBufSize) {
        // Large strings bypass the buffer.
        pread_exact(fd_, pos_, n, out);
        pos_ += n;
        n = 0;
      } else {
        buf_.resize(kBufSize);
        buf_start_ = pos_;
        buf_len_ = std::min<uint64_t>(kBufSize, remaining());
        pread_exact(fd_, buf_start_, buf_len_, buf_.data());
      }
    }
  }

 private:
  static constexpr uint64_t kBufSize = 64 * 1024;
  int fd_;
  const uint8_t* mem_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;
  uint64_t buf_start_ = 0;
  uint64_t buf_len_ = 0;
};

bool valid_value_type(uint32_t t) { return t <= uint32_t(GgufType::FLOAT64); }

// Bytes of one encoded value of type t, at least (strings and arrays vary).
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 4 + 8;
  }
  return 1;
}

}  // namespace

class GgufParser {
 public:
  GgufParser(GgufFile& f, HeaderReader& r) : f_(f), r_(r) {}

  void run() {
    read_header();
    read_metadata();
    read_alignment();
    read_tensor_infos();
    place_data();
  }

 private:
  [[noreturn]] void fail(const std::string& msg, uint64_t offset) const {
    throw GgufError(ctx_.empty() ? msg : ctx_ + ": " + msg, offset);
  }

  void need(uint64_t n, const char* what) const {
    if (n > r_.remaining()) {
      fail(std::string("file ends inside the ") + what + " (needs " + std::to_string(n) +
               " bytes, " + std::to_string(r_.remaining()) + " left)",
           r_.pos());
    }
  }

  template <class T>
  T scalar(const char* what) {
    need(sizeof(T), what);
    T v;
    r_.bytes(&v, sizeof v);
    return v;
  }

  std::string string(const char* what) {
    uint64_t at = r_.pos();
    uint64_t len = scalar<uint64_t>(what);
    if (len > r_.remaining()) {
      fail(std::string(what) + " length " + std::to_string(len) + " exceeds the " +
               std::to_string(r_.remaining()) + " bytes left in the file",
           at);
    }
    std::string s(size_t(len), '\0');
    r_.bytes(s.data(), len);
    return s;
  }

  GgufType value_type(const char* what) {
    uint64_t at = r_.pos();
    uint32_t t = scalar<uint32_t>(what);
    if (!valid_value_type(t)) fail("unknown metadata value type " + std::to_string(t), at);
    return GgufType(t);
  }

  void count_values(uint64_t n, uint64_t at) {
    values_ += n;
    if (values_ > kMaxMetadataValues) {
      fail("metadata holds more than " + std::to_string(kMaxMetadataValues) + " values", at);
    }
  }

  GgufValue value(GgufType t, int depth) {
    GgufValue v;
    v.type = t;
    switch (t) {
      case GgufType::UINT8: v.num.u = scalar<uint8_t>("u8 value"); break;
      case GgufType::INT8: v.num.i = scalar<int8_t>("i8 value"); break;
      case GgufType::UINT16: v.num.u = scalar<uint16_t>("u16 value"); break;
      case GgufType::INT16: v.num.i = scalar<int16_t>("i16 value"); break;
      case GgufType::UINT32: v.num.u = scalar<uint32_t>("u32 value"); break;
      case GgufType::INT32: v.num.i = scalar<int32_t>("i32 value"); break;
      case GgufType::UINT64: v.num.u = scalar<uint64_t>("u64 value"); break;
      case GgufType::INT64: v.num.i = scalar<int64_t>("i64 value"); break;
      case GgufType::FLOAT32: v.num.f = scalar<float>("f32 value"); break;
      case GgufType::FLOAT64: v.num.f = scalar<double>("f64 value"); break;
      case GgufType::BOOL: {
        uint64_t at = r_.pos();
        uint8_t b = scalar<uint8_t>("bool value");
        if (b > 1) fail("bool value " + std::to_string(b) + " is neither 0 nor 1", at);
        v.num.u = b;
        break;
      }
      case GgufType::STRING: v.str = string("string"); break;
      case GgufType::ARRAY: array(v, depth); break;
    }
    return v;
  }

  void array(GgufValue& v, int depth) {
    uint64_t at = r_.pos();
    if (depth >= kMaxArrayDepth) {
      fail("arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels", at);
    }
    v.elem_type = value_type("array element type");
    uint64_t count_at = r_.pos();
    uint64_t count = scalar<uint64_t>("array length");
    uint64_t min_bytes = min_value_bytes(v.elem_type);
    if (count > r_.remaining() / min_bytes) {
      fail("array length " + std::to_string(count) + " of " + gguf_type_name(v.elem_type) +
               " cannot fit in the " + std::to_string(r_.remaining()) + " bytes left in the file",
           count_at);
    }
    count_values(count, count_at);
    v.items.reserve(size_t(count));
    for (uint64_t i = 0; i < count; ++i) v.items.push_back(value(v.elem_type, depth + 1));
  }

  void read_header() {
    uint64_t at = r_.pos();
    uint8_t magic[4];
    need(4, "magic");
    r_.bytes(magic, 4);
    if (std::memcmp(magic, kMagic, 4) != 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "not a GGUF file: magic is %02x %02x %02x %02x, expected 'GGUF'",
                    magic[0], magic[1], magic[2], magic[3]);
      fail(buf, at);
    }
    at = r_.pos();
    uint32_t version = scalar<uint32_t>("version");
    if (version != 2 && version != 3) {
      std::string msg = "GGUF version " + std::to_string(version) + " is not supported (need 2 or 3)";
      uint32_t swapped = __builtin_bswap32(version);
      if (swapped == 2 || swapped == 3) msg += "; this looks like a big-endian file";
      fail(msg, at);
    }
    f_.version_ = version;
    at = r_.pos();
    tensor_count_ = scalar<uint64_t>("tensor count");
    uint64_t kv_at = r_.pos();
    kv_count_ = scalar<uint64_t>("metadata key count");
    uint64_t left = r_.remaining();
    if (kv_count_ > left / kMinKvBytes) {
      fail("metadata key count " + std::to_string(kv_count_) + " cannot fit in the " +
               std::to_string(left) + " bytes left in the file",
           kv_at);
    }
    if (tensor_count_ > (left - kv_count_ * kMinKvBytes) / kMinTensorInfoBytes) {
      fail("tensor count " + std::to_string(tensor_count_) + " cannot fit in the " +
               std::to_string(left) + " bytes left in the file",
           at);
    }
  }

  void read_metadata() {
    // Counts were checked against the file size, but a huge file could still
    // claim millions of entries: let the vectors grow instead of trusting them.
    f_.kv_.reserve(size_t(std::min<uint64_t>(kv_count_, 4096)));
    kv_offsets_.reserve(f_.kv_.capacity());
    for (uint64_t i = 0; i < kv_count_; ++i) {
      uint64_t at = r_.pos();
      ctx_ = "metadata entry " + std::to_string(i);
      std::string key = string("key");
      if (key.empty()) fail("empty key", at);
      ctx_ = "metadata key " + quoted(key);
      if (f_.kv_index_.count(key)) fail("duplicate metadata key", at);
      count_values(1, at);
      GgufType t = value_type("value type");
      GgufValue v = value(t, 0);
      f_.kv_index_.emplace(key, f_.kv_.size());
      f_.kv_.emplace_back(std::move(key), std::move(v));
      kv_offsets_.push_back(at);
    }
    ctx_.clear();
  }

  void read_alignment() {
    auto it = f_.kv_index_.find(std::string_view("general.alignment"));
    if (it == f_.kv_index_.end()) return;
    const GgufValue& v = f_.kv_[it->second].second;
    uint64_t at = kv_offsets_[it->second];
    if (v.type != GgufType::UINT32) {
      fail(std::string("general.alignment has type ") + gguf_type_name(v.type) + ", expected u32", at);
    }
    if (v.num.u == 0 || !std::has_single_bit(v.num.u)) {
      fail("general.alignment " + std::to_string(v.num.u) + " is not a nonzero power of two", at);
    }
    f_.alignment_ = v.num.u;
  }

  void read_tensor_infos() {
    f_.tensors_.reserve(size_t(std::min<uint64_t>(tensor_count_, 4096)));
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      uint64_t at = r_.pos();
      ctx_ = "tensor " + std::to_string(i);
      GgufTensorInfo t;
      t.name = string("tensor name");
      if (t.name.empty()) fail("empty tensor name", at);
      ctx_ = "tensor " + quoted(t.name);
      if (f_.tensor_index_.count(t.name)) fail("duplicate tensor name", at);

      uint64_t dims_at = r_.pos();
      t.n_dims = scalar<uint32_t>("dimension count");
      if (t.n_dims < 1 || t.n_dims > kMaxDims) {
        fail("dimension count " + std::to_string(t.n_dims) + " is outside 1..4", dims_at);
      }
      uint64_t elements = 1;
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        uint64_t ne_at = r_.pos();
        t.ne[d] = scalar<int64_t>("dimensions");
        // ggml allows empty (ne = 0) tensors; a model has no use for them and
        // they make row sizes meaningless, so they are refused too.
        if (t.ne[d] < 1) {
          fail("dimension " + std::to_string(d) + " is " + std::to_string(t.ne[d]) +
                   " (must be at least 1)",
               ne_at);
        }
        if (uint64_t(t.ne[d]) > uint64_t(INT64_MAX) / elements) {
          fail("the element count overflows (dimension " + std::to_string(d) + " is " +
                   std::to_string(t.ne[d]) + ")",
               ne_at);
        }
        elements *= uint64_t(t.ne[d]);
      }

      uint64_t type_at = r_.pos();
      uint32_t type_id = scalar<uint32_t>("tensor type");
      const DTypeInfo* info = dtype_info(type_id);
      if (!info) fail("unknown tensor type id " + std::to_string(type_id), type_at);
      t.type = info->type;
      if (uint64_t(t.ne[0]) % info->block_elems != 0) {
        fail("row length " + std::to_string(t.ne[0]) + " is not a multiple of the " + info->name +
                 " block size " + std::to_string(info->block_elems),
             dims_at);
      }
      auto nbytes = dtype_bytes(t.type, elements);
      if (!nbytes) fail("the byte size overflows", dims_at);
      t.nbytes = *nbytes;

      uint64_t off_at = r_.pos();
      t.offset = scalar<uint64_t>("tensor data offset");
      if (t.offset % f_.alignment_ != 0) {
        fail("data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                 std::to_string(f_.alignment_),
             off_at);
      }
      f_.tensor_index_.emplace(t.name, f_.tensors_.size());
      f_.tensors_.push_back(std::move(t));
      offset_field_at_.push_back(off_at);
    }
    ctx_.clear();
  }

  void place_data() {
    uint64_t header_end = r_.pos();
    uint64_t a = f_.alignment_;
    // header_end <= file size and a <= 2^31, so this cannot overflow.
    f_.data_offset_ = (header_end + a - 1) / a * a;
    if (f_.tensors_.empty()) return;  // vocab-only files may end right after the header

    uint64_t data_size = f_.file_size_ >= f_.data_offset_ ? f_.file_size_ - f_.data_offset_ : 0;
    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      GgufTensorInfo& t = f_.tensors_[i];
      if (t.offset > data_size || t.nbytes > data_size - t.offset) {
        ctx_ = "tensor " + quoted(t.name);
        fail("data at offset " + std::to_string(t.offset) + " (" + std::to_string(t.nbytes) +
                 " bytes) extends past the end of the file (data section holds " +
                 std::to_string(data_size) + " bytes from byte " + std::to_string(f_.data_offset_) +
                 ")",
             offset_field_at_[i]);
      }
      t.file_offset = f_.data_offset_ + t.offset;
    }

    // Overlapping tensors would alias each other's bytes; no writer produces them.
    std::vector<size_t> order(f_.tensors_.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return f_.tensors_[x].offset < f_.tensors_[y].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensorInfo& prev = f_.tensors_[order[k - 1]];
      const GgufTensorInfo& next = f_.tensors_[order[k]];
      if (prev.offset + prev.nbytes > next.offset) {
        ctx_ = "tensor " + quoted(next.name);
        fail("data at offset " + std::to_string(next.offset) + " overlaps tensor " + quoted(prev.name) +
                 " (offset " + std::to_string(prev.offset) + ", " + std::to_string(prev.nbytes) + " bytes)",
             offset_field_at_[order[k]]);
      }
    }
  }

  GgufFile& f_;
  HeaderReader& r_;
  std::string ctx_;  // prefix naming the entry being read, for messages
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
  uint64_t values_ = 0;
  std::vector<uint64_t> kv_offsets_;
  std::vector<uint64_t> offset_field_at_;
};

GgufFile GgufFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot open " + path);
  GgufFile f;
  f.fd_ = fd;  // owned from here: closed by ~GgufFile if parsing throws
  f.path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw std::system_error(errno, std::generic_category(), "cannot stat " + path);
  }
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + " is not a regular file");
  f.file_size_ = uint64_t(st.st_size);
  HeaderReader r(fd, nullptr, f.file_size_);
  GgufParser(f, r).run();
  return f;
}

GgufFile GgufFile::parse(const uint8_t* data, size_t size) {
  GgufFile f;
  f.mem_ = data;
  f.file_size_ = size;
  HeaderReader r(-1, data, size);
  GgufParser(f, r).run();
  return f;
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this == &o) return *this;
  if (fd_ >= 0) ::close(fd_);
  path_ = std::move(o.path_);
  fd_ = std::exchange(o.fd_, -1);
  mem_ = std::exchange(o.mem_, nullptr);
  version_ = o.version_;
  file_size_ = o.file_size_;
  alignment_ = o.alignment_;
  data_offset_ = o.data_offset_;
  kv_ = std::move(o.kv_);
  kv_index_ = std::move(o.kv_index_);
  tensors_ = std::move(o.tensors_);
  tensor_index_ = std::move(o.tensor_index_);
  return *this;
}

GgufFile::~GgufFile() {
  if (fd_ >= 0) ::close(fd_);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {

const GgufValue& require(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (!v) throw std::runtime_error("missing key '" + std::string(key) + "'");
  return *v;
}

// Runs a typed view, prefixing a type mismatch with the key.
template <class Fn>
auto typed(std::string_view key, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("key '" + std::string(key) + "': " + e.what());
  }
}

}  // namespace

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  return typed(key, [&] { return v.as_int(); });
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  return typed(key, [&] { return v.as_float(); });
}

const std::string& GgufFile::get_str(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  return typed(key, [&]() -> const std::string& { return v.as_str(); });
}

const GgufValue& GgufFile::get_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::ARRAY) {
    throw std::runtime_error("key '" + std::string(key) + "': expected an array, got " +
                             gguf_type_name(v.type));
  }
  return v;
}

int64_t GgufFile::get_int(std::string_view key, int64_t def) const {
  return has(key) ? get_int(key) : def;
}

double GgufFile::get_float(std::string_view key, double def) const {
  return has(key) ? get_float(key) : def;
}

std::string GgufFile::get_str(std::string_view key, const std::string& def) const {
  return has(key) ? get_str(key) : def;
}

bool GgufFile::get_bool(std::string_view key, bool def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  if (v->type != GgufType::BOOL) {
    throw std::runtime_error("key '" + std::string(key) + "': expected bool, got " +
                             gguf_type_name(v->type));
  }
  return v->num.u != 0;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::read_bytes(uint64_t offset, uint64_t size, void* dst) const {
  if (offset > file_size_ || size > file_size_ - offset) {
    throw GgufError("read of " + std::to_string(size) + " bytes is past the end of the file (" +
                        std::to_string(file_size_) + " bytes)",
                    offset);
  }
  if (size == 0) return;
  if (mem_) {
    std::memcpy(dst, mem_ + offset, size_t(size));
    return;
  }
  if (fd_ < 0) throw std::runtime_error("GGUF file is closed");
  pread_exact(fd_, offset, size, dst);
}

void GgufFile::read_tensor(const GgufTensorInfo& t, void* dst) const {
  read_bytes(t.file_offset, t.nbytes, dst);
}

uint64_t hash_tensor_table(const std::vector<const GgufTensorInfo*>& tensors) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto feed = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 0x100000001b3ull;
    }
  };
  // Fixed-width little-endian fields; the name is length-prefixed so that
  // adjacent names cannot run into each other.
  for (const GgufTensorInfo* t : tensors) {
    uint64_t len = t->name.size();
    feed(&len, 8);
    feed(t->name.data(), t->name.size());
    uint32_t type = uint32_t(t->type);
    feed(&type, 4);
    feed(&t->n_dims, 4);
    for (uint32_t d = 0; d < t->n_dims; ++d) feed(&t->ne[d], 8);
    feed(&t->nbytes, 8);
  }
  return h;
}

uint64_t GgufFile::tensor_table_hash() const {
  std::vector<const GgufTensorInfo*> infos;
  infos.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) infos.push_back(&t);
  return hash_tensor_table(infos);
}

void GgufFile::drop_cache(uint64_t offset, uint64_t size) const {
  if (fd_ >= 0) ::posix_fadvise(fd_, off_t(offset), off_t(size), POSIX_FADV_DONTNEED);
}

}  // namespace baton
