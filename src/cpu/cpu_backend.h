// The CPU reference backend: every Backend op on host memory, through the
// kernels in cpu/kernels.h (plain loops, OpenBLAS GEMM, deterministic OpenMP).
#pragma once
#include <memory>

#include "ops/backend.h"

namespace smelt {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace smelt
