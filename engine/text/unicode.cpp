#include "engine/text/unicode.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>

namespace baton {

namespace {

using C = UnicodeCategory;

struct NamedMask {
  const char* name;
  uint32_t mask;
};

constexpr uint32_t bits(std::initializer_list<C> cs) {
  uint32_t m = 0;
  for (C c : cs) m |= category_bit(c);
  return m;
}

const std::array<NamedMask, 37> kNames = {{
    {"L", bits({C::Lu, C::Ll, C::Lt, C::Lm, C::Lo})},
    {"M", bits({C::Mn, C::Mc, C::Me})},
    {"N", bits({C::Nd, C::Nl, C::No})},
    {"P", bits({C::Pc, C::Pd, C::Ps, C::Pe, C::Pi, C::Pf, C::Po})},
    {"S", bits({C::Sm, C::Sc, C::Sk, C::So})},
    {"Z", bits({C::Zs, C::Zl, C::Zp})},
    {"C", bits({C::Cc, C::Cf, C::Cs, C::Co, C::Cn})},
    {"Cn", bits({C::Cn})}, {"Lu", bits({C::Lu})}, {"Ll", bits({C::Ll})},
    {"Lt", bits({C::Lt})}, {"Lm", bits({C::Lm})}, {"Lo", bits({C::Lo})},
    {"Mn", bits({C::Mn})}, {"Mc", bits({C::Mc})}, {"Me", bits({C::Me})},
    {"Nd", bits({C::Nd})}, {"Nl", bits({C::Nl})}, {"No", bits({C::No})},
    {"Pc", bits({C::Pc})}, {"Pd", bits({C::Pd})}, {"Ps", bits({C::Ps})},
    {"Pe", bits({C::Pe})}, {"Pi", bits({C::Pi})}, {"Pf", bits({C::Pf})},
    {"Po", bits({C::Po})}, {"Sm", bits({C::Sm})}, {"Sc", bits({C::Sc})},
    {"Sk", bits({C::Sk})}, {"So", bits({C::So})}, {"Zs", bits({C::Zs})},
    {"Zl", bits({C::Zl})}, {"Zp", bits({C::Zp})}, {"Cc", bits({C::Cc})},
    {"Cf", bits({C::Cf})}, {"Cs", bits({C::Cs})}, {"Co", bits({C::Co})},
}};

}  // namespace

uint32_t category_mask(std::string_view name) {
  for (const NamedMask& n : kNames) {
    if (name == n.name) return n.mask;
  }
  return 0;
}

UnicodeCategory unicode_category(char32_t cp) {
  using unicode_detail::kCategoryRunCount;
  using unicode_detail::kCategoryRuns;
  if (cp > 0x10FFFF) return UnicodeCategory::Cn;
  // Last run whose first code point is <= cp; run 0 starts at U+0000.
  const auto* end = kCategoryRuns + kCategoryRunCount;
  const auto* it = std::upper_bound(kCategoryRuns, end, uint32_t(cp),
                                    [](uint32_t v, const unicode_detail::CategoryRun& r) { return v < r.first; });
  return static_cast<UnicodeCategory>((it - 1)->category);
}

bool unicode_is_whitespace(char32_t cp) {
  // The White_Space property list (PropList.txt); small and stable, so it is
  // written out rather than generated.
  if (cp >= 0x09 && cp <= 0x0D) return true;
  if (cp < 0x80) return cp == 0x20;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const char* unicode_version() { return unicode_detail::kUnicodeVersion; }

size_t utf8_sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

size_t utf8_decode(std::string_view s, size_t pos, char32_t& cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) {
    cp = lead;
    return 1;
  }
  size_t n = 0;
  char32_t v = 0;
  char32_t min = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2, v = lead & 0x1F, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, v = lead & 0x0F, min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4, v = lead & 0x07, min = 0x10000;
  }
  if (n == 0 || pos + n > s.size()) {
    cp = 0xFFFD;
    return 1;
  }
  for (size_t i = 1; i < n; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) {
      cp = 0xFFFD;
      return 1;
    }
    v = (v << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are malformed.
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    cp = 0xFFFD;
    return 1;
  }
  cp = v;
  return n;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

DecodedText utf8_decode_all(std::string_view s) {
  DecodedText d;
  d.cps.reserve(s.size());
  d.offsets.reserve(s.size() + 1);
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp = 0;
    const size_t n = utf8_decode(s, pos, cp);
    d.cps.push_back(cp);
    d.offsets.push_back(static_cast<uint32_t>(pos));
    pos += n;
  }
  d.offsets.push_back(static_cast<uint32_t>(s.size()));
  return d;
}

namespace {

// Length of the UTF-8 sequence a lead byte starts; 0 for a byte that cannot
// start one (continuation bytes, 0xC0/0xC1, 0xF5..0xFF). Stricter than
// utf8_sequence_length: sanitize_utf8 must find every invalid byte.
size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t utf8_incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if (is_continuation(c)) continue;
    size_t len = utf8_length(c);
    return len > back ? back : 0;
  }
  return 0;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = utf8_length(c);
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = is_continuation(static_cast<unsigned char>(s[i + k]));
    if (ok && len >= 3) {
      // Overlong forms, UTF-16 surrogates and code points past U+10FFFF.
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if (c == 0xE0 && c1 < 0xA0) ok = false;
      if (c == 0xED && c1 >= 0xA0) ok = false;
      if (c == 0xF0 && c1 < 0x90) ok = false;
      if (c == 0xF4 && c1 >= 0x90) ok = false;
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  return out;
}

}  // namespace baton
