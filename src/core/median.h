// The median of a set of measurements (the mean of the two middle values for an even count; 0
// for none): step times, clock and power samples.
#pragma once
#include <algorithm>
#include <vector>

namespace smelt {

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace smelt
