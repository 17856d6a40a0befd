#include "engine/runtime/tp_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace baton {

void check_tp_rank(int file_rank, int file_size, const TpComm* tp) {
  const int size = tp ? tp->size() : 1, rank = tp ? tp->rank() : 0;
  if (size != file_size || rank != file_rank) {
    throw std::invalid_argument("this file is tensor-parallel rank " + std::to_string(file_rank) + " of " +
                                std::to_string(file_size) + ", but the stage runs as rank " + std::to_string(rank) +
                                " of " + std::to_string(size));
  }
}

class InProcessTpGroup::Member final : public TpComm {
 public:
  Member(InProcessTpGroup& g, int r) : group_(g), rank_(r) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size_; }
  void sum(float* data, size_t n) override { group_.exchange(rank_, 's', data, n, data); }
  void gather(const float* mine, size_t n, float* all) override { group_.exchange(rank_, 'g', mine, n, all); }

 private:
  InProcessTpGroup& group_;
  int rank_;
};

InProcessTpGroup::InProcessTpGroup(int size, int timeout_ms) : size_(size), timeout_ms_(timeout_ms) {
  if (size < 1) throw std::invalid_argument("InProcessTpGroup: size must be >= 1");
  for (int r = 0; r < size; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

InProcessTpGroup::~InProcessTpGroup() = default;

TpComm& InProcessTpGroup::member(int r) {
  if (r < 0 || r >= size_) throw std::out_of_range("InProcessTpGroup: no rank " + std::to_string(r));
  return *members_[size_t(r)];
}

LoneTpRank::LoneTpRank(int rank, int size) : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("LoneTpRank: rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
}

void LoneTpRank::sum(float*, size_t) {}

void LoneTpRank::gather(const float* mine, size_t n, float* all) {
  std::fill(all, all + size_t(size_) * n, 0.0f);
  if (n > 0) std::memcpy(all + size_t(rank_) * n, mine, n * sizeof(float));
}

void InProcessTpGroup::exchange(int rank, char kind, const float* mine, size_t n, float* out) {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  const char* what = kind == 's' ? "sum" : "gather";
  auto wait_for = [&](auto ready) {
    if (!cv_.wait_until(lock, deadline, [&] { return !broken_.empty() || ready(); })) {
      broken_ = "tensor-parallel group: rank " + std::to_string(rank) + " waited more than " +
                std::to_string(timeout_ms_) + " ms for the other ranks in " + what;
      cv_.notify_all();
    }
    if (!broken_.empty()) throw std::runtime_error(broken_);
  };
  wait_for([&] { return !reading_; });  // the previous round is read by everyone
  if (deposited_ == 0) {
    kind_ = kind;
    n_ = n;
    if (slots_.size() < size_t(size_) * n) slots_.resize(size_t(size_) * n);
  } else if (kind != kind_ || n != n_) {
    broken_ = "tensor-parallel group: rank " + std::to_string(rank) + " called " + what + " of " +
              std::to_string(n) + " floats while another rank called " + (kind_ == 's' ? "sum" : "gather") +
              " of " + std::to_string(n_);
    cv_.notify_all();
    throw std::runtime_error(broken_);
  }
  if (n > 0) std::memcpy(slots_.data() + size_t(rank) * n, mine, n * sizeof(float));
  if (++deposited_ == size_) {
    reading_ = true;
    cv_.notify_all();
  }
  wait_for([&] { return reading_; });
  if (kind == 'g') {
    if (n > 0) std::memcpy(out, slots_.data(), size_t(size_) * n * sizeof(float));
  } else {
    // Rank order, in float, on every rank: see tp_comm.h.
    for (size_t i = 0; i < n; ++i) {
      float s = slots_[i];
      for (int r = 1; r < size_; ++r) s += slots_[size_t(r) * n + i];
      out[i] = s;
    }
  }
  if (++read_ == size_) {
    reading_ = false;
    deposited_ = 0;
    read_ = 0;
    cv_.notify_all();
  }
}

}  // namespace baton
