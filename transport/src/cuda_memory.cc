#include "packfeed/transport/cuda_memory.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/transport_logger.h"

#if PF_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "transport/src/cuda_status.h"
#endif

namespace packfeed::transport {

#if PF_HAVE_CUDA

absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorString(error));
  return error == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message)
                                            : absl::FailedPreconditionError(message);
}

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

struct CudaSlotCopier::Handles {
  int device = 0;
  uint64_t slot_bytes = 0;
  uint8_t* buffer = nullptr;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  std::vector<cudaEvent_t> copied;
  // Per slot: events recorded on the streams that last read it (created as
  // needed, kept for reuse), and how many of them the next copy waits for.
  std::vector<std::vector<cudaEvent_t>> consumed;
  std::vector<size_t> consumed_recorded;
  void (*on_copied)(void*) = nullptr;
  void* argument = nullptr;

  ~Handles() {
    // Calls from a thread whose current device is another one (the trainer
    // may use several) must address this copier's device.
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (cudaEvent_t event : copied) cudaEventDestroy(event);
    for (const std::vector<cudaEvent_t>& events : consumed) {
      for (cudaEvent_t event : events) cudaEventDestroy(event);
    }
    if (own_stream && stream != nullptr) cudaStreamDestroy(stream);
    if (buffer != nullptr) cudaFree(buffer);
  }
};

absl::StatusOr<std::unique_ptr<CudaSlotCopier>> CudaSlotCopier::Create(int device, uint32_t slots,
                                                                       uint64_t slot_bytes,
                                                                       void* stream,
                                                                       void (*on_copied)(void*),
                                                                       void* argument) {
  auto handles = std::make_unique<Handles>();
  handles->device = device;
  handles->slot_bytes = slot_bytes;
  handles->on_copied = on_copied;
  handles->argument = argument;
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  void* buffer = nullptr;
  PF_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&buffer, slots * slot_bytes), "cudaMalloc"));
  handles->buffer = static_cast<uint8_t*>(buffer);
  if (stream == nullptr) {
    PF_RETURN_IF_ERROR(CudaStatus(
        cudaStreamCreateWithFlags(&handles->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    handles->own_stream = true;
  } else {
    handles->stream = static_cast<cudaStream_t>(stream);
  }
  for (uint32_t i = 0; i < slots; ++i) {
    cudaEvent_t event = nullptr;
    PF_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
    handles->copied.push_back(event);
  }
  handles->consumed.resize(slots);
  handles->consumed_recorded.assign(slots, 0);
  return std::unique_ptr<CudaSlotCopier>(new CudaSlotCopier(std::move(handles)));
}

uint8_t* CudaSlotCopier::slot(uint32_t index) const {
  return handles_->buffer + index * handles_->slot_bytes;
}

void* CudaSlotCopier::copied_event(uint32_t index) const { return handles_->copied[index]; }

absl::Status CudaSlotCopier::Copy(uint32_t index, const void* source, uint64_t bytes) {
  Handles& h = *handles_;
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(h.device), "cudaSetDevice"));
  for (size_t i = 0; i < h.consumed_recorded[index]; ++i) {
    PF_RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(h.stream, h.consumed[index][i], 0), "cudaStreamWaitEvent"));
  }
  PF_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(slot(index), source, bytes, cudaMemcpyHostToDevice, h.stream),
                 "cudaMemcpyAsync"));
  PF_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(h.copied[index], h.stream), "cudaEventRecord"));
  return CudaStatus(cudaLaunchHostFunc(h.stream, h.on_copied, h.argument), "cudaLaunchHostFunc");
}

absl::StatusOr<bool> CudaSlotCopier::Copied(uint32_t index) const {
  const cudaError_t error = cudaEventQuery(handles_->copied[index]);
  if (error == cudaErrorNotReady) return false;
  PF_RETURN_IF_ERROR(CudaStatus(error, "cudaEventQuery"));
  return true;
}

absl::Status CudaSlotCopier::WaitCopied(uint32_t index, void* consumer_stream) const {
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(handles_->device), "cudaSetDevice"));
  return CudaStatus(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(consumer_stream), handles_->copied[index], 0),
      "cudaStreamWaitEvent");
}

absl::Status CudaSlotCopier::Consumed(uint32_t index, absl::Span<void* const> consumer_streams) {
  Handles& h = *handles_;
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(h.device), "cudaSetDevice"));
  void* const legacy_default = nullptr;
  if (consumer_streams.empty()) consumer_streams = absl::MakeConstSpan(&legacy_default, 1);
  std::vector<cudaEvent_t>& events = h.consumed[index];
  h.consumed_recorded[index] = 0;
  for (void* consumer : consumer_streams) {
    if (events.size() == h.consumed_recorded[index]) {
      cudaEvent_t event = nullptr;
      PF_RETURN_IF_ERROR(
          CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
      events.push_back(event);
    }
    PF_RETURN_IF_ERROR(CudaStatus(
        cudaEventRecord(events[h.consumed_recorded[index]], static_cast<cudaStream_t>(consumer)),
        "cudaEventRecord"));
    ++h.consumed_recorded[index];
  }
  return absl::OkStatus();
}

absl::Status CudaCopyAsync(void* destination, const void* source, size_t length, void* stream) {
  return CudaStatus(cudaMemcpyAsync(destination, source, length, cudaMemcpyDefault,
                                    static_cast<cudaStream_t>(stream)),
                    "cudaMemcpyAsync");
}

absl::StatusOr<CudaStreamMarks> CudaStreamMarks::Record(int device,
                                                        absl::Span<void* const> streams) {
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  void* const legacy_default = nullptr;
  if (streams.empty()) streams = absl::MakeConstSpan(&legacy_default, 1);
  CudaStreamMarks marks(device);
  for (void* stream : streams) {
    cudaEvent_t event = nullptr;
    PF_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
    marks.events_.push_back(event);
    PF_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(event, static_cast<cudaStream_t>(stream)), "cudaEventRecord"));
  }
  return marks;
}

CudaStreamMarks::~CudaStreamMarks() {
  if (events_.empty()) return;
  cudaSetDevice(device_);
  for (void* event : events_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::StatusOr<bool> CudaStreamMarks::Passed() const {
  for (void* event : events_) {
    const cudaError_t error = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (error == cudaErrorNotReady) return false;
    PF_RETURN_IF_ERROR(CudaStatus(error, "cudaEventQuery"));
  }
  return true;
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
absl::Status CudaCopyAsync(void*, const void*, size_t, void*) { return NoCuda(); }
absl::StatusOr<CudaStreamMarks> CudaStreamMarks::Record(int, absl::Span<void* const>) {
  return NoCuda();
}
CudaStreamMarks::~CudaStreamMarks() = default;
absl::StatusOr<bool> CudaStreamMarks::Passed() const { return NoCuda(); }

struct CudaSlotCopier::Handles {};
absl::StatusOr<std::unique_ptr<CudaSlotCopier>> CudaSlotCopier::Create(int, uint32_t, uint64_t,
                                                                       void*, void (*)(void*),
                                                                       void*) {
  return NoCuda();
}
uint8_t* CudaSlotCopier::slot(uint32_t) const { return nullptr; }
void* CudaSlotCopier::copied_event(uint32_t) const { return nullptr; }
absl::Status CudaSlotCopier::Copy(uint32_t, const void*, uint64_t) { return NoCuda(); }
absl::StatusOr<bool> CudaSlotCopier::Copied(uint32_t) const { return NoCuda(); }
absl::Status CudaSlotCopier::WaitCopied(uint32_t, void*) const { return NoCuda(); }
absl::Status CudaSlotCopier::Consumed(uint32_t, absl::Span<void* const>) { return NoCuda(); }

#endif  // PF_HAVE_CUDA

CudaHostRegistration::CudaHostRegistration(CudaHostRegistration&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)) {}

CudaStreamMarks::CudaStreamMarks(CudaStreamMarks&& other) noexcept
    : device_(other.device_), events_(std::move(other.events_)) {
  other.events_.clear();
}

CudaSlotCopier::CudaSlotCopier(std::unique_ptr<Handles> handles) : handles_(std::move(handles)) {}
CudaSlotCopier::~CudaSlotCopier() = default;

CudaDeviceBuffer::CudaDeviceBuffer(CudaDeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), length_(other.length_) {}

}  // namespace packfeed::transport
