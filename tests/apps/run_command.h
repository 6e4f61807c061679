// Runs a shell command for the command-line tests: its exit code and its output (stdout and
// stderr together).
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace smelt::testing_support {

struct Outcome {
  int exit_code = -1;  // -1: the command did not start or did not exit normally
  std::string output;  // stdout and stderr together
};

inline Outcome run_command(const std::string& command) {
  Outcome outcome;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return outcome;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) outcome.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return outcome;
}

}  // namespace smelt::testing_support
