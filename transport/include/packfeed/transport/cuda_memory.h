#ifndef PACKFEED_TRANSPORT_CUDA_MEMORY_H_
#define PACKFEED_TRANSPORT_CUDA_MEMORY_H_

// The CUDA runtime calls the ring needs, behind RAII. Built against the CUDA
// toolkit when it is installed; without it (or without a device at run time)
// CudaDeviceCount() is 0 and everything else returns FailedPrecondition.

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace packfeed::transport {

// Number of usable CUDA devices; 0 on any error (no toolkit, no driver, no
// device: "driver version is insufficient" is how a GPU-less machine answers).
int CudaDeviceCount();

// Host memory page-locked with cudaHostRegister so a copy to the device can
// run asynchronously. Move-only; unregisters on destruction what it registered
// (a range already page-locked by someone else is accepted and left alone).
class CudaHostRegistration {
 public:
  static absl::StatusOr<CudaHostRegistration> Register(void* address, size_t length);
  CudaHostRegistration(CudaHostRegistration&& other) noexcept;
  CudaHostRegistration& operator=(CudaHostRegistration&&) = delete;
  CudaHostRegistration(const CudaHostRegistration&) = delete;
  ~CudaHostRegistration();

 private:
  explicit CudaHostRegistration(void* address) : address_(address) {}
  void* address_ = nullptr;
};

// cudaMalloc'd device memory (legacy, IPC-capable: not from an allocator with
// expandable segments, which UCX < 1.22 serves at a thousandth of the speed).
// Move-only; frees on destruction.
class CudaDeviceBuffer {
 public:
  static absl::StatusOr<CudaDeviceBuffer> Allocate(int device, size_t length);
  CudaDeviceBuffer(CudaDeviceBuffer&& other) noexcept;
  CudaDeviceBuffer& operator=(CudaDeviceBuffer&&) = delete;
  CudaDeviceBuffer(const CudaDeviceBuffer&) = delete;
  ~CudaDeviceBuffer();

  void* data() const { return data_; }
  size_t length() const { return length_; }

 private:
  CudaDeviceBuffer(void* data, size_t length) : data_(data), length_(length) {}
  void* data_ = nullptr;
  size_t length_ = 0;
};

// Synchronous copy between any two pointers (host or device), for tests and
// for callers that need a host view of device data.
absl::Status CudaCopy(void* destination, const void* source, size_t length);

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_CUDA_MEMORY_H_
