#include "packfeed/transport/cuda_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/transport/transport_logger.h"

#if PF_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace packfeed::transport {

#if PF_HAVE_CUDA
namespace {

absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(error)));
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

absl::StatusOr<CudaHostRegistration> CudaHostRegistration::Register(void* address, size_t length) {
  const cudaError_t error = cudaHostRegister(address, length, cudaHostRegisterDefault);
  if (error == cudaErrorHostMemoryAlreadyRegistered) {
    // A UCX built with CUDA page-locks the memory it maps itself: the range
    // is already what we want, and it is not ours to unregister.
    cudaGetLastError();
    return CudaHostRegistration(nullptr);
  }
  absl::Status status = CudaStatus(error, "cudaHostRegister");
  if (!status.ok()) return status;
  return CudaHostRegistration(address);
}

CudaHostRegistration::~CudaHostRegistration() {
  if (address_ != nullptr && cudaHostUnregister(address_) != cudaSuccess) {
    Logger().warn("cudaHostUnregister failed");
  }
}

absl::StatusOr<CudaDeviceBuffer> CudaDeviceBuffer::Allocate(int device, size_t length) {
  absl::Status status = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  if (!status.ok()) return status;
  void* data = nullptr;
  status = CudaStatus(cudaMalloc(&data, length), "cudaMalloc");
  if (!status.ok()) return status;
  return CudaDeviceBuffer(data, length);
}

CudaDeviceBuffer::~CudaDeviceBuffer() {
  if (data_ != nullptr && cudaFree(data_) != cudaSuccess) Logger().warn("cudaFree failed");
}

absl::Status CudaCopy(void* destination, const void* source, size_t length) {
  return CudaStatus(cudaMemcpy(destination, source, length, cudaMemcpyDefault), "cudaMemcpy");
}

#else  // !PF_HAVE_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError("packfeed was built without the CUDA toolkit");
}
}  // namespace

int CudaDeviceCount() { return 0; }
absl::StatusOr<CudaHostRegistration> CudaHostRegistration::Register(void*, size_t) {
  return NoCuda();
}
CudaHostRegistration::~CudaHostRegistration() = default;
absl::StatusOr<CudaDeviceBuffer> CudaDeviceBuffer::Allocate(int, size_t) { return NoCuda(); }
CudaDeviceBuffer::~CudaDeviceBuffer() = default;
absl::Status CudaCopy(void*, const void*, size_t) { return NoCuda(); }

#endif  // PF_HAVE_CUDA

CudaHostRegistration::CudaHostRegistration(CudaHostRegistration&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)) {}

CudaDeviceBuffer::CudaDeviceBuffer(CudaDeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), length_(other.length_) {}

}  // namespace packfeed::transport
