// GGUF container: reader (v2, v3; v1 refused by name) and writer (v3).
//
// The reader parses the header, metadata and tensor table and validates all of
// it against the file size; it never reads tensor data until asked and never
// trusts a count, length or offset before checking it against the bytes that
// remain. Every problem is a GgufError naming what is wrong and the byte offset.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/temp_file.h"
#include "kernels/quant.h"

namespace baton {

class GgufError : public std::runtime_error {
 public:
  GgufError(const std::string& what, uint64_t offset)
      : std::runtime_error(what + " (at byte " + std::to_string(offset) + ")"), offset_(offset) {}
  uint64_t offset() const { return offset_; }

 private:
  uint64_t offset_;
};

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Scalars keep their declared type; integers live in
// `i` (signed view) / `u` (unsigned view), floats in `f`. Arrays hold their
// element type and items (arrays may nest).
struct GgufValue {
  GgufType type = GgufType::UINT32;
  union { uint64_t u; int64_t i; double f; } num{0};
  std::string str;                 // STRING
  GgufType elem_type = GgufType::UINT8;  // ARRAY
  std::vector<GgufValue> items;    // ARRAY

  static GgufValue of_u32(uint32_t v);
  static GgufValue of_i32(int32_t v);
  static GgufValue of_u64(uint64_t v);
  static GgufValue of_f32(float v);
  static GgufValue of_bool(bool v);
  static GgufValue of_str(std::string v);
  static GgufValue of_array(GgufType elem, std::vector<GgufValue> items);

  bool is_integer() const;
  bool is_float() const;
  // Typed views; throw std::runtime_error naming the expected type on mismatch.
  int64_t as_int() const;      // any integer type or BOOL
  double as_float() const;     // any integer or float type
  const std::string& as_str() const;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;            // 1..4
  int64_t ne[4] = {1, 1, 1, 1};  // ggml order: ne[0] is the row length; each >= 1
  DType type = DType::F32;
  uint64_t offset = 0;       // relative to the data section, as stored
  uint64_t file_offset = 0;  // absolute byte offset in the file
  uint64_t nbytes = 0;       // exact bytes of the tensor data
  uint64_t n_elements() const { return uint64_t(ne[0]) * ne[1] * ne[2] * ne[3]; }
  uint64_t row_bytes() const { return nbytes / (n_elements() / ne[0]); }
};

class GgufFile {
 public:
  // Parses and validates the header of the file at `path` (throws GgufError,
  // or std::system_error when the file cannot be opened).
  static GgufFile open(const std::string& path);
  // Same validation over an in-memory image (fuzzing, tests). Tensor data is
  // readable with read_tensor as long as `data` outlives the object.
  static GgufFile parse(const uint8_t* data, size_t size);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;  // nullptr when absent
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Required typed getters: throw std::runtime_error "missing key K" / type mismatch.
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  const std::string& get_str(std::string_view key) const;
  const GgufValue& get_array(std::string_view key) const;
  // Optional getters with a default.
  int64_t get_int(std::string_view key, int64_t def) const;
  double get_float(std::string_view key, double def) const;
  std::string get_str(std::string_view key, const std::string& def) const;
  bool get_bool(std::string_view key, bool def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

  // Reads the tensor's bytes (exactly t.nbytes) into dst with pread.
  void read_tensor(const GgufTensorInfo& t, void* dst) const;
  // Reads an arbitrary byte range of the file into dst.
  void read_bytes(uint64_t offset, uint64_t size, void* dst) const;
  // Tells the kernel a byte range already read will not be needed again, so
  // streaming copies do not fill the page cache (no-op for in-memory images).
  void drop_cache(uint64_t offset, uint64_t size) const;

  // FNV-1a 64 hash over the tensor table: the model identity used by split
  // files and the wire protocol. For each tensor in file order it feeds, all
  // little-endian: u64 name length, the name bytes, u32 type id, u32 n_dims,
  // n_dims x i64 ne, u64 nbytes. Offsets are left out on purpose: the same
  // tensors re-packed with another alignment keep their identity.
  uint64_t tensor_table_hash() const;

 private:
  GgufFile() = default;
  std::string path_;
  int fd_ = -1;
  const uint8_t* mem_ = nullptr;  // parse(): in-memory image
  uint32_t version_ = 0;
  uint64_t file_size_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  friend class GgufParser;
};

// The tensor-table hash of GgufFile::tensor_table_hash() over any list of
// tensor infos (a shard set, the parts of a split).
uint64_t hash_tensor_table(const std::vector<const GgufTensorInfo*>& tensors);

// Writes GGUF v3: header, metadata in insertion order, tensor infos, padding to
// the alignment, then tensor data each at an aligned offset. Tensor bytes come
// from a callback at write time so large tensors stream with bounded memory.
class GgufWriter {
 public:
  // Called once per tensor and write() with a buffer of exactly the tensor's
  // nbytes: memory is bounded by the largest tensor.
  using Fill = std::function<void(uint8_t* dst, uint64_t nbytes)>;
  // Called repeatedly with consecutive pieces (offset within the tensor,
  // buffer, piece size of at most 4 MiB) until the tensor is complete: memory
  // is bounded by one piece whatever the tensor size. Use it to stream copies.
  using ChunkFill = std::function<void(uint64_t offset, uint8_t* dst, uint64_t nbytes)>;

  // Throws std::invalid_argument for an empty key or an array whose items do
  // not all have its element type.
  void set(std::string key, GgufValue v);  // replaces an existing key in place
  void remove(std::string_view key);
  // ne in ggml order; nbytes is derived from the type and must be exact.
  // Throws std::invalid_argument for a duplicate name, 0 or >4 dims, a dim < 1,
  // or a row length that is not a multiple of the type's block size.
  void add_tensor(std::string name, DType type, std::vector<int64_t> ne, Fill fill);
  void add_tensor(std::string name, DType type, std::vector<int64_t> ne, std::vector<uint8_t> data);
  void add_tensor_chunked(std::string name, DType type, std::vector<int64_t> ne, ChunkFill fill);
  // A key whose value is known only after the tensor data has streamed (a
  // checksum): `placeholder` is written first and write() patches in
  // final_value() before the rename. Numeric scalar types only; the final value
  // must have the placeholder's type.
  void set_deferred(std::string key, GgufValue placeholder, std::function<GgufValue()> final_value);
  // Throws std::runtime_error on I/O failure; writes to a temporary name
  // beside path (engine/base/temp_file.h) and renames it when complete.
  // Alignment: general.alignment when set (a u32 power of two), else 32.
  void write(const std::string& path) const;
  // Same header, but the data section is left a sparse hole of its full size
  // (reads as zeros) and no fill is called: a file for tools that read only
  // the header (planning tests), made in milliseconds whatever its size.
  void write_sparse(const std::string& path) const;
  // write() without the rename: the complete, synced file under its
  // temporary name, for a caller that renames several files together (or
  // none, when one fails: destroying the TempFile removes it).
  TempFile write_uncommitted(const std::string& path) const;

 private:
  TempFile write_file(const std::string& path, bool sparse) const;
  struct Pending {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    uint64_t nbytes;
    Fill fill;             // exactly one of fill / chunk_fill is set
    ChunkFill chunk_fill;
  };
  uint64_t checked_tensor_bytes(const std::string& name, DType type,
                                const std::vector<int64_t>& ne) const;
  uint64_t alignment() const;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Pending> tensors_;
  std::vector<std::pair<std::string, std::function<GgufValue()>>> deferred_;
};

}  // namespace baton
