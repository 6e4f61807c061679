// Reading the launcher's environment variables into a LaunchEnvironment.
#include "dist/launch_environment.h"

#include <cstdlib>

#include "core/error.h"

namespace smelt {

namespace {

int parse_integer(const char* name, const char* text, int minimum) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < minimum || value > 1 << 24)
    fail(ErrorKind::config, std::string("environment variable ") + name + ": expected an integer >= " +
                                std::to_string(minimum) + ", found '" + text + "'; fix the launch command");
  return static_cast<int>(value);
}

}  // namespace

LaunchEnvironment read_launch_environment(const std::function<const char*(const char*)>& lookup_function) {
  auto lookup = [&](const char* name) -> const char* {
    const char* value = lookup_function ? lookup_function(name) : std::getenv(name);
    return value && *value ? value : nullptr;
  };
  LaunchEnvironment env;
  // (rank, world size, local rank) variable names of each launcher, most specific first.
  struct Names {
    const char *launcher, *rank, *world, *local;
  };
  const Names launchers[] = {{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
                             {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
                             {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}};
  for (const Names& names : launchers) {
    const char* rank = lookup(names.rank);
    const char* world = lookup(names.world);
    if (!rank && !world) continue;
    if (!rank || !world)
      fail(ErrorKind::config, std::string("environment: ") + (rank ? names.rank : names.world) + " is set but " +
                                  (rank ? names.world : names.rank) + " is not; a " + names.launcher +
                                  " launch sets both (or unset both for a single process)");
    env.launcher = names.launcher;
    env.rank = parse_integer(names.rank, rank, 0);
    env.world_size = parse_integer(names.world, world, 1);
    const char* local = lookup(names.local);
    env.local_rank = local ? parse_integer(names.local, local, 0) : env.rank;
    if (env.rank >= env.world_size)
      fail(ErrorKind::config, std::string("environment: ") + names.rank + " = " + std::to_string(env.rank) +
                                  " is outside the world of " + std::to_string(env.world_size) +
                                  " ranks; ranks count from 0 to " + names.world + " - 1");
    break;
  }
  if (const char* address = lookup("MASTER_ADDR")) env.master_address = address;
  if (const char* port = lookup("MASTER_PORT")) env.master_port = parse_integer("MASTER_PORT", port, 1);
  if (env.master_port > 65535)
    fail(ErrorKind::config, "environment variable MASTER_PORT: expected a TCP port (1-65535), found " +
                                std::to_string(env.master_port));
  if (const char* timeout = lookup("SMELT_RENDEZVOUS_TIMEOUT"))
    env.timeout_seconds = parse_integer("SMELT_RENDEZVOUS_TIMEOUT", timeout, 1);
  return env;
}

}  // namespace smelt
