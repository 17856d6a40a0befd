// -v/--verbose and --log-level, the same on every command that logs (run,
// serve, worker): added to a command's options, then applied once parsed.
// Header only: the command folders link Program_options, net/ does not.
#pragma once

#include <boost/program_options.hpp>

#include <stdexcept>
#include <string>

#include "net/log.h"

namespace baton::net {

struct LogOptions {
  std::string level;  // empty: the command's default
  bool verbose = false;
};

// `default_level` is what --help shows as the default.
inline void add_log_options(boost::program_options::options_description& desc, LogOptions& o,
                            const char* default_level) {
  namespace po = boost::program_options;
  // clang-format off
  desc.add_options()
      ("verbose,v", po::bool_switch(&o.verbose), "log everything down to info lines (--log-level info)")
      ("log-level", po::value<std::string>(&o.level),
       (std::string("log lines at this level and above: debug, info, warn or error (default: ") + default_level +
        ")").c_str());
  // clang-format on
}

// Sets the process's log level; local workers this process starts get it too.
inline void apply_log_options(const LogOptions& o, LogLevel default_level) {
  LogLevel level = o.verbose ? LogLevel::info : default_level;
  if (!o.level.empty()) {
    const auto named = level_from_name(o.level);
    if (!named) throw std::invalid_argument("--log-level must be debug, info, warn or error, got '" + o.level + "'");
    level = *named;
  }
  set_log_level(level);
}

}  // namespace baton::net
