// Shared-secret authentication for the handshake (docs/PROTOCOL.md, "Auth").
// Both sides prove knowledge of the secret with HMAC-SHA256 over the exact
// HELLO and CHALLENGE payloads, which carry one random nonce from each side,
// under a label per direction (so a proof cannot be reflected back).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "net/protocol.h"

namespace baton::net {

// The shared secret. Its bytes never reach a log, a message or an exception;
// they are wiped when the object dies.
class Secret {
 public:
  Secret() = default;
  explicit Secret(std::vector<uint8_t> bytes);
  Secret(const Secret&);
  Secret(Secret&&) noexcept;
  Secret& operator=(Secret);
  ~Secret();

  bool empty() const { return bytes_.empty(); }
  size_t size() const { return bytes_.size(); }
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads the secret file (or a pipe, e.g. /dev/fd/3). Trailing whitespace is dropped (so `openssl rand -hex
// 32 > file` works). Throws std::runtime_error when the file is missing,
// unreadable or empty; logs a warning when group or others may read it, and
// when it holds fewer than 16 bytes.
Secret load_secret_file(const std::string& path);

// 32 bytes from OpenSSL's CSPRNG; throws std::runtime_error if it fails.
Nonce random_nonce();

enum class ProofSide { client, server };

// HMAC-SHA256(secret, label(side) || u64 LE |hello| || hello || u64 LE
// |challenge| || challenge): payloads are the frames' payload bytes.
Mac handshake_proof(const Secret& secret, ProofSide side, std::span<const uint8_t> hello_payload,
                    std::span<const uint8_t> challenge_payload);

// Constant-time comparison (CRYPTO_memcmp).
bool proof_equal(const Mac& a, const Mac& b);

}  // namespace baton::net
