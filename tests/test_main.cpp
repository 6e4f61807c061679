// GoogleTest entry point shared by every test executable. Each test draws a fresh seed as it
// starts (tests/support/fresh_random.h), named when the test fails.
#include <gtest/gtest.h>

#include "support/fresh_random.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new smelt::testing_support::FreshSeedListener);
  return RUN_ALL_TESTS();
}
