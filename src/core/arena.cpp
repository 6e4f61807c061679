// Arena and host memory resource.
#include "core/arena.h"

#include <cstdlib>
#include <string>

namespace smelt {

void* HostMemoryResource::allocate(size_t bytes) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded);
  if (!p)
    fail(ErrorKind::memory, "host allocation of " + std::to_string(bytes) +
                                " bytes failed; reduce batch size or sequence length, or use a checkpointing policy");
  ++allocations_;
  return p;
}

void HostMemoryResource::deallocate(void* pointer) { std::free(pointer); }

Arena::Arena(MemoryResource& resource, size_t bytes) : resource_(resource), bytes_(bytes) {
  base_ = static_cast<char*>(resource_.allocate(bytes_));
}

Arena::~Arena() {
  if (base_) resource_.deallocate(base_);
}

TensorView Arena::view(size_t offset, DType dtype, Shape shape) const {
  size_t need = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  SMELT_CHECK(offset + need <= bytes_, "view of " + std::to_string(need) + " bytes at offset " +
                                           std::to_string(offset) + " exceeds the arena of " + std::to_string(bytes_));
  return TensorView(base_ + offset, dtype, shape, device());
}

}  // namespace smelt
