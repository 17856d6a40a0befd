// Which new HTTP connections the server takes: a total cap, a cap per client
// address, and a reserve that heavy clients cannot enter, so that one client
// (or a few) holding sockets open cannot lock everyone else out.
//
//   - at most `max_total` connections in all;
//   - at most `max_per_client` from one address;
//   - the last quarter of `max_total` only for addresses that hold fewer
//     than kLightClient connections (new and light clients).
//
// Free of I/O so that tests can drive it directly; thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>

namespace baton {

class ConnectionAdmission {
 public:
  static constexpr int kLightClient = 4;

  enum class Verdict { admit, server_full, client_full };

  // max_per_client 0: half of max_total (at least 1).
  ConnectionAdmission(int max_total, int max_per_client);

  // Counts the connection when it is admitted.
  Verdict try_admit(const std::string& address);
  // An admitted connection closed.
  void release(const std::string& address);

  int total() const;
  int of(const std::string& address) const;
  int max_per_client() const { return max_per_client_; }
  // Connections that only light clients may take.
  int reserve() const { return reserve_; }

 private:
  const int max_total_, max_per_client_, reserve_;
  mutable std::mutex mu_;
  int total_ = 0;
  std::unordered_map<std::string, int> by_address_;
};

}  // namespace baton
