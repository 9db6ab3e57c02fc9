#include "packfeed/scheduler/cost_model.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packfeed::scheduler {

absl::StatusOr<CostModel> CostModelFromName(absl::string_view name) {
  if (name == "megatron") return CostModel::Megatron();
  if (name == "llama8b") return CostModel::Llama8b();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cost model '", name, "'; expected ", kCostModelNames));
}

}  // namespace packfeed::scheduler
