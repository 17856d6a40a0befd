// JSON string escaping of one byte, as Python's json.dumps writes it: the
// two-character escapes for '"', '\' and the named control characters,
// \u00xx for the other control characters, every other byte (UTF-8 ones
// included) as it is. Shared by the Jinja engine's tojson and the chat
// output parsers.
#pragma once

#include <string>

namespace baton {

inline void append_json_escaped(std::string& out, char ch) {
  const auto c = static_cast<unsigned char>(ch);
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
      } else {
        out += ch;
      }
  }
}

}  // namespace baton
