#ifndef PACKFEED_SCHEDULER_COST_MODEL_H_
#define PACKFEED_SCHEDULER_COST_MODEL_H_

// Modelled work of one sequence on one rank of its CP group (docs/SCHEDULER.md):
//   cost(s, c) = (α·s² + β·s) / c  +  [c > 1]·(κ·s·(c−1)/c + λ·(c−1))
// The first term is compute split c ways. The second is what CP adds and
// does not divide away: each rank receives the K/V of the other c−1 chunks
// (κ per token, the part compute does not hide) and pays a per-peer ring
// step (λ). A step then costs
//   Σ_m (max_r W[m][r] + μ)  +  bubble · mean_m (max_r W[m][r] + μ)
// with μ a fixed cost per microbatch and bubble = (PP − 1) / VPP microbatch times of
// the pipeline's fill and drain (StepTime in plan_stats.h).
//
// Megatron's estimator is s²/c alone (α = 1, the rest 0): CP and extra
// microbatches look free under it. A calibrated model (Calibrate) is in
// seconds, from the model's shape and the hardware's rates.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packfeed::scheduler {

struct CostModel {
  double alpha = 1.0;       // per s² (attention)
  double beta = 0.0;        // per token (projections, MLP, logits)
  double kappa = 0.0;       // per token × (c−1)/c of K/V exchange
  double lambda = 0.0;      // per extra CP peer
  double microbatch = 0.0;  // μ: fixed cost of one microbatch on a rank
  double bubble = 0.0;      // (PP − 1) / VPP

  // Megatron's estimator: s²/c, nothing else.
  static CostModel Megatron() { return {}; }

  bool operator==(const CostModel&) const = default;

  // True when anything besides s²/c and s/c is modelled: only then can the
  // planner weigh CP and microbatch count against balance.
  bool ModelsOverheads() const { return kappa > 0 || lambda > 0 || microbatch > 0 || bubble > 0; }

  double Cost(int64_t padded_length, int cp_size) const {
    const double s = static_cast<double>(padded_length);
    const double c = static_cast<double>(cp_size);
    double cost = (alpha * s * s + beta * s) / c;
    if (cp_size > 1) cost += kappa * s * (c - 1) / c + lambda * (c - 1);
    return cost;
  }
};

// A transformer's shape, as its Hugging Face or Megatron config gives it.
struct ModelShape {
  int64_t layers = 32;
  int64_t hidden = 4096;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t ffn_hidden = 14336;
  int64_t vocab = 128256;
  bool gated_mlp = true;  // SwiGLU: three FFN matrices, not two
};

// Rates of the machine the job runs on; defaults are an H100 SXM node.
struct Hardware {
  double tflops = 400;                  // achieved dense BF16 TFLOP/s per GPU
  double cp_link_gbps = 100;            // achieved GB/s per direction between CP ranks
  double cp_latency_us = 20;            // one ring-attention step (send, receive, sync)
  double exposed_fraction = 0.5;        // of the K/V exchange not hidden by compute
  double microbatch_overhead_ms = 1.0;  // launches, syncs and the THD set-up per microbatch
};

struct ModelParallelism {
  int tp = 1;
  int pp = 1;
  int vpp = 1;  // virtual stages per pipeline rank (1 = off)
};

// The cost model, in seconds per rank, of training (forward and backward,
// 3× the forward FLOPs) one pipeline stage's layers (layers / PP, plus the
// logits when PP = 1) at TP-way tensor parallelism:
//   α = 3 · 2·h·L / (F·TP)        causal attention: QKᵀ and AV over s²/2
//   β = 3 · L·(2h(h + 2·kv) + 2h² + 2·m·h·f) / (F·TP)  [+ 3 · 2·h·V / (F·TP)]
//   κ = exposed · 3 · L · 4·kv / TP / B   K and V in bf16, again and their
//                                          gradients in the backward pass
//   λ = 3 · L · latency                 one ring step per peer per layer
//   μ = microbatch overhead, bubble = (PP − 1) / VPP
// with h the hidden size, kv = kv_heads · h / heads, f the FFN size, m = 3
// for a gated MLP (2 otherwise), L the layers per stage, F FLOP/s, B bytes/s.
CostModel Calibrate(const ModelShape& shape, const Hardware& hardware,
                    const ModelParallelism& parallelism);

// Shapes by name: "llama1b" (Llama-3.2-1B), "llama8b" (Llama-3-8B),
// "llama70b" (Llama-3-70B). NotFound for any other name.
absl::StatusOr<ModelShape> ModelPreset(absl::string_view name);

// The names a configuration or `packfeedctl plan --cost-model` may give,
// for help texts and errors.
inline constexpr absl::string_view kCostModelNames = "megatron | llama1b | llama8b | llama70b";

// "megatron", or a preset calibrated for the default hardware and
// `parallelism`; InvalidArgument for any other name.
absl::StatusOr<CostModel> CostModelFromName(absl::string_view name,
                                            const ModelParallelism& parallelism = {});

// "α=… β=… κ=… λ=… μ=… bubble=…", for logs and `packfeedctl plan`.
std::string DescribeCostModel(const CostModel& model);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_COST_MODEL_H_
