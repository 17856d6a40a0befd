// Log output of the net layer. Connections log why they close; a process
// (or a test) can route these lines elsewhere with set_log_sink. Peer-supplied
// text is passed through printable() before it is logged.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace baton::net {

enum class LogLevel { debug, info, warn, error };

using LogSink = std::function<void(LogLevel, std::string_view)>;

// Replaces the sink (nullptr restores the default: "baton net <level>: ..." on
// stderr). Thread-safe; returns the previous sink.
LogSink set_log_sink(LogSink sink);
void log(LogLevel level, std::string_view line);

// The default sink prints the lines at or above this level (default info;
// commands set it from -v and --log-level); a sink set above gets every line.
void set_log_level(LogLevel level);
LogLevel log_level();
inline bool log_enabled(LogLevel level) { return level >= log_level(); }

std::string_view level_name(LogLevel level);
// "debug", "info", "warn" (or "warning"), "error"; nullopt for another name.
std::optional<LogLevel> level_from_name(std::string_view name);

// Untrusted text made safe for one log line: non-printable bytes become
// \xNN and the result is cut at max_bytes.
std::string printable(std::string_view s, size_t max_bytes = 200);

}  // namespace baton::net
