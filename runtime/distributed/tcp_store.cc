// The job's rendezvous store (runtime/distributed/tcp_store.h). The wire format is a request of a
// 32-bit op and parts (each a 32-bit length and its bytes), answered by a 32-bit status and parts.
// The server runs a thread per connection; a client's first request says which rank it is, so that
// the server can tell who left when a connection closes.
#include "lazyfuse/runtime/distributed/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

enum StoreOp : uint32_t { kHello = 1, kSet, kGet, kCheck, kPresence };
enum StoreStatus : uint32_t { kOk = 0, kMissing, kTimedOut };

// All of `size` bytes sent or received, across short transfers and interrupts; false when the
// connection closed or failed.
bool transfer_all(int fd, char* p, size_t size, bool sending) {
  while (size > 0) {
    const ssize_t n = sending ? ::send(fd, p, size, MSG_NOSIGNAL) : ::recv(fd, p, size, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}
bool write_all(int fd, const void* data, size_t size) {
  return transfer_all(fd, static_cast<char*>(const_cast<void*>(data)), size, true);
}
bool read_all(int fd, void* data, size_t size) {
  return transfer_all(fd, static_cast<char*>(data), size, false);
}

bool write_message(int fd, uint32_t head, const std::vector<std::string>& parts) {
  std::string bytes;
  auto put = [&](uint32_t v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(head);
  put(static_cast<uint32_t>(parts.size()));
  for (const std::string& part : parts) {
    put(static_cast<uint32_t>(part.size()));
    bytes += part;
  }
  return write_all(fd, bytes.data(), bytes.size());
}

bool read_message(int fd, uint32_t& head, std::vector<std::string>& parts) {
  uint32_t count = 0;
  if (!read_all(fd, &head, sizeof(head)) || !read_all(fd, &count, sizeof(count))) return false;
  if (count > 1024) return false;
  parts.assign(count, {});
  for (std::string& part : parts) {
    uint32_t size = 0;
    if (!read_all(fd, &size, sizeof(size)) || size > (1u << 30)) return false;
    part.resize(size);
    if (size > 0 && !read_all(fd, part.data(), size)) return false;
  }
  return true;
}

std::string int_bytes(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
int64_t bytes_int(const std::string& s) {
  int64_t v = 0;
  std::memcpy(&v, s.data(), std::min<size_t>(8, s.size()));
  return v;
}

}  // namespace

// Process 0's server: the keys, and who is connected.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, int world_size) : world_size_(world_size) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener_ < 0)
      throw DistributedError(absl::StrCat("rendezvous: socket(): ", strerror(errno)));
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    // A job on the loopback listens there alone; else every interface, since MASTER_ADDR names
    // this machine to the others.
    const bool loopback = host == "127.0.0.1" || host == "localhost";
    address.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listener_, 128) != 0) {
      const std::string why = strerror(errno);
      ::close(listener_);
      throw DistributedError(
          absl::StrCat("rendezvous: rank 0 cannot listen on port ", port, ": ", why));
    }
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~TcpStoreServer() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    acceptor_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
      threads.swap(threads_);
    }
    changed_.notify_all();
    for (std::thread& t : threads) t.join();
  }

 private:
  void accept_loop() {
    while (!stopping_) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard lock(mutex_);
      connections_.insert(fd);
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    int rank = -1;
    uint32_t op = 0;
    std::vector<std::string> parts;
    while (read_message(fd, op, parts)) {
      std::vector<std::string> reply;
      uint32_t status = kOk;
      std::unique_lock lock(mutex_);
      if (op == kHello && parts.size() == 1) {
        rank = static_cast<int>(bytes_int(parts[0]));
        arrived_.insert(rank);
      } else if (op == kSet && parts.size() == 2) {
        values_[parts[0]] = parts[1];
        changed_.notify_all();
      } else if (op == kGet && parts.size() == 2) {
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(bytes_int(parts[1]));
        const bool found = changed_.wait_until(
            lock, deadline, [&] { return stopping_ || values_.count(parts[0]) > 0; });
        if (found && values_.count(parts[0]))
          reply.push_back(values_[parts[0]]);
        else
          status = kTimedOut;
      } else if (op == kCheck && parts.size() == 1) {
        auto it = values_.find(parts[0]);
        if (it != values_.end())
          reply.push_back(it->second);
        else
          status = kMissing;
      } else if (op == kPresence) {
        std::string never, gone;
        for (int r = 0; r < world_size_; ++r) {
          if (!arrived_.count(r)) never += int_bytes(r);
          if (left_.count(r)) gone += int_bytes(r);
        }
        reply = {never, gone};
      }
      lock.unlock();
      if (!write_message(fd, status, reply)) break;
    }
    std::lock_guard lock(mutex_);
    if (rank >= 0) left_.insert(rank);
    connections_.erase(fd);
    ::close(fd);
  }

  const int world_size_;
  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  std::set<int> arrived_, left_;
  std::set<int> connections_;
  std::vector<std::thread> threads_;
};

TcpStore::TcpStore(const std::string& host, int port, int rank, int world_size,
                   std::chrono::milliseconds timeout)
    : rank_(rank), timeout_(timeout), where_(absl::StrCat(host, ":", port)) {
  if (rank == 0) server_ = std::make_unique<TcpStoreServer>(host, port, world_size);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found))
    throw DistributedError(
        absl::StrCat("rendezvous: cannot resolve MASTER_ADDR ", host, ": ", gai_strerror(error)));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  while (true) {
    socket_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (socket_ >= 0 && ::connect(socket_, found->ai_addr, found->ai_addrlen) == 0) break;
    last_error = strerror(errno);
    if (socket_ >= 0) ::close(socket_);
    socket_ = -1;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::freeaddrinfo(found);
  if (socket_ < 0)
    throw DistributedError(absl::StrCat("rendezvous: rank ", rank, " could not reach rank 0 at ",
                                        where_, " within ", timeout.count() / 1000.0,
                                        " s: ", last_error));
  const int one = 1;
  ::setsockopt(socket_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  request(kHello, {int_bytes(rank)});
}

TcpStore::~TcpStore() {
  if (socket_ >= 0) ::close(socket_);
}

std::vector<std::string> TcpStore::request(uint32_t op, const std::vector<std::string>& parts) {
  uint32_t status = 0;
  std::vector<std::string> reply;
  if (!write_message(socket_, op, parts) || !read_message(socket_, status, reply))
    throw DistributedError(absl::StrCat("rendezvous: rank ", rank_, " lost rank 0 at ", where_,
                                        ": rank 0, which serves the rendezvous, has left the job"));
  if (status == kTimedOut)
    throw DistributedError(absl::StrCat("rendezvous: rank ", rank_, " waited ",
                                        timeout_.count() / 1000.0, " s for '", parts[0],
                                        "', which no process set"));
  if (status == kMissing) return {};
  if (reply.empty()) reply.emplace_back();
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  request(kSet, {key, std::string(data.begin(), data.end())});
}

std::vector<char> TcpStore::get(const std::string& key) {
  const std::string value = request(kGet, {key, int_bytes(timeout_.count())})[0];
  return {value.begin(), value.end()};
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  for (const std::string& key : keys) request(kGet, {key, int_bytes(timeout.count())});
}

std::optional<std::vector<char>> TcpStore::check(const std::string& key) {
  const std::vector<std::string> reply = request(kCheck, {key});
  if (reply.empty()) return std::nullopt;
  return std::vector<char>(reply[0].begin(), reply[0].end());
}

TcpStore::Presence TcpStore::presence() {
  const std::vector<std::string> reply = request(kPresence, {});
  Presence presence;
  auto ranks = [](const std::string& bytes, std::vector<int>& into) {
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8)
      into.push_back(static_cast<int>(bytes_int(bytes.substr(i, 8))));
  };
  if (reply.size() == 2) {
    ranks(reply[0], presence.never_arrived);
    ranks(reply[1], presence.gone);
  }
  return presence;
}

}  // namespace lazyfuse
