#ifndef PACKFEED_SCHEDULER_COST_MODEL_H_
#define PACKFEED_SCHEDULER_COST_MODEL_H_

// Modelled work of one sequence on one rank of its CP group (DESIGN.md §5):
//   cost(s, c) = (α·s² + β·s) / c  +  [c > 1]·(κ·s·(c−1)/c + λ·(c−1))
// The first term is compute split c ways. The second is what CP adds and
// does not divide away: each rank receives the K/V of the other c−1 chunks
// (κ per token, the part compute may not hide) and pays a per-peer launch
// cost λ. With κ = λ = 0 CP looks free, and a planner judged by that alone
// splits every sequence across every rank.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packfeed::scheduler {

struct CostModel {
  double alpha = 1.0;   // per s² (attention)
  double beta = 0.0;    // per token (projections, MLP)
  double kappa = 0.0;   // per token × (c−1)/c of K/V exchange
  double lambda = 0.0;  // per extra CP peer

  // Megatron's estimator: s²/c, nothing else.
  static CostModel Megatron() { return {}; }

  // From a transformer's shape, in units of 4·h FLOPs so that α = 1. Per
  // layer forward: attention scores and values 4·h·s², projections 8·h²·s,
  // MLP ≈ 4·h·f·s, so β = 2h + f. Under CP each rank receives the K/V of
  // the other chunks: 2·kv_hidden bf16 values = 4·kv_hidden bytes per token;
  // at `flops_per_byte` (an accelerator's FLOP rate over its CP link's byte
  // rate, ≈ 1000 for H100 over NVLink) and with `exposed_fraction` of it
  // not hidden behind compute, κ = exposed · 4·kv_hidden · flops_per_byte /
  // 4h. λ: one ring step's launch and sync, ≈ 10 µs at 400 TFLOP/s.
  static CostModel FromModel(int64_t hidden, int64_t ffn_hidden, int64_t kv_hidden,
                             double exposed_fraction = 0.5, double flops_per_byte = 1000.0) {
    const double unit = 4.0 * static_cast<double>(hidden);
    CostModel model;
    model.alpha = 1.0;
    model.beta = 2.0 * static_cast<double>(hidden) + static_cast<double>(ffn_hidden);
    model.kappa = exposed_fraction * 4.0 * static_cast<double>(kv_hidden) * flops_per_byte / unit;
    model.lambda = 10e-6 * 400e12 / unit;
    return model;
  }

  // Llama-3-8B's shape (hidden 4096, FFN 14336, 8 KV heads of 128): the
  // preset named "llama8b", and the second model bench figures judge by.
  static CostModel Llama8b() { return FromModel(4096, 14336, 1024); }

  double Cost(int64_t padded_length, int cp_size) const {
    const double s = static_cast<double>(padded_length);
    const double c = static_cast<double>(cp_size);
    double cost = (alpha * s * s + beta * s) / c;
    if (cp_size > 1) cost += kappa * s * (c - 1) / c + lambda * (c - 1);
    return cost;
  }
};

// The names a configuration or `packfeedctl plan --cost-model` may give,
// for help texts and errors.
inline constexpr absl::string_view kCostModelNames = "megatron | llama8b";

// The cost model `name` names; InvalidArgument for any other name.
absl::StatusOr<CostModel> CostModelFromName(absl::string_view name);

}  // namespace packfeed::scheduler

#endif  // PACKFEED_SCHEDULER_COST_MODEL_H_
