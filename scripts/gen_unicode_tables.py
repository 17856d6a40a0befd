#!/usr/bin/env python3
"""Generate engine/text/unicode_tables.cpp: the Unicode general category of every
code point, as a sorted table of runs (first code point of a run, category).

Usage: python3 scripts/gen_unicode_tables.py [OUTPUT]   (default engine/text/unicode_tables.cpp)

Only Python's standard `unicodedata` module is used, so the table follows the
Unicode version of the Python that runs this script (printed into the output).
The category order must match `enum class UnicodeCategory` in engine/text/unicode.h.
"""
import os
import sys
import unicodedata

# Same order as baton::UnicodeCategory; Cn (unassigned) is 0.
CATEGORIES = [
    "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
    "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So",
    "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co",
]
MAX_CP = 0x10FFFF


def runs():
    index = {c: i for i, c in enumerate(CATEGORIES)}
    out = []
    prev = None
    for cp in range(MAX_CP + 1):
        cat = index[unicodedata.category(chr(cp))]
        if cat != prev:
            out.append((cp, cat))
            prev = cat
    return out


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    path = argv[1] if len(argv) > 1 else os.path.join(here, "..", "engine", "unicode_tables.cpp")
    table = runs()
    lines = [
        "// GENERATED FILE - do not edit by hand.",
        "// Made by scripts/gen_unicode_tables.py with Python %s's unicodedata" % sys.version.split()[0],
        "// (Unicode %s). Regenerate: python3 scripts/gen_unicode_tables.py" % unicodedata.unidata_version,
        "//",
        "// General category runs: each entry is the first code point of a run of",
        "// code points sharing one category; a run ends where the next begins.",
        '#include "engine/text/unicode.h"',
        "",
        "namespace baton::unicode_detail {",
        "",
        'extern const char kUnicodeVersion[] = "%s";' % unicodedata.unidata_version,
        "extern const CategoryRun kCategoryRuns[] = {",
    ]
    row = []
    for cp, cat in table:
        row.append("{0x%X, %d}," % (cp, cat))
        if len(row) == 8:
            lines.append("    " + " ".join(row))
            row = []
    if row:
        lines.append("    " + " ".join(row))
    lines += [
        "};",
        "extern const size_t kCategoryRunCount = sizeof(kCategoryRuns) / sizeof(kCategoryRuns[0]);",
        "",
        "}  // namespace baton::unicode_detail",
        "",
    ]
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines))
    print("wrote %s: %d runs (Unicode %s)" % (path, len(table), unicodedata.unidata_version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
