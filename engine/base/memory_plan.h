// A MemoryPlan: lines of bytes (weights, kv cache, workspace...) computed
// before anything is allocated, printable, and then allocated one buffer per
// line. Every planner, stage and report names its lines with one PlanLine
// vocabulary. See docs/MEMORY.md for the rules it serves and what each line
// holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace baton {

// Every planned buffer and every tensor inside one starts on this boundary
// (cache line, and enough for any SIMD load).
inline constexpr uint64_t kPlanAlignment = 64;
inline constexpr uint64_t align_up(uint64_t n, uint64_t a = kPlanAlignment) { return (n + a - 1) / a * a; }

// The kinds of line a plan may hold (docs/MEMORY.md, "Plan lines").
enum class PlanLine {
  Weights,
  KvCache,
  Workspace,
  LinkBuffers,
  Backend,         // the backend's fixed overhead (CUDA context)
  LoadStaging,     // the loader's pinned ring, while loading
  PinnedIo,        // a CUDA stage's pinned step parameters and outputs
  OptionalCaches,
  Drafter,         // a speculative drafter's weights and context windows (DSpark), on the head's stage
};
// The printed name ("kv cache", "load staging"...), also the JSON name.
const char* plan_line_name(PlanLine line);
// Host memory beside the device: a CUDA stage's lines that a device memory
// cap does not cover. On a unified node host and device share the memory, so
// the node planner counts such a line in the node's memory where it has one.
bool plan_line_is_host(PlanLine line);

class MemoryPlan {
 public:
  struct Line {
    PlanLine kind;
    uint64_t bytes = 0;
    std::string detail;  // how the number was made, for humans
    const char* name() const { return plan_line_name(kind); }
  };

  // Adds a line, or grows the line of that kind.
  void add(PlanLine kind, uint64_t bytes, std::string detail = {});
  uint64_t bytes(PlanLine kind) const;  // 0 when absent
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
