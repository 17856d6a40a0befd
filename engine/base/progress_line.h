// Progress lines on stderr. On a terminal a progress line rewrites itself in
// place ('\r', no newline) until the work is done; into a file or a pipe
// (a log, CI) '\r' would pile every report onto one endless line, so there
// each report is a whole line, one every few seconds and always the last.
// Whatever is printed next while a terminal line is still open (the error
// that cut the work short) must start on a line of its own: cli/'s error
// wrapper ends it before printing.
#pragma once

#include <string_view>

namespace baton {

// Prints one progress report (text without '\r' or newline); `done` for the
// last one of the work, which ends the line.
void print_progress_line(std::string_view text, bool done);

// Prints the newline that ends an open progress line (on stderr), if any.
void end_progress_line();

}  // namespace baton
