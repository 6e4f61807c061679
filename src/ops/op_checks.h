// Argument checks shared by every backend: an op called with a wrong shape or
// dtype is a bug in the caller, reported with both shapes before memory is touched.
#pragma once
#include <initializer_list>
#include <string>

#include "core/tensor.h"

namespace smelt {

void expect_dtype(const TensorView& view, std::initializer_list<DType> allowed, const char* op, const char* argument);
void expect_same_shape(const TensorView& a, const TensorView& b, const char* op, const char* a_name, const char* b_name);
void expect_elements(const TensorView& view, int64_t count, const char* op, const char* argument);
void expect_device(const TensorView& view, Device device, const char* op, const char* argument);

}  // namespace smelt
