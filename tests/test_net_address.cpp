// net/address.h: HOST:PORT parsing with bracketed IPv6, the text form back,
// and host resolution (the one place names become addresses).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "net/address.h"

namespace baton::net {
namespace {

TEST(NetAddress, SplitsHostAndPortWithBracketedIpv6) {
  EXPECT_EQ(split_host_port("127.0.0.1:7070"), (std::pair<std::string, uint16_t>{"127.0.0.1", 7070}));
  EXPECT_EQ(split_host_port("spark-1:7071"), (std::pair<std::string, uint16_t>{"spark-1", 7071}));
  EXPECT_EQ(split_host_port("[::1]:7071"), (std::pair<std::string, uint16_t>{"::1", 7071}));
  EXPECT_EQ(split_host_port("[fe80::1%eth0]:0"), (std::pair<std::string, uint16_t>{"fe80::1%eth0", 0}));
  for (const char* bad : {"", "host", ":80", "host:", "host:http", "host:70000", "::1:7071", "[::1:7071", "[]:80",
                          "a]b:80"}) {
    EXPECT_THROW(split_host_port(bad), std::invalid_argument) << bad;
  }
}

TEST(NetAddress, JoinsWithBracketsForIpv6) {
  EXPECT_EQ(join_host_port("127.0.0.1", 80), "127.0.0.1:80");
  EXPECT_EQ(join_host_port("localhost", 0), "localhost:0");
  EXPECT_EQ(join_host_port("::1", 7071), "[::1]:7071");
  EXPECT_EQ(join_host_port("[::1]", 7071), "[::1]:7071");
  const auto [h, p] = split_host_port(join_host_port("::1", 9));
  EXPECT_EQ(join_host_port(h, p), "[::1]:9");
}

TEST(NetAddress, ResolvesLiteralsAndNames) {
  EXPECT_EQ(resolve_host("127.0.0.1").to_string(), "127.0.0.1");
  EXPECT_EQ(resolve_host("::1").to_string(), "::1");
  EXPECT_EQ(resolve_host("[::1]").to_string(), "::1");
  EXPECT_TRUE(resolve_host("0.0.0.0").is_unspecified());
  EXPECT_TRUE(resolve_host("localhost").is_loopback());
  EXPECT_TRUE(resolve_host("localhost").is_v4()) << "a name with an IPv4 address binds it";
  try {
    (void)resolve_host("no-such-host.invalid");
    ADD_FAILURE() << "resolved";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("cannot resolve host 'no-such-host.invalid': ", 0), 0u) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_THROW((void)resolve_host(""), std::runtime_error);
}

}  // namespace
}  // namespace baton::net
