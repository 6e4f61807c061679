// Expecting an Error of a given kind whose message holds given phrases (the key, file and line
// a message must name).
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace smelt::testing_support {

// Runs `action`, expects an Error of `kind` whose message contains every one of `needles`.
inline void expect_error(ErrorKind kind, const std::function<void()>& action, const std::vector<std::string>& needles) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), kind) << error.what();
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "expected \"" << needle << "\" in the message: " << error.what();
    return;
  }
  ADD_FAILURE() << "expected an error mentioning \"" << (needles.empty() ? "" : needles.front()) << "\", got none";
}

}  // namespace smelt::testing_support
