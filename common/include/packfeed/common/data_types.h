#ifndef PACKFEED_COMMON_DATA_TYPES_H_
#define PACKFEED_COMMON_DATA_TYPES_H_

// The words a trainer and the data plane share: what a field's elements
// are, where a microbatch's memory lives, and where a rank asks for its
// ring. Plain values: the client's public API uses them without the
// transport behind it.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace packfeed {

// Element types of a field, in DLPack's vocabulary.
enum class ElementType : uint8_t {
  kUInt8 = 1,
  kInt8,
  kUInt16,
  kInt16,
  kUInt32,
  kInt32,
  kUInt64,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
};
// Bytes per element; 0 for a value that is not an ElementType.
size_t ElementSize(ElementType type);
// numpy's name of the type ("int64", "bfloat16", "bool"); "invalid" for a
// value that is not an ElementType.
absl::string_view ElementTypeName(ElementType type);

// Where a field's bytes are: host memory, or CUDA device memory.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

// Where a rank's ring lives (docs/TRANSPORT.md).
enum class RingPlacement {
  // The default: the host ring (page-locked when a device is present, so
  // the client's copy to the device is asynchronous). Measured on an H100
  // with UCX 1.22, a put into a device ring moves 0.8 GiB/s against 6-9
  // GiB/s for a plain cudaMemcpy, so the device ring is chosen only when
  // asked for.
  kAuto,
  kHost,  // host memory (registered with CUDA when a device is present)
  // Device memory written by UCX, or fail; the daemon refuses it unless UCX
  // would write it with a transport rather than emulate the puts.
  kDevice,
  // The page-locked host ring, each slot copied into a device buffer of its
  // own on arrival, before the trainer asks; views are of device memory.
  // The slot's credit returns when its copy completes; the device buffer is
  // reused once the consumer's stream is past it. Needs a device, not a UCX
  // with CUDA.
  kStagedDevice,
  // Device memory the daemon writes (CUDA's virtual memory API, the
  // allocation shared by file descriptor): it packs each slot in its own
  // page-locked memory, copies it in with the copy engine, and only then
  // announces it, so the trainer's Next does no copy and waits on no
  // event. Where it cannot be had (no such API or descriptor export, a
  // compute mode that keeps the daemon out, the daemon's refusal) the
  // client falls back to kStagedDevice and says why.
  kDaemonDevice,
};

}  // namespace packfeed

#endif  // PACKFEED_COMMON_DATA_TYPES_H_
