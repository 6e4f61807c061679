// Choosing a backend by name ("cpu", "cuda"), whatever was compiled in.
#pragma once
#include <memory>
#include <string>

#include "ops/backend.h"

namespace smelt {

std::unique_ptr<Backend> make_backend(const std::string& device);
int gpu_count();  // 0 when smelt was built without CUDA or no GPU is present

}  // namespace smelt
