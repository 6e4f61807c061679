// Backend factory over the CPU reference and, when built, the CUDA backend.
#include "train/backends.h"

#include "core/error.h"
#include "cpu/cpu_backend.h"
#ifdef SMELT_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace smelt {

int gpu_count() {
#ifdef SMELT_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device, int device_index, bool gemm_autotune) {
  (void)device_index;
  (void)gemm_autotune;
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
#ifdef SMELT_HAVE_CUDA
    if (cuda_device_count() == 0)
      fail(ErrorKind::device, "job.device = \"cuda\" but no CUDA GPU is visible; use --job.device=cpu or run on a GPU machine");
    if (device_index >= cuda_device_count())
      fail(ErrorKind::device, "this rank wants GPU " + std::to_string(device_index) + " (LOCAL_RANK) but " +
                                  std::to_string(cuda_device_count()) + " are visible; start at most one rank per GPU");
    CudaBackendOptions options;
    options.device = device_index;
    options.gemm_autotune = gemm_autotune;
    return make_cuda_backend(options);
#else
    fail(ErrorKind::device, "job.device = \"cuda\" but this smelt was built without CUDA (SMELT_CUDA=OFF); rebuild with nvcc available");
#endif
  }
  fail(ErrorKind::config, "job.device: expected cpu or cuda, found '" + device + "'");
}

void* backend_stream(Backend& backend) {
#ifdef SMELT_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) return cuda->stream();
#endif
  (void)backend;
  return nullptr;
}

}  // namespace smelt
