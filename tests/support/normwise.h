// The norm-wise relative error the CPU and CUDA tests share: ||got - want|| / ||want|| over n
// elements, for results a low-precision kernel reaches through roundings that cancel (an element
// near zero carries the absolute error of the terms it sums). NaN in `got` always fails, and an
// all-zero reference fails too: it would prove nothing.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace smelt::testing_support {

// want(i), got(i): the i-th reference and result, as doubles.
template <class Want, class Got>
void expect_normwise_close(int64_t n, Want want, Got got, double tolerance, const std::string& what) {
  double difference = 0, reference = 0;
  int64_t nans = 0, first_nan = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double w = want(i), g = got(i);
    if (std::isnan(g) && nans++ == 0) first_nan = i;
    difference += (g - w) * (g - w);
    reference += w * w;
  }
  ASSERT_EQ(nans, 0) << what << ": " << nans << " NaN values, the first at " << first_nan
                     << " (an output element not written, or a kernel that produced NaN)";
  ASSERT_GT(reference, 0.0) << what << ": the reference is all zeros; the test would prove nothing";
  const double relative = std::sqrt(difference / reference);
  EXPECT_LE(relative, tolerance) << what << ": norm-wise relative error " << relative << " above " << tolerance;
}

}  // namespace smelt::testing_support
