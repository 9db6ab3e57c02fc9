#include "packfeed/scheduler/cost_model.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace packfeed::scheduler {

CostModel Calibrate(const ModelShape& shape, const Hardware& hardware,
                    const ModelParallelism& parallelism) {
  const int pp = std::max(parallelism.pp, 1);
  const double tp = std::max(parallelism.tp, 1);
  const double flops = hardware.tflops * 1e12 * tp;  // the TP group's rate
  const double h = static_cast<double>(shape.hidden);
  const double kv = static_cast<double>(shape.kv_heads * shape.hidden) /
                    static_cast<double>(std::max<int64_t>(shape.heads, 1));
  const double f = static_cast<double>(shape.ffn_hidden);
  const double layers = static_cast<double>(shape.layers) / pp;
  const double mlp_matrices = shape.gated_mlp ? 3.0 : 2.0;
  constexpr double kTraining = 3.0;  // forward + backward ≈ 3 forwards

  CostModel model;
  model.alpha = kTraining * 2.0 * h * layers / flops;
  double per_token = layers * (2.0 * h * (h + 2.0 * kv) + 2.0 * h * h + 2.0 * mlp_matrices * h * f);
  if (pp == 1) per_token += 2.0 * h * static_cast<double>(shape.vocab);
  model.beta = kTraining * per_token / flops;
  const double kv_bytes_per_token = 2.0 * 2.0 * kv / tp;  // K and V, bf16, this rank's heads
  model.kappa = hardware.exposed_fraction * kTraining * layers * kv_bytes_per_token /
                (hardware.cp_link_gbps * 1e9);
  model.lambda = kTraining * layers * hardware.cp_latency_us * 1e-6;
  model.microbatch = hardware.microbatch_overhead_ms * 1e-3;
  model.bubble = static_cast<double>(pp - 1) / std::max(parallelism.vpp, 1);
  return model;
}

absl::StatusOr<ModelShape> ModelPreset(absl::string_view name) {
  if (name == "llama1b") return ModelShape{16, 2048, 32, 8, 8192, 128256, true};
  if (name == "llama8b") return ModelShape{32, 4096, 32, 8, 14336, 128256, true};
  if (name == "llama70b") return ModelShape{80, 8192, 64, 8, 28672, 128256, true};
  return absl::NotFoundError(absl::StrCat("no model preset named '", name, "'"));
}

absl::StatusOr<CostModel> CostModelFromName(absl::string_view name,
                                            const ModelParallelism& parallelism) {
  if (name == "megatron") return CostModel::Megatron();
  absl::StatusOr<ModelShape> shape = ModelPreset(name);
  if (!shape.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown cost model '", name, "'; expected ", kCostModelNames));
  }
  return Calibrate(*shape, Hardware{}, parallelism);
}

std::string DescribeCostModel(const CostModel& model) {
  return absl::StrFormat("alpha=%.4g beta=%.4g kappa=%.4g lambda=%.4g mu=%.4g bubble=%.4g",
                         model.alpha, model.beta, model.kappa, model.lambda, model.microbatch,
                         model.bubble);
}

}  // namespace packfeed::scheduler
