#ifndef PACKFEED_TRANSPORT_CUDA_MEMORY_H_
#define PACKFEED_TRANSPORT_CUDA_MEMORY_H_

// The CUDA runtime calls the ring needs, behind RAII. Built against the CUDA
// toolkit when it is installed; without it (or without a device at run time)
// CudaDeviceCount() is 0 and everything else returns FailedPrecondition.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

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

// The copy engine's side of a staged ring (RingPlacement::kStagedDevice):
// `slots` device buffers of `slot_bytes`, filled from page-locked host slots
// by cudaMemcpyAsync on one stream, each copy followed by an event the
// consumer's stream waits on. A device slot is reused only after the stream
// that read it (Consumed) got past its reads: the copy stream waits on that,
// on the GPU, so no host thread ever blocks on a copy. Thread-compatible;
// the caller serialises (the receiver holds its mutex).
class CudaSlotCopier {
 public:
  // `stream`: a cudaStream_t to copy on, or nullptr for a new non-blocking
  // stream of the copier's own. `on_copied(argument)` runs on a CUDA thread
  // after each copy completes (it must not call CUDA).
  static absl::StatusOr<std::unique_ptr<CudaSlotCopier>> Create(int device, uint32_t slots,
                                                                uint64_t slot_bytes, void* stream,
                                                                void (*on_copied)(void*),
                                                                void* argument);
  ~CudaSlotCopier();  // waits for the copies in flight, then frees

  uint8_t* slot(uint32_t index) const;
  // The event recorded after the copy into `index` (a cudaEvent_t).
  void* copied_event(uint32_t index) const;
  // Starts copying `bytes` from page-locked `source` into device slot
  // `index`, after the stream that last consumed it is done with it.
  absl::Status Copy(uint32_t index, const void* source, uint64_t bytes);
  // Whether the last copy into `index` has completed (its host source is
  // free again).
  absl::StatusOr<bool> Copied(uint32_t index) const;
  // Makes `consumer_stream` (a cudaStream_t; nullptr: the legacy default
  // stream) wait for the last copy into `index` before its later work.
  absl::Status WaitCopied(uint32_t index, void* consumer_stream) const;
  // `consumer_streams` (cudaStream_t; none: the legacy default stream) have
  // queued all their reads of `index`: the next copy into it waits for them.
  absl::Status Consumed(uint32_t index, absl::Span<void* const> consumer_streams);

 private:
  struct Handles;
  explicit CudaSlotCopier(std::unique_ptr<Handles> handles);
  std::unique_ptr<Handles> handles_;
};

// Events recorded on streams and polled from the host: a slot of a device
// ring the daemon writes goes back to it once every stream that read the
// slot is past the point of its release, and no thread blocks to learn it.
// Move-only; destroys its events.
class CudaStreamMarks {
 public:
  // `streams`: cudaStream_t; none means the legacy default stream.
  static absl::StatusOr<CudaStreamMarks> Record(int device, absl::Span<void* const> streams);
  CudaStreamMarks(CudaStreamMarks&& other) noexcept;
  CudaStreamMarks& operator=(CudaStreamMarks&&) = delete;
  CudaStreamMarks(const CudaStreamMarks&) = delete;
  ~CudaStreamMarks();

  // Whether every stream has passed its mark.
  absl::StatusOr<bool> Passed() const;

 private:
  explicit CudaStreamMarks(int device) : device_(device) {}
  int device_ = 0;
  std::vector<void*> events_;  // cudaEvent_t
};

// Synchronous copy between any two pointers (host or device), for tests and
// for callers that need a host view of device data.
absl::Status CudaCopy(void* destination, const void* source, size_t length);
// The same, queued on `stream` (a cudaStream_t).
absl::Status CudaCopyAsync(void* destination, const void* source, size_t length, void* stream);

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_CUDA_MEMORY_H_
