#include "packfeed/transport/memory_region.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/transport/transport_logger.h"
#include "packfeed/transport/ucx_status.h"

namespace packfeed::transport {
namespace {

absl::StatusOr<ucp_mem_attr_t> Query(ucp_mem_h memory) {
  ucp_mem_attr_t attr = {};
  attr.field_mask =
      UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH | UCP_MEM_ATTR_FIELD_MEM_TYPE;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_mem_query(memory, &attr), "ucp_mem_query"));
  return attr;
}

}  // namespace

absl::StatusOr<MemoryRegion> MemoryRegion::Allocate(ucp_context_h context, size_t length) {
  ucp_mem_map_params_t params = {};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memory = nullptr;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_mem_map(context, &params, &memory),
                               absl::StrCat("ucp_mem_map(allocate ", length, " B)")));
  MemoryRegion region(context, memory, nullptr, length, UCS_MEMORY_TYPE_HOST);
  PF_ASSIGN_OR_RETURN(ucp_mem_attr_t attr, Query(memory));
  region.address_ = attr.address;
  region.memory_type_ = attr.mem_type;
  return region;
}

absl::StatusOr<MemoryRegion> MemoryRegion::Register(ucp_context_h context, void* address,
                                                    size_t length, ucs_memory_type_t memory_type) {
  ucp_mem_map_params_t params = {};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = address;
  params.length = length;
  params.memory_type = memory_type;
  ucp_mem_h memory = nullptr;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_mem_map(context, &params, &memory),
                               absl::StrCat("ucp_mem_map(register ", length, " B)")));
  MemoryRegion region(context, memory, address, length, memory_type);
  PF_ASSIGN_OR_RETURN(ucp_mem_attr_t attr, Query(memory));
  if (attr.mem_type != memory_type) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ucp_mem_map registered ", ucs_memory_type_names[memory_type], " memory as ",
        ucs_memory_type_names[attr.mem_type], ": this UCX build cannot serve that memory type"));
  }
  return region;
}

MemoryRegion::MemoryRegion(MemoryRegion&& other) noexcept
    : context_(other.context_),
      memory_(std::exchange(other.memory_, nullptr)),
      address_(other.address_),
      length_(other.length_),
      memory_type_(other.memory_type_) {}

MemoryRegion& MemoryRegion::operator=(MemoryRegion&& other) noexcept {
  if (this != &other) {
    Unmap();
    context_ = other.context_;
    memory_ = std::exchange(other.memory_, nullptr);
    address_ = other.address_;
    length_ = other.length_;
    memory_type_ = other.memory_type_;
  }
  return *this;
}

MemoryRegion::~MemoryRegion() { Unmap(); }

void MemoryRegion::Unmap() {
  if (memory_ == nullptr) return;
  const ucs_status_t status = ucp_mem_unmap(context_, std::exchange(memory_, nullptr));
  if (status != UCS_OK) {
    Logger().warn("ucp_mem_unmap of {} B: {}", length_, ucs_status_string(status));
  }
}

absl::StatusOr<std::string> MemoryRegion::PackRemoteKey() const {
  void* buffer = nullptr;
  size_t size = 0;
  PF_RETURN_IF_ERROR(UcxStatus(ucp_rkey_pack(context_, memory_, &buffer, &size), "ucp_rkey_pack"));
  std::string packed(static_cast<const char*>(buffer), size);
  ucp_rkey_buffer_release(buffer);
  return packed;
}

}  // namespace packfeed::transport
