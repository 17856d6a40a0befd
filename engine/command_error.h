// An error that ends a `baton` command with an exit status other than 1.
// The commands throw it; cli/main.cpp prints it like any other error (one line,
// "baton COMMAND: message") and exits with its status. It lives here, below
// every command folder, so that coordinator/, worker/ and gguf_split/ can throw
// it without including cli/.
#pragma once

#include <stdexcept>
#include <string>

namespace baton {

// Exit statuses of every command: 0 ok, 1 error, 2 refused (the model does not
// fit, or the backend asked for is not there).
inline constexpr int kExitError = 1;
inline constexpr int kExitRefused = 2;

struct CommandError : std::runtime_error {
  CommandError(const std::string& what, int status) : std::runtime_error(what), status(status) {}
  int status;
};

}  // namespace baton
