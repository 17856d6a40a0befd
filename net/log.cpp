#include "net/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <utility>

namespace baton::net {

namespace {

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}
LogSink& sink_slot() {
  static LogSink s;
  return s;
}
std::atomic<LogLevel> g_level{LogLevel::info};

}  // namespace

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
  }
  return "?";
}

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(); }

std::optional<LogLevel> level_from_name(std::string_view name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn" || name == "warning") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  return std::nullopt;
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard lock(sink_mutex());
  return std::exchange(sink_slot(), std::move(sink));
}

void log(LogLevel level, std::string_view line) {
  std::lock_guard lock(sink_mutex());
  if (sink_slot()) {
    sink_slot()(level, line);
  } else if (log_enabled(level)) {
    const std::string_view name = level_name(level);
    std::fprintf(stderr, "baton net %.*s: %.*s\n", int(name.size()), name.data(), int(line.size()), line.data());
  }
}

std::string printable(std::string_view s, size_t max_bytes) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (char ch : s) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace baton::net
