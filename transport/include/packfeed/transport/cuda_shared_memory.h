#ifndef PACKFEED_TRANSPORT_CUDA_SHARED_MEMORY_H_
#define PACKFEED_TRANSPORT_CUDA_SHARED_MEMORY_H_

// Device memory shared between two processes by file descriptor, through
// CUDA's virtual memory management API: the client allocates its ring on its
// GPU and exports it (cuMemCreate with a POSIX descriptor handle,
// cuMemExportToShareableHandle); the daemon imports it on the GPU of the
// same UUID (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
// cuMemSetAccess) and copies each slot into it from its own page-locked
// memory with the copy engine (docs/TRANSPORT.md, "Device rings the daemon
// writes"). UCX cannot do this: cuda_ipc moves between device buffers only
// and cuda_copy inside one process.
//
// The driver API is reached through the runtime (cudaGetDriverEntryPoint),
// so nothing links libcuda: a machine without a driver loads packfeed and
// every call here says why it cannot.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "packfeed/common/posix_file.h"

namespace packfeed::transport {

// OK when `device` can hold memory the daemon imports: a device, the
// virtual memory API, export as a POSIX descriptor, and a compute mode that
// lets a second process (the daemon) open a context. Otherwise
// FailedPrecondition naming what is missing, the reason a client gives for
// falling back to the staged ring.
absl::Status CheckSharedDeviceMemory(int device);

// The GPU's UUID as 32 lowercase hex digits: what names the same GPU in two
// processes whose CUDA_VISIBLE_DEVICES differ.
absl::StatusOr<std::string> GpuUuid(int device);

// The client's side: `bytes` (rounded up to the allocation granularity) on
// `device`, mapped read-write in this process and exported. Move-only;
// unmaps and releases on destruction (the daemon's import keeps the memory
// alive until it lets go too).
class ExportedDeviceMemory {
 public:
  static absl::StatusOr<ExportedDeviceMemory> Create(int device, uint64_t bytes);
  ExportedDeviceMemory(ExportedDeviceMemory&& other) noexcept;
  ExportedDeviceMemory& operator=(ExportedDeviceMemory&&) = delete;
  ExportedDeviceMemory(const ExportedDeviceMemory&) = delete;
  ~ExportedDeviceMemory();

  uint8_t* data() const { return data_; }
  // The allocation's size (≥ the bytes asked for): what the importer maps.
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  const std::string& gpu_uuid() const { return gpu_uuid_; }
  // The exported descriptor, to hand over with SendWithFd.
  int fd() const { return fd_.get(); }

 private:
  ExportedDeviceMemory() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int device_ = 0;
  uint64_t handle_ = 0;  // CUmemGenericAllocationHandle
  std::string gpu_uuid_;
  ScopedFd fd_;
};

// The daemon's side: an exported allocation of `size` bytes mapped on the
// local GPU whose UUID is `gpu_uuid`, with a stream of its own to copy into
// it. FailedPrecondition naming why when there is no such GPU here or the
// driver refuses (MPS, an exclusive-process compute mode held by the
// trainer). Thread-compatible: the sender's thread uses it.
class ImportedDeviceMemory {
 public:
  static absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> Import(ScopedFd fd, uint64_t size,
                                                                      absl::string_view gpu_uuid);
  ~ImportedDeviceMemory();  // waits for its copy, unmaps, releases

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  // Page-locked host memory of at least `bytes` to pack a slot into before
  // CopyIn (allocated on first use, grown when asked for more).
  absl::StatusOr<uint8_t*> Staging(uint64_t bytes);

  // Copies `bytes` from `source` (page-locked for the copy engine to read
  // it at full rate; staging() is) to `offset` of the imported memory and
  // returns once the copy has completed: a slot is announced only after
  // its bytes are in device memory.
  absl::Status CopyIn(uint64_t offset, const void* source, uint64_t bytes);

 private:
  ImportedDeviceMemory() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int device_ = 0;
  uint64_t handle_ = 0;     // CUmemGenericAllocationHandle
  void* stream_ = nullptr;  // cudaStream_t
  uint8_t* staging_ = nullptr;
  uint64_t staging_bytes_ = 0;
};

}  // namespace packfeed::transport

#endif  // PACKFEED_TRANSPORT_CUDA_SHARED_MEMORY_H_
