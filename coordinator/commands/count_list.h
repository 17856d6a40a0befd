// A comma-separated list of counts on the command line (`bench --serve
// --concurrency 1,4,16`, `bench --parallel 8,32`).
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton {

// The counts of s, each in 1..max; std::invalid_argument naming `option`
// for an empty list, an empty item or anything but a count in range.
inline std::vector<int64_t> parse_count_list(const std::string& s, const std::string& option, int64_t max) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v < 1 || v > max) {
      throw std::invalid_argument(option + " takes a comma-separated list of counts in 1.." + std::to_string(max) +
                                  ", got '" + s + "'");
    }
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument(option + " needs at least one count");
  return out;
}

}  // namespace baton
