// Arena: the one allocation per device that holds every buffer of a run.
// MemoryResource is where that allocation comes from; it counts allocations so
// tests can assert that nothing is allocated after start-up.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace smelt {

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual void* allocate(size_t bytes) = 0;  // throws Error(memory) when it cannot
  virtual void deallocate(void* pointer) = 0;
  virtual Device device() const = 0;
  int64_t allocation_count() const { return allocations_; }
  // Holds all of the device's free memory but `bytes`, so the run truly has no more than that
  // (an explicit activation_checkpoint.memory_budget_gb, made physical the way a per-process
  // memory fraction is). Returns the bytes held back; 0 where the resource has no cap (host).
  virtual size_t limit_to(size_t bytes) { (void)bytes; return 0; }

 protected:
  int64_t allocations_ = 0;
};

// Host memory, 4 KiB aligned.
class HostMemoryResource : public MemoryResource {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* pointer) override;
  Device device() const override { return Device::cpu; }
};

class Arena {
 public:
  Arena(MemoryResource& resource, size_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  size_t size() const { return bytes_; }
  Device device() const { return resource_.device(); }
  char* base() const { return base_; }
  // A typed window at `offset`; checks that it lies inside the arena.
  TensorView view(size_t offset, DType dtype, Shape shape) const;

 private:
  MemoryResource& resource_;
  size_t bytes_ = 0;
  char* base_ = nullptr;
};

}  // namespace smelt
