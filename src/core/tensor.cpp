// TensorView helpers: reshaping, row slices, printing.
#include "core/tensor.h"

namespace smelt {

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

TensorView TensorView::reshaped(Shape s) const {
  SMELT_CHECK(s.numel() == numel(), "reshape of " + str() + " to " + s.str() + " changes the element count");
  return TensorView(data, dtype, s, device);
}

TensorView TensorView::row_slice(int64_t first, int64_t count) const {
  SMELT_CHECK(first >= 0 && count >= 0 && first + count <= rows(),
              "row slice [" + std::to_string(first) + ", " + std::to_string(first + count) + ") of " + str());
  auto* base = static_cast<char*>(data) + static_cast<size_t>(first * cols()) * dtype_size(dtype);
  return TensorView(base, dtype, Shape{count, cols()}, device);
}

TensorView TensorView::elements(int64_t first, int64_t count) const {
  SMELT_CHECK(first >= 0 && count >= 0 && first + count <= numel(),
              "elements [" + std::to_string(first) + ", " + std::to_string(first + count) + ") of " + str());
  return TensorView(static_cast<char*>(data) + static_cast<size_t>(first) * dtype_size(dtype), dtype, Shape{count},
                    device);
}

std::string TensorView::str() const {
  return std::string(dtype_name(dtype)) + shape.str() + (device == Device::cpu ? "@cpu" : "@cuda");
}

}  // namespace smelt
