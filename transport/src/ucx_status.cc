#include "packfeed/transport/ucx_status.h"

#include "absl/strings/str_cat.h"

namespace packfeed::transport {

absl::Status UcxStatus(ucs_status_t status, absl::string_view call) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_BUSY:
      return absl::UnavailableError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
      return absl::UnimplementedError(message);
    case UCS_ERR_NO_ELEM:
      return absl::NotFoundError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace packfeed::transport
