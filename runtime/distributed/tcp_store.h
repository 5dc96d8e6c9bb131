// The rendezvous of a job's processes: a key-value store over TCP that process 0 serves at
// MASTER_ADDR:MASTER_PORT and every process (0 included) reaches as a client. Gloo exchanges
// its addresses through it (it is a gloo::rendezvous::Store), NCCL's unique id goes through it,
// and it is how a process that saw a collective fail learns which processes have left: the
// server knows whose connection closed.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"

namespace lazyfuse {

class TcpStoreServer;

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Process `rank` of `world_size`; rank 0 also serves. Connecting retries until `timeout`
  // (the server may start after a client), then throws DistributedError.
  TcpStore(const std::string& host, int port, int rank, int world_size,
           std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key up to the timeout; DistributedError naming the key after it.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  // The value if set now, without waiting.
  std::optional<std::vector<char>> check(const std::string& key);

  // What the server knows of the processes: which never connected, which connected and left.
  struct Presence {
    std::vector<int> never_arrived;
    std::vector<int> gone;
  };
  Presence presence();

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::vector<std::string> request(uint32_t op, const std::vector<std::string>& parts);

  std::unique_ptr<TcpStoreServer> server_;
  int socket_ = -1;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::string where_;  // "host:port", for messages
};

}  // namespace lazyfuse
