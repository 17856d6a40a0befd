// Attribution of a worker's failure report: see failure_blame.h.
#include "coordinator/cluster/failure_blame.h"

#include "net/protocol.h"

namespace baton {

bool is_next_link_error(uint32_t code) { return code == uint32_t(net::WireError::next_link_closed); }

int blamed_stage(const FailureReport& r, int n_stages) {
  if (r.next_link && r.reporter + 1 < n_stages) return r.reporter + 1;
  return r.reporter;
}

std::string blame_text(const FailureReport& r, const std::vector<std::string>& stage_names) {
  const int n = int(stage_names.size());
  const int at = blamed_stage(r, n);
  const std::string who = at >= 0 && at < n ? stage_names[size_t(at)] : "stage " + std::to_string(at);
  if (at != r.reporter) return who + " is unreachable from stage " + std::to_string(r.reporter) + ": " + r.text;
  return who + " failed: " + r.text;
}

}  // namespace baton
