// Errors smelt reports to users. Every message says what was expected, what was
// found and what to do; the CLI maps the kind to an exit code.
#pragma once
#include <stdexcept>
#include <string>

namespace smelt {

enum class ErrorKind {
  config,    // bad config file, key, value or command line: exit code 2
  input,     // bad data file, tokenizer, checkpoint: exit code 3
  memory,    // the memory plan does not fit: exit code 4
  device,    // CUDA / library failure: exit code 5
  internal,  // a bug in smelt: exit code 70
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const;

 private:
  ErrorKind kind_;
};

[[noreturn]] void fail(ErrorKind kind, const std::string& message);

// Internal invariant check: a failure is a bug in smelt, not in the user's input.
#define SMELT_CHECK(condition, message)                                                   \
  do {                                                                                    \
    if (!(condition))                                                                     \
      ::smelt::fail(::smelt::ErrorKind::internal,                                         \
                    std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": check `" \
                        #condition "` failed: " + (message));                             \
  } while (0)

}  // namespace smelt
