// safetensors reader: the checkpoint format of HuggingFace models.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v", ...},
//    "NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
// and then the data section; offsets are relative to its start, shapes are
// row-major (d0 outermost), data little-endian. The header is validated
// before anything else is trusted: length bounded, every tensor inside the
// data section, byte size = product(shape) x dtype size, tensors tiling the
// section without overlap or hole (as the format's reference implementation
// demands). Only F32, F16, BF16, I32 and I64 tensors are accepted; others are
// refused by name. Tensor data is read on demand with pread; nothing is mapped.
//
// A sharded checkpoint is a folder with model.safetensors.index.json whose
// "weight_map" names the shard of every tensor; a single-file checkpoint is
// model.safetensors. SafetensorsCheckpoint opens either.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/quant.h"

namespace baton {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;     // F32, F16, BF16, I32 or I64
  std::vector<int64_t> shape;   // row-major, outermost first; empty for a scalar
  uint64_t file_offset = 0;     // absolute byte offset of the data in its file
  uint64_t nbytes = 0;
  uint64_t n_elements() const;
  int64_t row_length() const { return shape.empty() ? 1 : shape.back(); }
  uint64_t n_rows() const;  // n_elements / row_length (0 for an empty tensor)
};

class SafetensorsFile {
 public:
  // Headers above this are refused unread (the format's own limit is 100 MB).
  static constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

  // Throws SafetensorsError naming the file and the problem.
  static SafetensorsFile open(const std::string& path);
  // The same validation over an in-memory image (tests); data must outlive it.
  static SafetensorsFile parse(const uint8_t* data, size_t size, std::string name = "(memory)");

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data order
  const SafetensorsTensor* find(std::string_view name) const;                  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads rows [first_row, first_row + n_rows) of t (t.row_length() elements
  // each) into dst; throws SafetensorsError on a short read.
  void read_rows(const SafetensorsTensor& t, uint64_t first_row, uint64_t n_rows, void* dst) const;
  void read(const SafetensorsTensor& t, void* dst) const { read_rows(t, 0, t.n_rows(), dst); }
  // Tells the kernel a range already read will not be needed again.
  void drop_cache(uint64_t offset, uint64_t size) const;

 private:
  SafetensorsFile() = default;
  void parse_header(const uint8_t* header, uint64_t header_len);
  void read_bytes(uint64_t offset, uint64_t size, void* dst) const;

  std::string path_;
  int fd_ = -1;
  const uint8_t* mem_ = nullptr;
  uint64_t file_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a checkpoint folder, whichever shard holds them.
class SafetensorsCheckpoint {
 public:
  // DIR/model.safetensors.index.json when present, else DIR/model.safetensors.
  // Throws SafetensorsError (no checkpoint, bad index, shard missing a tensor
  // the index promises, a tensor in two shards).
  static SafetensorsCheckpoint open(const std::string& dir);

  struct Entry {
    const SafetensorsTensor* tensor;
    const SafetensorsFile* file;
  };
  const Entry* find(std::string_view name) const;  // nullptr when absent
  const std::map<std::string, Entry, std::less<>>& tensors() const { return entries_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace baton
