// Launching many processes: the launcher's environment (torchrun, Slurm, Open MPI) and the TCP
// rendezvous ranks meet at (ranks as threads on localhost), with its timeout naming who is missing.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "dist/launch_environment.h"
#include "dist/nccl_communicator.h"
#include "dist/tcp_rendezvous.h"
#include "train/run_setup.h"

namespace smelt {
namespace {

LaunchEnvironment from(const std::map<std::string, std::string>& variables) {
  return read_launch_environment([&](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& variables) {
  try {
    from(variables);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnvironment, ReadsTorchrunSlurmAndMpiVariables) {
  const LaunchEnvironment none = from({});
  EXPECT_EQ(none.world_size, 1);
  EXPECT_FALSE(none.distributed());
  EXPECT_EQ(none.launcher, "none");

  const LaunchEnvironment torchrun = from({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                           {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29511"}});
  EXPECT_EQ(torchrun.launcher, "torchrun");
  EXPECT_EQ(torchrun.rank, 5);
  EXPECT_EQ(torchrun.world_size, 8);
  EXPECT_EQ(torchrun.local_rank, 1);
  EXPECT_EQ(torchrun.master_address, "node7");
  EXPECT_EQ(torchrun.master_port, 29511);

  const LaunchEnvironment slurm = from({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"}});
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(slurm.rank, 3);
  EXPECT_EQ(slurm.local_rank, 3);
  EXPECT_EQ(slurm.master_port, 29500);

  const LaunchEnvironment mpi = from({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "16"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"SMELT_RENDEZVOUS_TIMEOUT", "30"}});
  EXPECT_EQ(mpi.launcher, "mpi");
  EXPECT_EQ(mpi.world_size, 16);
  EXPECT_EQ(mpi.timeout_seconds, 30);
  // torchrun's variables win over Slurm's (torchrun inside an allocation).
  EXPECT_EQ(from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).launcher, "torchrun");
}

TEST(LaunchEnvironment, BadSettingsSayWhatIsWrong) {
  EXPECT_NE(error_of({{"RANK", "1"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("outside the world"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "4"}}).find("'x'"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("MASTER_PORT"), std::string::npos);
}

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(s);
  return ntohs(address.sin_port);
}

LaunchEnvironment local_rank(int rank, int world, int port, double timeout = 20) {
  LaunchEnvironment env;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.master_address = "localhost";
  env.master_port = port;
  env.launcher = "torchrun";
  env.timeout_seconds = timeout;
  return env;
}

TEST(LaunchEnvironment, ShardDegreeMinusOneTakesTheRanksLeftAfterReplication) {
  ParallelismSection p;
  p.data_parallel_shard_degree = -1;
  p.data_parallel_replicate_degree = 1;
  EXPECT_EQ(resolve_shard_degree(p, 1), 1);  // alone: no sharding
  EXPECT_EQ(resolve_shard_degree(p, 8), 8);  // every rank
  p.data_parallel_replicate_degree = 2;
  EXPECT_EQ(resolve_shard_degree(p, 8), 4);  // HSDP: 2 replicas of 4
  try {
    resolve_shard_degree(p, 6 + 1);
    FAIL() << "7 ranks into 2 replicas should not resolve";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_parallel_replicate_degree = 2"), std::string::npos) << e.what();
  }
  p.data_parallel_shard_degree = 3;
  EXPECT_EQ(resolve_shard_degree(p, 8), 3);  // explicit: as given (the executor checks it against the ranks)
  p.data_parallel_shard_degree = 0;
  EXPECT_THROW(resolve_shard_degree(p, 8), Error);
}

TEST(TcpRendezvous, EveryRankGetsEveryRanksBytesInRankOrder) {
  const int world = 4, port = free_port();
  std::vector<std::vector<std::string>> received(world);
  std::vector<std::thread> threads;
  for (int r = world - 1; r >= 0; --r)  // rank 0 starts last: the others retry until it listens
    threads.emplace_back([&, r] {
      TcpRendezvous rendezvous(local_rank(r, world, port));
      for (int round = 0; round < 3; ++round) {
        std::string mine(static_cast<size_t>(r * 1000 + round), static_cast<char>('a' + r));
        auto all = rendezvous.exchange(mine);
        if (round == 2) received[static_cast<size_t>(r)] = all;
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(received[static_cast<size_t>(r)].size(), static_cast<size_t>(world));
    for (int s = 0; s < world; ++s)
      EXPECT_EQ(received[static_cast<size_t>(r)][static_cast<size_t>(s)],
                std::string(static_cast<size_t>(s * 1000 + 2), static_cast<char>('a' + s)));
  }
}

TEST(TcpRendezvous, ARankThatNeverArrivesIsNamedAfterTheTimeout) {
  const int port = free_port();
  std::string root_error, client_error;
  std::thread rank1([&] {
    try {
      TcpRendezvous rendezvous(local_rank(1, 3, port, 1));
    } catch (const Error& e) {
      client_error = e.what();
    }
  });
  try {
    TcpRendezvous rendezvous(local_rank(0, 3, port, 1));  // rank 2 never starts
  } catch (const Error& e) {
    root_error = e.what();
  }
  rank1.join();
  EXPECT_NE(root_error.find("rank(s) 2 of 3 did not arrive"), std::string::npos) << root_error;
  EXPECT_NE(root_error.find("WORLD_SIZE=3"), std::string::npos) << root_error;
  // A rank whose root never listens names the address it tried.
  try {
    TcpRendezvous rendezvous(local_rank(2, 3, free_port(), 0.5));
    FAIL() << "reached a root that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach rank 0 at localhost:"), std::string::npos) << e.what();
  }
}

TEST(NcclCommunicator, BuiltWithoutNcclSaysHowToGetIt) {
  if (nccl_available()) GTEST_SKIP() << "built with NCCL: tests/cuda/test_nccl_communicator.cpp covers it on a GPU";
  LaunchEnvironment env;
  env.world_size = 2;
  try {
    make_nccl_communicator(env, nullptr);
    FAIL() << "made an NCCL communicator without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without NCCL"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace smelt
