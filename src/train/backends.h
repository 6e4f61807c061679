// Choosing a backend by name ("cpu", "cuda"), whatever was compiled in.
#pragma once
#include <memory>
#include <string>

#include "ops/backend.h"

namespace smelt {

// `device_index`: which GPU (a rank's LOCAL_RANK); ignored on the CPU.
// gemm_autotune: CUDA only (CudaBackendOptions::gemm_autotune).
std::unique_ptr<Backend> make_backend(const std::string& device, int device_index = 0, bool gemm_autotune = false);
// The CUDA backend's stream (cudaStream_t) for collectives to order against; null on the CPU.
void* backend_stream(Backend& backend);
int gpu_count();  // 0 when smelt was built without CUDA or no GPU is present

}  // namespace smelt
