// Shared-secret handling: the secret file rules and the handshake proof
// (HMAC-SHA256 over label, HELLO and CHALLENGE payloads).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "net/auth.h"
#include "net/log.h"
#include "tests/net_log_capture.h"
#include "tests/test_util.h"

namespace baton::net {
namespace {

using test::LogCapture;

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

std::string hex(const Mac& m) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t b : m) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

TEST(NetAuth, SecretFileIsReadTrimmedAndItsModeChecked) {
  test::TempDir dir;
  const std::string path = dir.file("secret");
  const std::string secret = "s3cr3t-7f1e2d3c4b5a69788796a5b4c3d2e1f0";
  test::write_file(path, bytes_of(secret + "\r\n"));

  {
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    LogCapture log;
    const Secret s = load_secret_file(path);
    EXPECT_EQ(std::vector<uint8_t>(s.bytes().begin(), s.bytes().end()), bytes_of(secret));
    EXPECT_TRUE(log.lines().empty());
  }
  {
    ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
    LogCapture log;
    const Secret s = load_secret_file(path);
    EXPECT_EQ(s.size(), secret.size());
    EXPECT_TRUE(log.contains("warn: secret file " + path + " is accessible by group or others"));
    EXPECT_FALSE(log.contains(secret));  // never the secret itself
  }
  {
    test::write_file(path, bytes_of("short"));
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    LogCapture log;
    EXPECT_EQ(load_secret_file(path).size(), 5u);
    EXPECT_TRUE(log.contains("holds only 5 bytes"));
    EXPECT_FALSE(log.contains("short\""));
  }
}

TEST(NetAuth, MissingEmptyOrNonRegularSecretFilesAreRefused) {
  test::TempDir dir;
  auto message_of = [](const std::string& path) {
    try {
      load_secret_file(path);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  const std::string missing = dir.file("nope");
  EXPECT_NE(message_of(missing).find("secret file " + missing + ": No such file"), std::string::npos)
      << message_of(missing);

  const std::string empty = dir.file("empty");
  test::write_file(empty, {});
  ::chmod(empty.c_str(), 0600);
  EXPECT_NE(message_of(empty).find("is empty"), std::string::npos);

  const std::string blank = dir.file("blank");
  test::write_file(blank, bytes_of("\n\n \t\r\n"));
  ::chmod(blank.c_str(), 0600);
  EXPECT_NE(message_of(blank).find("is empty"), std::string::npos);

  EXPECT_NE(message_of(dir.path().string()).find("is not a regular file"), std::string::npos);
}

TEST(NetAuth, HandshakeProofMatchesAnIndependentHmacSha256) {
  // Expected values from Python's hmac module over
  // label || u64le(|hello|) || hello || u64le(|challenge|) || challenge.
  const Secret key(bytes_of("0123456789abcdef0123456789abcdef"));
  std::vector<uint8_t> hello(10), challenge(5);
  for (size_t i = 0; i < hello.size(); ++i) hello[i] = uint8_t(i);
  for (size_t i = 0; i < challenge.size(); ++i) challenge[i] = uint8_t(100 + i);
  EXPECT_EQ(hex(handshake_proof(key, ProofSide::client, hello, challenge)),
            "a980ddc5656827ceb71c4ed944c238e45b019813bcddd8b672f05de4ee814cdf");
  EXPECT_EQ(hex(handshake_proof(key, ProofSide::server, hello, challenge)),
            "ab389f955b4401d7eebfee579b98f4bcd687782fc41c1c453c56fdf56470fbca");
}

TEST(NetAuth, ProofDependsOnEveryInput) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto random_bytes = [&](size_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = uint8_t(rng());
    return v;
  };
  const Secret a(random_bytes(32));
  Secret b(a);
  EXPECT_EQ(b.size(), 32u);
  std::vector<uint8_t> other = random_bytes(32);
  const Secret c(other);
  const std::vector<uint8_t> hello = random_bytes(200), challenge = random_bytes(60);

  const Mac base = handshake_proof(a, ProofSide::client, hello, challenge);
  EXPECT_TRUE(proof_equal(base, handshake_proof(b, ProofSide::client, hello, challenge)));
  EXPECT_FALSE(proof_equal(base, handshake_proof(a, ProofSide::server, hello, challenge)));
  EXPECT_FALSE(proof_equal(base, handshake_proof(c, ProofSide::client, hello, challenge)));
  for (int i = 0; i < 20; ++i) {
    std::vector<uint8_t> h = hello, ch = challenge;
    h[rng() % h.size()] ^= uint8_t(1 << (rng() % 8));
    ch[rng() % ch.size()] ^= uint8_t(1 << (rng() % 8));
    EXPECT_FALSE(proof_equal(base, handshake_proof(a, ProofSide::client, h, challenge)));
    EXPECT_FALSE(proof_equal(base, handshake_proof(a, ProofSide::client, hello, ch)));
  }
  // Moving bytes from the end of HELLO to the start of CHALLENGE changes the
  // proof: lengths are part of the input.
  std::vector<uint8_t> h2(hello.begin(), hello.end() - 1), c2 = challenge;
  c2.insert(c2.begin(), hello.back());
  EXPECT_FALSE(proof_equal(base, handshake_proof(a, ProofSide::client, h2, c2)));

  Mac flipped = base;
  flipped[31] ^= 1;
  EXPECT_FALSE(proof_equal(base, flipped));
  EXPECT_THROW(handshake_proof(Secret(), ProofSide::client, hello, challenge), std::invalid_argument);
}

TEST(NetAuth, NoncesAreFresh) {
  const Nonce a = random_nonce(), b = random_nonce();
  EXPECT_NE(a, b);
  EXPECT_NE(a, Nonce{});
}

}  // namespace
}  // namespace baton::net
