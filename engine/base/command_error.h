// An error that ends a `baton` command with an exit status other than 1.
// The commands throw it; cli/main.cpp prints it like any other error (one line,
// "baton COMMAND: message") and exits with its status. It lives here, below
// every command folder, so that coordinator/, worker/ and gguf_split/ can throw
// it without including cli/.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace baton {

// Exit statuses of every command (README, "Exit status"): 0 ok, 1 error, 2
// refused (baton plan: the model does not fit; or the backend asked for is
// not there).
inline constexpr int kExitError = 1;
inline constexpr int kExitRefused = 2;

struct CommandError : std::runtime_error {
  CommandError(const std::string& what, int status) : std::runtime_error(what), status(status) {}
  int status;
};

// Runs f; an error it throws about the file at `path` comes out with the
// file's name in front ("PATH: why", unless the message starts with it), so
// that a command's error line says which file it is about.
template <typename F>
auto about_file(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const CommandError&) {
    throw;
  } catch (const std::exception& e) {
    if (std::string_view(e.what()).rfind(path, 0) == 0) throw;
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace baton
