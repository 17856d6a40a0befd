// A MemoryPlan: named lines of bytes (weights, kv cache, workspace...) computed
// before anything is allocated, printable, and then allocated one buffer per
// line. See docs/MEMORY.md for the rules it serves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

// Every planned buffer and every tensor inside one starts on this boundary
// (cache line, and enough for any SIMD load).
inline constexpr uint64_t kPlanAlignment = 64;
inline constexpr uint64_t align_up(uint64_t n, uint64_t a = kPlanAlignment) { return (n + a - 1) / a * a; }

class MemoryPlan {
 public:
  struct Line {
    std::string name;
    uint64_t bytes = 0;
    std::string detail;  // how the number was made, for humans
  };

  // Adds a line, or grows the line of that name.
  void add(std::string_view name, uint64_t bytes, std::string detail = {});
  uint64_t bytes(std::string_view name) const;  // 0 when absent
  uint64_t total() const;
  const std::vector<Line>& lines() const { return lines_; }
  // One line per entry plus a total, sizes in bytes and MiB.
  std::string to_string() const;

 private:
  std::vector<Line> lines_;
};

// One allocation aligned to kPlanAlignment, left uninitialised (every user
// writes before it reads); size 0 holds nothing.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(uint64_t bytes);
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  uint64_t size_ = 0;
};

}  // namespace baton
