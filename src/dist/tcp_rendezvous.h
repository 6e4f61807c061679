// TcpRendezvous: how the ranks of a multi-process run find each other before NCCL exists.
// Rank 0 listens on MASTER_ADDR:MASTER_PORT, every other rank connects; then exchange() hands
// every rank each rank's bytes (the NCCL unique id, the config check), with a timeout and an
// error naming the ranks that did not arrive. Plain TCP sockets; host memory only.
#pragma once
#include <string>
#include <vector>

#include "dist/launch_environment.h"

namespace smelt {

class TcpRendezvous {
 public:
  // Blocks until every rank has connected (rank 0) or rank 0 was reached (the others), or fails
  // (ErrorKind::device) after env.timeout_seconds. A world of one opens no socket.
  explicit TcpRendezvous(const LaunchEnvironment& env);
  ~TcpRendezvous();
  TcpRendezvous(const TcpRendezvous&) = delete;
  TcpRendezvous& operator=(const TcpRendezvous&) = delete;

  // Every rank's `mine`, in rank order; all ranks call it the same number of times.
  std::vector<std::string> exchange(const std::string& mine);

 private:
  void accept_peers();
  void connect_to_root();
  std::string where() const;  // "host:port"

  LaunchEnvironment env_;
  int listener_ = -1;
  std::vector<int> peers_;  // rank 0: the socket of rank r at [r] ([0] unused); others: rank 0's at [0]
};

}  // namespace smelt
