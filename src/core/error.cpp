// Error kinds to exit codes.
#include "core/error.h"

namespace smelt {

int Error::exit_code() const {
  switch (kind_) {
    case ErrorKind::config: return 2;
    case ErrorKind::input: return 3;
    case ErrorKind::memory: return 4;
    case ErrorKind::device: return 5;
    case ErrorKind::internal: return 70;
  }
  return 1;
}

void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace smelt
