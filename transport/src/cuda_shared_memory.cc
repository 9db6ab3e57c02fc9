#include "packfeed/transport/cuda_shared_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/cuda_memory.h"
#include "packfeed/transport/transport_logger.h"

#if PF_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "transport/src/cuda_status.h"
#endif

namespace packfeed::transport {

#if PF_HAVE_CUDA
namespace {

// The driver calls this file makes, found through the runtime so that
// nothing links libcuda (a machine without a driver must still load us).
struct Driver {
  PFN_cuDeviceGetAttribute_v2000 device_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  absl::Status loaded;
};

template <typename F>
absl::Status Find(const char* name, unsigned int version, F& out) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(name, &function, version, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || function == nullptr) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver has no ", name, " (", cudaGetErrorString(error), ")"));
  }
  out = reinterpret_cast<F>(function);
  return absl::OkStatus();
}

const Driver& TheDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver;  // never freed: used until the process ends
    d->loaded = [d]() -> absl::Status {
      // The runtime's reason, when it has one (a PID namespace under the
      // outer /proc gives "OS call failed"), through the one conversion.
      int devices = 0;
      PF_RETURN_IF_ERROR(
          CudaStatus(cudaGetDeviceCount(&devices), "no CUDA device: cudaGetDeviceCount"));
      if (devices == 0) return absl::FailedPreconditionError("no CUDA device");
      PF_RETURN_IF_ERROR(Find("cuDeviceGetAttribute", 2000, d->device_attribute));
      PF_RETURN_IF_ERROR(Find("cuMemGetAllocationGranularity", 10020, d->granularity));
      PF_RETURN_IF_ERROR(Find("cuMemCreate", 10020, d->create));
      PF_RETURN_IF_ERROR(Find("cuMemRelease", 10020, d->release));
      PF_RETURN_IF_ERROR(Find("cuMemExportToShareableHandle", 10020, d->export_handle));
      PF_RETURN_IF_ERROR(Find("cuMemImportFromShareableHandle", 10020, d->import_handle));
      PF_RETURN_IF_ERROR(Find("cuMemAddressReserve", 10020, d->reserve));
      PF_RETURN_IF_ERROR(Find("cuMemAddressFree", 10020, d->address_free));
      PF_RETURN_IF_ERROR(Find("cuMemMap", 10020, d->map));
      PF_RETURN_IF_ERROR(Find("cuMemUnmap", 10020, d->unmap));
      PF_RETURN_IF_ERROR(Find("cuMemSetAccess", 10020, d->set_access));
      return Find("cuGetErrorString", 6000, d->error_string);
    }();
    return d;
  }();
  return *driver;
}

absl::Status DriverStatus(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  if (TheDriver().error_string != nullptr) TheDriver().error_string(result, &text);
  return absl::FailedPreconditionError(
      absl::StrCat(call, ": ", text != nullptr ? text : "CUDA driver error ",
                   text != nullptr ? "" : absl::StrCat(static_cast<int>(result))));
}

CUmemAllocationProp DeviceProperties(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Reserves an address range for `handle` (of `size` bytes) and maps it
// read-write for `device`; the address, or why not (nothing left behind).
absl::StatusOr<uint8_t*> MapForDevice(uint64_t handle, uint64_t size, int device) {
  const Driver& d = TheDriver();
  CUdeviceptr address = 0;
  PF_RETURN_IF_ERROR(DriverStatus(d.reserve(&address, size, 0, 0, 0), "cuMemAddressReserve"));
  absl::Status status = DriverStatus(d.map(address, size, 0, handle, 0), "cuMemMap");
  if (status.ok()) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    status = DriverStatus(d.set_access(address, size, &access, 1), "cuMemSetAccess");
    if (!status.ok()) d.unmap(address, size);
  }
  if (!status.ok()) {
    d.address_free(address, size);
    return status;
  }
  return reinterpret_cast<uint8_t*>(address);
}

void Unmap(uint8_t* data, uint64_t size, uint64_t handle) {
  const Driver& d = TheDriver();
  if (data != nullptr) {
    const auto address = reinterpret_cast<CUdeviceptr>(data);
    if (d.unmap(address, size) != CUDA_SUCCESS || d.address_free(address, size) != CUDA_SUCCESS) {
      Logger().warn("unmapping shared device memory failed");
    }
  }
  if (handle != 0 && d.release(handle) != CUDA_SUCCESS) {
    Logger().warn("releasing shared device memory failed");
  }
}

}  // namespace

absl::Status CheckSharedDeviceMemory(int device) {
  const Driver& d = TheDriver();
  PF_RETURN_IF_ERROR(d.loaded);
  int attribute = 0;
  PF_RETURN_IF_ERROR(
      DriverStatus(d.device_attribute(
                       &attribute, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device),
                   "cuDeviceGetAttribute"));
  if (attribute == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " does not support CUDA's virtual memory management"));
  }
  PF_RETURN_IF_ERROR(DriverStatus(
      d.device_attribute(&attribute,
                         CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device),
      "cuDeviceGetAttribute"));
  if (attribute == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " cannot export device memory as a POSIX file descriptor"));
  }
  int mode = 0;
  PF_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device),
                                "cudaDeviceGetAttribute(compute mode)"));
  if (mode == cudaComputeModeExclusiveProcess || mode == cudaComputeModeProhibited) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " is in compute mode ",
                     mode == cudaComputeModeProhibited ? "prohibited" : "exclusive-process",
                     ": the daemon cannot open a context on it beside the trainer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GpuUuid(int device) {
  PF_RETURN_IF_ERROR(TheDriver().loaded);
  cudaDeviceProp properties = {};
  PF_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties"));
  std::string out;
  for (char byte : properties.uuid.bytes) {
    absl::StrAppend(&out, absl::Hex(static_cast<unsigned char>(byte), absl::kZeroPad2));
  }
  return out;
}

absl::StatusOr<ExportedDeviceMemory> ExportedDeviceMemory::Create(int device, uint64_t bytes) {
  PF_RETURN_IF_ERROR(CheckSharedDeviceMemory(device));
  const Driver& d = TheDriver();
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  ExportedDeviceMemory out;
  out.device_ = device;
  PF_ASSIGN_OR_RETURN(out.gpu_uuid_, GpuUuid(device));
  const CUmemAllocationProp prop = DeviceProperties(device);
  size_t granularity = 0;
  PF_RETURN_IF_ERROR(
      DriverStatus(d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   "cuMemGetAllocationGranularity"));
  out.size_ = (bytes + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle = 0;
  PF_RETURN_IF_ERROR(DriverStatus(d.create(&handle, out.size_, &prop, 0), "cuMemCreate"));
  out.handle_ = handle;  // released by the destructor from here on
  PF_ASSIGN_OR_RETURN(out.data_, MapForDevice(handle, out.size_, device));
  int fd = -1;
  PF_RETURN_IF_ERROR(
      DriverStatus(d.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                   "cuMemExportToShareableHandle"));
  out.fd_ = ScopedFd(fd);
  return out;
}

ExportedDeviceMemory::~ExportedDeviceMemory() {
  if (data_ != nullptr || handle_ != 0) Unmap(data_, size_, handle_);
}

absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> ImportedDeviceMemory::Import(
    ScopedFd fd, uint64_t size, absl::string_view gpu_uuid) {
  PF_RETURN_IF_ERROR(TheDriver().loaded);
  const Driver& d = TheDriver();
  int device = -1;
  for (int i = 0; i < CudaDeviceCount() && device < 0; ++i) {
    absl::StatusOr<std::string> uuid = GpuUuid(i);
    if (uuid.ok() && *uuid == gpu_uuid) device = i;
  }
  if (device < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no GPU with UUID ", gpu_uuid, " is visible to the daemon (",
                     CudaDeviceCount(), " visible; check its CUDA_VISIBLE_DEVICES)"));
  }
  // The GPU's primary context, created on first use (one per GPU served).
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  PF_RETURN_IF_ERROR(CudaStatus(cudaFree(nullptr), "opening a context on the trainer's GPU"));
  auto out = std::unique_ptr<ImportedDeviceMemory>(new ImportedDeviceMemory);
  out->device_ = device;
  out->size_ = size;
  CUmemGenericAllocationHandle handle = 0;
  PF_RETURN_IF_ERROR(DriverStatus(
      d.import_handle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      "cuMemImportFromShareableHandle"));
  out->handle_ = handle;
  PF_ASSIGN_OR_RETURN(out->data_, MapForDevice(handle, size, device));
  cudaStream_t stream = nullptr;
  PF_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags"));
  out->stream_ = stream;
  return out;
}

absl::StatusOr<uint8_t*> ImportedDeviceMemory::Staging(uint64_t bytes) {
  if (staging_ != nullptr && staging_bytes_ >= bytes) return staging_;
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  if (staging_ != nullptr) cudaFreeHost(std::exchange(staging_, nullptr));
  void* staging = nullptr;
  PF_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&staging, bytes), "cudaMallocHost"));
  staging_ = static_cast<uint8_t*>(staging);
  staging_bytes_ = bytes;
  return staging_;
}

ImportedDeviceMemory::~ImportedDeviceMemory() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
  Unmap(data_, size_, handle_);
}

absl::Status ImportedDeviceMemory::CopyIn(uint64_t offset, const void* source, uint64_t bytes) {
  if (offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("a copy of ", bytes, " B at ", offset,
                                                   " leaves shared device memory of ", size_));
  }
  PF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  auto* stream = static_cast<cudaStream_t>(stream_);
  PF_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(data_ + offset, source, bytes, cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync"));
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

#else  // !PF_HAVE_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError("packfeed was built without the CUDA toolkit");
}
}  // namespace

absl::Status CheckSharedDeviceMemory(int) { return NoCuda(); }
absl::StatusOr<std::string> GpuUuid(int) { return NoCuda(); }
absl::StatusOr<ExportedDeviceMemory> ExportedDeviceMemory::Create(int, uint64_t) {
  return NoCuda();
}
ExportedDeviceMemory::~ExportedDeviceMemory() = default;
absl::StatusOr<std::unique_ptr<ImportedDeviceMemory>> ImportedDeviceMemory::Import(
    ScopedFd, uint64_t, absl::string_view) {
  return NoCuda();
}
ImportedDeviceMemory::~ImportedDeviceMemory() = default;
absl::StatusOr<uint8_t*> ImportedDeviceMemory::Staging(uint64_t) { return NoCuda(); }
absl::Status ImportedDeviceMemory::CopyIn(uint64_t, const void*, uint64_t) { return NoCuda(); }

#endif  // PF_HAVE_CUDA

ExportedDeviceMemory::ExportedDeviceMemory(ExportedDeviceMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(other.size_),
      device_(other.device_),
      handle_(std::exchange(other.handle_, 0)),
      gpu_uuid_(std::move(other.gpu_uuid_)),
      fd_(std::move(other.fd_)) {}

}  // namespace packfeed::transport
