// The TCP rendezvous: a star around rank 0, length-prefixed messages, deadlines on every wait.
#include "dist/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace smelt {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x534D4C54;  // "SMLT"

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(std::min<int64_t>(left, 1 << 30)) : 0;
}

// Waits until `socket` is readable (or writable); false on timeout.
bool wait_for(int socket, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{socket, events, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Sends or receives exactly `bytes`; on failure, `what` goes into the error.
void send_all(int socket, const void* data, size_t bytes, Clock::time_point deadline, const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_for(socket, POLLOUT, deadline))
      fail(ErrorKind::device, "rendezvous: timed out sending to " + peer + "; it may have stopped, see its log");
    const ssize_t n = ::send(socket, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail(ErrorKind::device, "rendezvous: sending to " + peer + " failed (" + std::strerror(errno) +
                                  "); it may have exited, see its log");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void receive_all(int socket, void* data, size_t bytes, Clock::time_point deadline, const std::string& peer) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_for(socket, POLLIN, deadline))
      fail(ErrorKind::device, "rendezvous: " + peer + " did not send its part in time; it may be stuck or "
                              "have failed, see its log (SMELT_RENDEZVOUS_TIMEOUT sets the wait)");
    const ssize_t n = ::recv(socket, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) fail(ErrorKind::device, "rendezvous: " + peer + " closed the connection; it has probably exited, see its log");
    if (n < 0) fail(ErrorKind::device, "rendezvous: receiving from " + peer + " failed (" + std::strerror(errno) + ")");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void send_text(int socket, const std::string& text, Clock::time_point deadline, const std::string& peer) {
  const uint64_t length = text.size();
  send_all(socket, &length, sizeof length, deadline, peer);
  send_all(socket, text.data(), text.size(), deadline, peer);
}

std::string receive_text(int socket, Clock::time_point deadline, const std::string& peer) {
  uint64_t length = 0;
  receive_all(socket, &length, sizeof length, deadline, peer);
  if (length > (1ull << 30)) fail(ErrorKind::device, "rendezvous: " + peer + " sent a message of " + std::to_string(length) + " bytes; is something else listening on MASTER_PORT?");
  std::string text(length, '\0');
  receive_all(socket, text.data(), length, deadline, peer);
  return text;
}

std::string rank_name(int rank) { return "rank " + std::to_string(rank); }

}  // namespace

TcpRendezvous::TcpRendezvous(const LaunchEnvironment& env) : env_(env) {
  if (env_.world_size <= 1) return;
  peers_.assign(env_.rank == 0 ? static_cast<size_t>(env_.world_size) : 1, -1);
  if (env_.rank == 0)
    accept_peers();
  else
    connect_to_root();
}

TcpRendezvous::~TcpRendezvous() {
  for (int socket : peers_)
    if (socket >= 0) ::close(socket);
  if (listener_ >= 0) ::close(listener_);
}

std::string TcpRendezvous::where() const { return env_.master_address + ":" + std::to_string(env_.master_port); }

void TcpRendezvous::accept_peers() {
  listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener_ < 0) fail(ErrorKind::device, std::string("rendezvous: socket() failed: ") + std::strerror(errno));
  const int yes = 1;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(env_.master_port));
  if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener_, env_.world_size) != 0)
    fail(ErrorKind::device, "rendezvous: rank 0 cannot listen on port " + std::to_string(env_.master_port) + " (" +
                                std::strerror(errno) + "); choose a free MASTER_PORT");
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(env_.timeout_seconds * 1000));
  int arrived = 1;
  while (arrived < env_.world_size) {
    if (!wait_for(listener_, POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < env_.world_size; ++r)
        if (peers_[static_cast<size_t>(r)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail(ErrorKind::device, "rendezvous at " + where() + ": rank(s) " + missing + " of " +
                                  std::to_string(env_.world_size) + " did not arrive within " +
                                  std::to_string(static_cast<int>(env_.timeout_seconds)) +
                                  " s; check that every rank was started with WORLD_SIZE=" +
                                  std::to_string(env_.world_size) + " and the same MASTER_ADDR/MASTER_PORT, and can "
                                  "reach this host (SMELT_RENDEZVOUS_TIMEOUT sets the wait)");
    }
    const int socket = ::accept(listener_, nullptr, nullptr);
    if (socket < 0) continue;
    const int no_delay = 1;
    ::setsockopt(socket, IPPROTO_TCP, TCP_NODELAY, &no_delay, sizeof no_delay);
    uint32_t hello[3] = {0, 0, 0};  // magic, rank, world size
    try {
      receive_all(socket, hello, sizeof hello, deadline, "a connecting rank");
    } catch (const Error&) {
      ::close(socket);  // not one of ours (a port scanner, a stale client): keep waiting
      continue;
    }
    const int rank = static_cast<int>(hello[1]), world = static_cast<int>(hello[2]);
    if (hello[0] != kMagic) {
      ::close(socket);
      continue;
    }
    if (world != env_.world_size || rank <= 0 || rank >= env_.world_size || peers_[static_cast<size_t>(rank)] >= 0) {
      ::close(socket);
      fail(ErrorKind::config, "rendezvous at " + where() + ": a process arrived as rank " + std::to_string(rank) +
                                  " of " + std::to_string(world) + ", expected a new rank of " +
                                  std::to_string(env_.world_size) + (world == env_.world_size ? " (a rank started twice?)" : "") +
                                  "; every rank must be started with the same WORLD_SIZE and a distinct RANK");
    }
    peers_[static_cast<size_t>(rank)] = socket;
    ++arrived;
  }
}

void TcpRendezvous::connect_to_root() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(env_.timeout_seconds * 1000));
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int status = ::getaddrinfo(env_.master_address.c_str(), std::to_string(env_.master_port).c_str(), &hints, &found);
    if (status != 0) {
      last_error = std::string("cannot resolve the address: ") + gai_strerror(status);
    } else {
      for (addrinfo* a = found; a; a = a->ai_next) {
        const int socket = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (socket < 0) continue;
        if (::connect(socket, a->ai_addr, a->ai_addrlen) == 0) {
          const int no_delay = 1;
          ::setsockopt(socket, IPPROTO_TCP, TCP_NODELAY, &no_delay, sizeof no_delay);
          peers_[0] = socket;
          break;
        }
        last_error = std::strerror(errno);
        ::close(socket);
      }
      ::freeaddrinfo(found);
    }
    if (peers_[0] >= 0) break;
    if (remaining_ms(deadline) == 0)
      fail(ErrorKind::device, "rendezvous: rank " + std::to_string(env_.rank) + " could not reach rank 0 at " + where() +
                                  " within " + std::to_string(static_cast<int>(env_.timeout_seconds)) + " s (" +
                                  last_error + "); check that rank 0 is running and that MASTER_ADDR/MASTER_PORT "
                                  "point at it (SMELT_RENDEZVOUS_TIMEOUT sets the wait)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const uint32_t hello[3] = {kMagic, static_cast<uint32_t>(env_.rank), static_cast<uint32_t>(env_.world_size)};
  send_all(peers_[0], hello, sizeof hello, deadline, "rank 0");
}

std::vector<std::string> TcpRendezvous::exchange(const std::string& mine) {
  std::vector<std::string> all(static_cast<size_t>(env_.world_size));
  if (env_.world_size <= 1) {
    all[0] = mine;
    return all;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(env_.timeout_seconds * 1000));
  if (env_.rank != 0) {
    send_text(peers_[0], mine, deadline, "rank 0");
    for (auto& text : all) text = receive_text(peers_[0], deadline, "rank 0");
    return all;
  }
  all[0] = mine;
  for (int r = 1; r < env_.world_size; ++r)
    all[static_cast<size_t>(r)] = receive_text(peers_[static_cast<size_t>(r)], deadline, rank_name(r));
  for (int r = 1; r < env_.world_size; ++r)
    for (const auto& text : all) send_text(peers_[static_cast<size_t>(r)], text, deadline, rank_name(r));
  return all;
}

}  // namespace smelt
