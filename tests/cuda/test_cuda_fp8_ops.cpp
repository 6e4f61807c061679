// CUDA float8 conversions against the CPU emulation, bit for bit: amax per tensor, per row, per
// column and rows-and-columns in one pass; casts with the scale given or computed from amax inside
// the kernel (scales written back), row-major, transposed, and both layouts from one read. Shapes
// and offsets cover the 16-byte vector and tile kernels and the element-wise fallbacks.
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "core/numerics.h"
#include "cuda_test_support.h"
#include "support/fresh_random.h"

namespace smelt::test {
namespace {

const DType kSourceTypes[] = {DType::f32, DType::bf16};

struct Case {
  int64_t rows, cols;
  bool offset;  // view starts one element into its buffer: no 16-byte alignment
};

// Shapes for the vector/tile paths (multiples of 16, aligned) and for the fallbacks.
const Case kCases[] = {{64, 128, false}, {128, 4096, false}, {256, 48, false}, {37, 300, false},
                       {48, 40, false},  {64, 128, true},    {1, 16, false},   {5, 3, false}};

class CudaFloat8Ops : public CudaOpsTest {
 protected:
  // A device copy of `host` whose data pointer is one element past a 256-byte boundary when `offset`.
  TensorView upload_at(const HostTensor& host, bool offset) {
    if (!offset) return upload(host);
    const Shape padded{host.view.numel() + 1};
    TensorView buffer = allocate(host.view.dtype, padded);
    TensorView view(static_cast<char*>(buffer.data) + dtype_size(host.view.dtype), host.view.dtype, host.view.shape,
                    buffer.device);
    cuda_->copy_to_device(view, host.view.data);
    return view;
  }
  std::string name(const Case& c, DType source, const char* what) {
    return std::string(what) + " " + std::string(dtype_name(source)) + " (" + std::to_string(c.rows) + ", " +
           std::to_string(c.cols) + ")" + (c.offset ? " unaligned" : "");
  }
};

TEST_F(CudaFloat8Ops, AmaxPerTensorRowColumnAndBothMatchesCpu) {
  // And one wide enough for the rows-and-columns kernel's two-vector tiles (rows not a multiple
  // of the tile's 64).
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({4100, 8192, false});
  for (const Case& c : cases)
    for (DType source : kSourceTypes) {
      const HostTensor x = random_tensor(source, Shape{c.rows, c.cols}, 91 + uint64_t(c.rows), 3.0);
      const TensorView d_x = upload_at(x, c.offset);
      // Tensorwise, per row, per column (rowwise over x^T), rows and columns from one read,
      // tensorwise plus columns.
      struct Mode {
        bool rowwise, transpose, columns;
        const char* what;
      };
      for (const Mode mode : {Mode{false, false, false, "amax tensor"}, Mode{true, false, false, "amax rows"},
                              Mode{true, true, false, "amax columns"}, Mode{true, false, true, "amax rows+columns"},
                              Mode{false, false, true, "amax tensor+columns"}}) {
        const int64_t count = !mode.rowwise ? 1 : mode.transpose ? c.cols : c.rows;
        HostTensor want = nan_tensor(DType::f32, Shape{count}), want_columns = nan_tensor(DType::f32, Shape{c.cols});
        AmaxArgs cpu_args;
        cpu_args.x = x.view;
        cpu_args.amax = want.view;
        cpu_args.rowwise = mode.rowwise;
        cpu_args.transpose = mode.transpose;
        if (mode.columns) cpu_args.column_amax = want_columns.view;
        cpu_->amax(cpu_args);
        AmaxArgs args = cpu_args;
        args.x = d_x;
        args.amax = poisoned(DType::f32, Shape{count});
        if (mode.columns) args.column_amax = poisoned(DType::f32, Shape{c.cols});
        cuda_->amax(args);
        expect_bits_equal(want, download(args.amax), name(c, source, mode.what));
        if (mode.columns) expect_bits_equal(want_columns, download(args.column_amax), name(c, source, mode.what));
      }
    }
}

TEST_F(CudaFloat8Ops, CastsWithScalesFromAmaxMatchCpuInEveryLayout) {
  for (const Case& c : kCases)
    for (DType source : kSourceTypes)
      for (bool rowwise : {false, true})
        for (bool power_of_two : {false, true}) {
          const HostTensor x = random_tensor(source, Shape{c.rows, c.cols}, 97 + uint64_t(c.cols), 7.0);
          const TensorView d_x = upload_at(x, c.offset);
          const int64_t row_scales = rowwise ? c.rows : 1, column_scales = rowwise ? c.cols : 1;
          // The amax the casts start from, computed once on the CPU and uploaded.
          HostTensor row_amax = nan_tensor(DType::f32, Shape{row_scales});
          HostTensor column_amax = nan_tensor(DType::f32, Shape{column_scales});
          AmaxArgs amax;
          amax.x = x.view;
          amax.amax = row_amax.view;
          amax.rowwise = rowwise;
          if (rowwise) amax.column_amax = column_amax.view;
          cpu_->amax(amax);
          if (!rowwise) column_amax = row_amax;
          const TensorView d_row_amax = upload(row_amax), d_column_amax = upload(column_amax);
          const std::string suffix = std::string(rowwise ? " rowwise" : " tensorwise") + (power_of_two ? " pow2" : "");

          // Both layouts from one read: dst e4m3 row-major, dst_transposed e5m2.
          HostTensor dst(DType::e4m3, Shape{c.rows, c.cols}), dst_t(DType::e5m2, Shape{c.cols, c.rows});
          HostTensor scale = nan_tensor(DType::f32, Shape{row_scales}), scale_t = nan_tensor(DType::f32, Shape{column_scales});
          QuantizeArgs q;
          q.src = x.view;
          q.dst = dst.view;
          q.scale = scale.view;
          q.amax = row_amax.view;
          q.rowwise = rowwise;
          q.round_scale_to_power_of_two = power_of_two;
          q.dst_transposed = dst_t.view;
          q.amax_transposed = column_amax.view;
          q.scale_transposed = scale_t.view;
          cpu_->quantize(q);
          QuantizeArgs d = q;
          d.src = d_x;
          d.dst = poisoned(DType::e4m3, Shape{c.rows, c.cols});
          d.scale = poisoned(DType::f32, Shape{row_scales});
          d.amax = d_row_amax;
          d.dst_transposed = poisoned(DType::e5m2, Shape{c.cols, c.rows});
          d.amax_transposed = d_column_amax;
          d.scale_transposed = poisoned(DType::f32, Shape{column_scales});
          cuda_->quantize(d);
          expect_bits_equal(dst, download(d.dst), name(c, source, "both layouts: dst") + suffix);
          expect_bits_equal(dst_t, download(d.dst_transposed), name(c, source, "both layouts: dst^T") + suffix);
          expect_bits_equal(scale, download(d.scale), name(c, source, "both layouts: scale") + suffix);
          expect_bits_equal(scale_t, download(d.scale_transposed), name(c, source, "both layouts: scale^T") + suffix);

          // Row-major only, and transposed only (the legacy `transpose` flag), scale from amax.
          for (bool transpose : {false, true}) {
            const int64_t scales = transpose ? column_scales : row_scales;
            const Shape shape = transpose ? Shape{c.cols, c.rows} : Shape{c.rows, c.cols};
            HostTensor one(DType::e4m3, shape), one_scale = nan_tensor(DType::f32, Shape{scales});
            QuantizeArgs single;
            single.src = x.view;
            single.dst = one.view;
            single.scale = one_scale.view;
            single.amax = transpose ? column_amax.view : row_amax.view;
            single.rowwise = rowwise;
            single.transpose = transpose;
            single.round_scale_to_power_of_two = power_of_two;
            cpu_->quantize(single);
            QuantizeArgs device = single;
            device.src = d_x;
            device.dst = poisoned(DType::e4m3, shape);
            device.scale = poisoned(DType::f32, Shape{scales});
            device.amax = transpose ? d_column_amax : d_row_amax;
            cuda_->quantize(device);
            const std::string what = transpose ? "transposed: " : "row-major: ";
            expect_bits_equal(one, download(device.dst), name(c, source, (what + "dst").c_str()) + suffix);
            expect_bits_equal(one_scale, download(device.scale), name(c, source, (what + "scale").c_str()) + suffix);
          }
        }
}

// Values the cast must round, saturate or pass through exactly as the CPU does, in both layouts
// from one read (e4m3 rows, e5m2 columns) and in the row-major and transposed casts alone, at a
// given scale that takes the larger normal draws past e4m3's 448: infinities, values far past
// either format's largest, negative zero, values that round to zero or to subnormals, and NaN of
// either sign. NaN sits in a few places only, so most 16-element groups hold infinities but no NaN
// (the kernels treat the two kinds of group differently) and a few hold both. One difference is
// expected: a negative NaN times the scale is the GPU's canonical (positive) NaN, so its code is
// 0x7F where the CPU, which keeps the sign through the multiply, writes 0xFF.
TEST_F(CudaFloat8Ops, CastsOfSpecialValuesMatchCpu) {
  const double specials[] = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), 1e30,
                             -3e5, 12.0, -0.0, 1e-30, 3e-6, -2e-9, 0.0};
  for (const Case& c : {Case{64, 128, false}, Case{48, 40, false}, Case{37, 300, false}})
    for (DType source : kSourceTypes) {
      HostTensor x = random_tensor(source, Shape{c.rows, c.cols}, 131 + uint64_t(c.rows + c.cols), 7.0);
      Random random(testing_support::fresh(uint64_t(c.rows * 7 + c.cols)));
      for (int64_t i = 0; i < x.numel(); ++i)
        if (random.below(16) == 0) x.set(i, specials[random.below(sizeof(specials) / sizeof(specials[0]))]);
      const int64_t positive_nan = 3 * c.cols + 5, negative_nan = (c.rows - 2) * c.cols + c.cols / 2;
      x.set(positive_nan, std::numeric_limits<double>::quiet_NaN());
      if (source == DType::f32) x.view.as<uint32_t>()[negative_nan] = 0xFFC00000u;
      else x.view.as<uint16_t>()[negative_nan] = 0xFFC0u;
      const TensorView d_x = upload(x);
      // The CPU's codes with the negative NaN's made positive (dst row-major, or transposed).
      auto as_on_gpu = [&](HostTensor codes, bool transposed) {
        const int64_t at = transposed ? (negative_nan % c.cols) * c.rows + negative_nan / c.cols : negative_nan;
        EXPECT_EQ(codes.view.as<uint8_t>()[at], 0xFF) << "the CPU keeps a negative NaN's sign";
        codes.view.as<uint8_t>()[at] = 0x7F;
        return codes;
      };
      HostTensor scale(DType::f32, Shape{1});
      scale.set(0, 40.0);
      const TensorView d_scale = upload(scale);

      HostTensor dst(DType::e4m3, Shape{c.rows, c.cols}), dst_t(DType::e5m2, Shape{c.cols, c.rows});
      QuantizeArgs q;
      q.src = x.view;
      q.dst = dst.view;
      q.scale = scale.view;
      q.dst_transposed = dst_t.view;
      q.scale_transposed = scale.view;
      cpu_->quantize(q);
      QuantizeArgs d = q;
      d.src = d_x;
      d.dst = poisoned(DType::e4m3, Shape{c.rows, c.cols});
      d.scale = d_scale;
      d.dst_transposed = poisoned(DType::e5m2, Shape{c.cols, c.rows});
      d.scale_transposed = d_scale;
      cuda_->quantize(d);
      expect_bits_equal(as_on_gpu(dst, false), download(d.dst), name(c, source, "special values, both layouts: dst"));
      expect_bits_equal(as_on_gpu(dst_t, true), download(d.dst_transposed),
                        name(c, source, "special values, both layouts: dst^T"));

      for (bool transpose : {false, true}) {
        const Shape shape = transpose ? Shape{c.cols, c.rows} : Shape{c.rows, c.cols};
        HostTensor one(DType::e5m2, shape);
        QuantizeArgs single;
        single.src = x.view;
        single.dst = one.view;
        single.scale = scale.view;
        single.transpose = transpose;
        cpu_->quantize(single);
        QuantizeArgs device = single;
        device.src = d_x;
        device.dst = poisoned(DType::e5m2, shape);
        device.scale = d_scale;
        cuda_->quantize(device);
        expect_bits_equal(as_on_gpu(one, transpose), download(device.dst),
                          name(c, source, transpose ? "special values, transposed" : "special values, row-major"));
      }
    }
}

// The byte transpose that makes a tensorwise W^T from W: random codes (every byte value), on the
// tile kernel's shapes and the element-wise fallback's (odd shapes, unaligned views), bit for bit
// against the CPU, over a poisoned dst.
TEST_F(CudaFloat8Ops, TransposeOfCodesMatchesCpu) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c, DType::e4m3, "transpose"));
    HostTensor codes(DType::e4m3, Shape{c.rows, c.cols});
    Random random(testing_support::fresh(uint64_t(c.rows * 131 + c.cols)));
    for (int64_t i = 0; i < codes.numel(); ++i) codes.view.as<uint8_t>()[i] = uint8_t(random.below(256));
    HostTensor cpu_out(DType::e4m3, Shape{c.cols, c.rows});
    cpu_->transpose({codes.view, cpu_out.view});
    const TensorView out = poisoned(DType::e4m3, Shape{c.cols, c.rows});
    cuda_->transpose({upload_at(codes, c.offset), out});
    expect_bits_equal(cpu_out, download(out), "transposed codes");
  }
  const TensorView src = poisoned(DType::e4m3, Shape{16, 32});
  EXPECT_THROW(cuda_->transpose({src, poisoned(DType::e4m3, Shape{16, 32})}), Error);
  EXPECT_THROW(cuda_->transpose({src, poisoned(DType::e5m2, Shape{32, 16})}), Error);
}

}  // namespace
}  // namespace smelt::test
