#include "coordinator/api/connection_admission.h"

#include <algorithm>

namespace baton {

ConnectionAdmission::ConnectionAdmission(int max_total, int max_per_client)
    : max_total_(std::max(1, max_total)),
      max_per_client_(max_per_client > 0 ? max_per_client : std::max(1, max_total_ / 2)),
      reserve_(max_total_ / 4) {}

ConnectionAdmission::Verdict ConnectionAdmission::try_admit(const std::string& address) {
  std::lock_guard lock(mu_);
  if (total_ >= max_total_) return Verdict::server_full;
  auto it = by_address_.find(address);
  const int held = it == by_address_.end() ? 0 : it->second;
  if (held >= max_per_client_) return Verdict::client_full;
  if (total_ >= max_total_ - reserve_ && held >= std::min(kLightClient, max_per_client_)) {
    return Verdict::client_full;
  }
  if (it == by_address_.end()) it = by_address_.emplace(address, 0).first;
  ++it->second;
  ++total_;
  return Verdict::admit;
}

void ConnectionAdmission::release(const std::string& address) {
  std::lock_guard lock(mu_);
  auto it = by_address_.find(address);
  if (it == by_address_.end()) return;
  --total_;
  if (--it->second == 0) by_address_.erase(it);
}

int ConnectionAdmission::total() const {
  std::lock_guard lock(mu_);
  return total_;
}

int ConnectionAdmission::of(const std::string& address) const {
  std::lock_guard lock(mu_);
  auto it = by_address_.find(address);
  return it == by_address_.end() ? 0 : it->second;
}

}  // namespace baton
