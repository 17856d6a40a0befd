// Progress lines on stderr rewrite themselves in place ('\r', no newline)
// until the work is done. Whatever is printed next while one is still open
// (the error that cut the work short) must start on a line of its own: every
// progress printer says whether it left a line open, and cli/'s error wrapper
// ends it before printing.
#pragma once

namespace baton {

// After printing a '\r' progress line: `open` is true while the line has no
// newline yet.
void set_progress_line_open(bool open);
// Prints the newline that ends an open progress line (on stderr), if any.
void end_progress_line();

}  // namespace baton
