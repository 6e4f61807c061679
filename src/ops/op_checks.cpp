// Shape, dtype and device checks for op arguments.
#include "ops/op_checks.h"

#include "core/error.h"

namespace smelt {

void expect_dtype(const TensorView& view, std::initializer_list<DType> allowed, const char* op, const char* argument) {
  for (DType d : allowed)
    if (view.dtype == d) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : ", ") + std::string(dtype_name(d));
  fail(ErrorKind::internal, std::string(op) + ": " + argument + " must be one of {" + names + "}, found " + view.str());
}

void expect_same_shape(const TensorView& a, const TensorView& b, const char* op, const char* a_name, const char* b_name) {
  if (a.numel() != b.numel() || a.rows() != b.rows())
    fail(ErrorKind::internal, std::string(op) + ": " + a_name + " " + a.str() + " and " + b_name + " " + b.str() +
                                  " must have the same shape");
}

void expect_elements(const TensorView& view, int64_t count, const char* op, const char* argument) {
  if (view.numel() != count)
    fail(ErrorKind::internal, std::string(op) + ": " + argument + " must hold " + std::to_string(count) +
                                  " elements, found " + view.str());
}

void expect_device(const TensorView& view, Device device, const char* op, const char* argument) {
  if (view.device != device)
    fail(ErrorKind::internal, std::string(op) + ": " + argument + " " + view.str() + " is on the wrong device for this backend");
}

}  // namespace smelt
