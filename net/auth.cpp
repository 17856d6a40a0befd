#include "net/auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <utility>

#include "net/log.h"

namespace baton::net {

Secret::Secret(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
Secret::Secret(const Secret& o) : bytes_(o.bytes_) {}
Secret::Secret(Secret&& o) noexcept : bytes_(std::move(o.bytes_)) { o.bytes_.clear(); }
Secret& Secret::operator=(Secret o) {
  std::swap(bytes_, o.bytes_);
  return *this;
}
Secret::~Secret() {
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
}

Secret load_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw std::runtime_error("secret file " + path + ": " + std::strerror(errno));
  }
  // A pipe (/dev/fd/N) is how a local cluster hands its workers the secret
  // without writing it anywhere.
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    throw std::runtime_error("secret file " + path + " is not a regular file or a pipe");
  }
  if (S_ISREG(st.st_mode) && (st.st_mode & (S_IRWXG | S_IRWXO))) {
    log(LogLevel::warn, "secret file " + path + " is accessible by group or others (chmod 600 it)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("secret file " + path + ": cannot open for reading");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("secret file " + path + ": read error");
  while (!bytes.empty() &&
         (bytes.back() == '\n' || bytes.back() == '\r' || bytes.back() == ' ' || bytes.back() == '\t')) {
    bytes.back() = 0;
    bytes.pop_back();
  }
  Secret s(std::move(bytes));
  if (s.empty()) throw std::runtime_error("secret file " + path + " is empty");
  if (s.size() < 16) {
    log(LogLevel::warn,
        "secret file " + path + " holds only " + std::to_string(s.size()) + " bytes; use at least 32 random bytes");
  }
  return s;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) throw std::runtime_error("OpenSSL RAND_bytes failed");
  return n;
}

namespace {

struct MacDeleter {
  void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

void put_u64le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

}  // namespace

Mac handshake_proof(const Secret& secret, ProofSide side, std::span<const uint8_t> hello_payload,
                    std::span<const uint8_t> challenge_payload) {
  if (secret.empty()) throw std::invalid_argument("handshake_proof: empty secret");
  // The labels differ in their last byte and are NUL-terminated, so the two
  // directions can never produce the same input.
  static constexpr char kClient[] = "baton-auth-v1 client";
  static constexpr char kServer[] = "baton-auth-v1 server";
  const char* label = side == ProofSide::client ? kClient : kServer;

  std::unique_ptr<EVP_MAC, MacDeleter> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!mac) throw std::runtime_error("OpenSSL: HMAC is not available");
  std::unique_ptr<EVP_MAC_CTX, MacDeleter> ctx(EVP_MAC_CTX_new(mac.get()));
  if (!ctx) throw std::runtime_error("OpenSSL: EVP_MAC_CTX_new failed");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  uint8_t len[8];
  bool ok = EVP_MAC_init(ctx.get(), secret.bytes().data(), secret.size(), params) == 1;
  ok = ok && EVP_MAC_update(ctx.get(), reinterpret_cast<const uint8_t*>(label), sizeof kClient) == 1;
  put_u64le(len, hello_payload.size());
  ok = ok && EVP_MAC_update(ctx.get(), len, 8) == 1;
  ok = ok && EVP_MAC_update(ctx.get(), hello_payload.data(), hello_payload.size()) == 1;
  put_u64le(len, challenge_payload.size());
  ok = ok && EVP_MAC_update(ctx.get(), len, 8) == 1;
  ok = ok && EVP_MAC_update(ctx.get(), challenge_payload.data(), challenge_payload.size()) == 1;
  Mac out{};
  size_t out_len = 0;
  ok = ok && EVP_MAC_final(ctx.get(), out.data(), &out_len, out.size()) == 1 && out_len == out.size();
  if (!ok) throw std::runtime_error("OpenSSL: HMAC-SHA256 failed");
  return out;
}

bool proof_equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace baton::net
