// TensorView: a non-owning, typed, shaped window onto memory that the Arena owns.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace smelt {

enum class Device : uint8_t { cpu, cuda };

constexpr int kMaxRank = 4;

struct Shape {
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> list) {
    SMELT_CHECK(list.size() <= kMaxRank, "shape rank above 4");
    for (int64_t d : list) dims[rank++] = d;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t& operator[](int i) { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  // Rows when seen as a matrix: product of all but the last dimension.
  int64_t rows() const { return rank == 0 ? 1 : numel() / dims[rank - 1]; }
  int64_t cols() const { return rank == 0 ? 1 : dims[rank - 1]; }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Device device = Device::cpu;

  TensorView() = default;
  TensorView(void* d, DType t, Shape s, Device dev = Device::cpu) : data(d), dtype(t), shape(s), device(dev) {}

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  int64_t rows() const { return shape.rows(); }
  int64_t cols() const { return shape.cols(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  // Same memory, another shape with the same element count.
  TensorView reshaped(Shape s) const;
  // Rows [first, first + count) of the matrix view (rows x cols).
  TensorView row_slice(int64_t first, int64_t count) const;
  // Elements [first, first + count) of the view in memory order, as a 1-D view.
  TensorView elements(int64_t first, int64_t count) const;
  std::string str() const;  // "bf16(8192, 4096)@cuda"
};

}  // namespace smelt
