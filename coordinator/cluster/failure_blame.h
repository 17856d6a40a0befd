// Which stage a worker's report of a failure is about, and the words that
// name it. Pure functions, so that the attribution is tested without
// processes (tests/test_coord_cluster_links.cpp).
//
// A stage that reports its link to the next stage closed (ERROR
// next_link_closed for a FORWARD it could not pass on, or LINK_STATUS not
// connected) only saw the failure: the next stage died or stalled, or the
// way to it broke. The suspect is the next stage, never the reporter.
// Everything else a stage reports (a FORWARD it could not run, a load that
// failed) is about itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace baton {

struct FailureReport {
  int reporter = 0;        // the stage whose worker reported it
  bool next_link = false;  // about the reporter's link to the next stage
  std::string text;        // what the worker said (already made printable)
};

// ERROR codes that say "the link to the next stage is closed".
bool is_next_link_error(uint32_t wire_error_code);

// The stage at fault: reporter + 1 for a report about the link to the next
// stage (when there is a next stage), else the reporter.
int blamed_stage(const FailureReport& r, int n_stages);

// The failure's text, naming the stage at fault first. stage_names[i] is how
// stage i is named: its worker ("worker NAME (stage i, layers a:b, ADDR)")
// or, when vacant, "stage i (layers a:b, no worker)".
//   next_link: "<next stage> is unreachable from stage K: TEXT"
//   otherwise: "<reporter> failed: TEXT"
std::string blame_text(const FailureReport& r, const std::vector<std::string>& stage_names);

}  // namespace baton
