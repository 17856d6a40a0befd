#include "engine/base/memory_plan.h"

#include <fmt/format.h>

#include <cstdlib>
#include <new>

namespace baton {

const char* plan_line_name(PlanLine line) {
  switch (line) {
    case PlanLine::Weights: return "weights";
    case PlanLine::KvCache: return "kv cache";
    case PlanLine::Workspace: return "workspace";
    case PlanLine::LinkBuffers: return "link buffers";
    case PlanLine::Backend: return "backend";
    case PlanLine::LoadStaging: return "load staging";
    case PlanLine::PinnedIo: return "pinned io";
    case PlanLine::OptionalCaches: return "optional caches";
    case PlanLine::Drafter: return "drafter";
  }
  return "?";
}

bool plan_line_is_host(PlanLine line) { return line == PlanLine::LoadStaging || line == PlanLine::PinnedIo; }

void MemoryPlan::add(PlanLine kind, uint64_t bytes, std::string detail) {
  for (auto& l : lines_) {
    if (l.kind == kind) {
      l.bytes += bytes;
      if (!detail.empty()) l.detail = l.detail.empty() ? detail : l.detail + "; " + detail;
      return;
    }
  }
  lines_.push_back({kind, bytes, std::move(detail)});
}

uint64_t MemoryPlan::bytes(PlanLine kind) const {
  for (const auto& l : lines_) {
    if (l.kind == kind) return l.bytes;
  }
  return 0;
}

uint64_t MemoryPlan::total() const {
  uint64_t t = 0;
  for (const auto& l : lines_) t += l.bytes;
  return t;
}

std::string MemoryPlan::to_string() const {
  std::string out;
  auto row = [&](std::string_view name, uint64_t b, std::string_view detail) {
    out += fmt::format("  {:<12} {:>16} B {:>11.2f} MiB", name, b, double(b) / (1024.0 * 1024.0));
    if (!detail.empty()) out += fmt::format("  ({})", detail);
    out += '\n';
  };
  for (const auto& l : lines_) row(l.name(), l.bytes, l.detail);
  row("total", total(), "");
  return out;
}

AlignedBuffer::AlignedBuffer(uint64_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  // aligned_alloc wants a size that is a multiple of the alignment.
  void* p = std::aligned_alloc(kPlanAlignment, align_up(bytes));
  if (!p) throw std::bad_alloc();
  data_.reset(static_cast<uint8_t*>(p));
}

void AlignedBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

}  // namespace baton
