#include "server/config/model_stages.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "packfeed/v1/config.pb.h"

namespace packfeed::server {
namespace {

absl::Status LayerError(const std::string& where, absl::string_view field,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ".model.", field, ": ", problem));
}

// Decoder layers per stage, as Megatron splits them.
absl::StatusOr<std::vector<int>> DecoderLayersPerStage(const v1::ModelLayers& model, int pp,
                                                       const std::string& where) {
  const int total = static_cast<int>(model.num_layers());
  const bool first = model.has_num_layers_in_first_pipeline_stage();
  const bool last = model.has_num_layers_in_last_pipeline_stage();
  if ((first || last) && pp < 2) {
    return LayerError(where, "num_layers_in_first_pipeline_stage",
                      "uneven stages need topology.pp > 1");
  }
  const int first_layers = first ? static_cast<int>(model.num_layers_in_first_pipeline_stage()) : 0;
  const int last_layers = last ? static_cast<int>(model.num_layers_in_last_pipeline_stage()) : 0;
  const int middle_stages = pp - (first ? 1 : 0) - (last ? 1 : 0);
  const int middle_layers = total - first_layers - last_layers;
  if (middle_layers < 0) {
    return LayerError(where, "num_layers",
                      absl::StrCat(total, " layers, fewer than the first and last stages' ",
                                   first_layers, " + ", last_layers));
  }
  if (middle_stages == 0 && middle_layers != 0) {
    return LayerError(where, "num_layers",
                      absl::StrCat(total, " layers, but the first and last stages hold ",
                                   first_layers + last_layers));
  }
  if (middle_stages > 0 && middle_layers % middle_stages != 0) {
    return LayerError(where, "num_layers",
                      absl::StrCat(middle_layers, " layers do not split evenly over ",
                                   middle_stages, " pipeline stages"));
  }
  std::vector<int> per_stage(static_cast<size_t>(pp),
                             middle_stages == 0 ? 0 : middle_layers / middle_stages);
  if (first) per_stage.front() = first_layers;
  if (last) per_stage.back() = last_layers;
  return per_stage;
}

}  // namespace

absl::StatusOr<ModelStages> ModelStages::Create(const v1::ModelLayers& model, int pp, int vpp,
                                                const std::string& where) {
  ModelStages out;
  out.pp_ = pp;
  out.vpp_ = vpp;
  absl::StatusOr<std::vector<int>> per_stage = DecoderLayersPerStage(model, pp, where);
  if (!per_stage.ok()) return per_stage.status();
  for (int stage = 0; stage < pp; ++stage) {
    if ((*per_stage)[static_cast<size_t>(stage)] % vpp != 0) {
      return LayerError(
          where, "num_layers",
          absl::StrCat("stage ", stage, "'s ", (*per_stage)[static_cast<size_t>(stage)],
                       " layers do not split evenly over ", vpp, " model chunks"));
    }
  }
  const int decoder = static_cast<int>(model.num_layers());
  const int mtp = static_cast<int>(model.mtp_num_layers());
  if (mtp > 0) {
    out.mtp_stage_ = model.has_mtp_stage() ? static_cast<int>(model.mtp_stage()) : pp - 1;
    if (out.mtp_stage_ >= pp) {
      return LayerError(where, "mtp_stage",
                        absl::StrCat(out.mtp_stage_, " is outside ", pp, " pipeline stages"));
    }
  } else if (model.has_mtp_stage()) {
    return LayerError(where, "mtp_stage", "set without mtp_num_layers");
  }
  std::set<int> dense;
  for (uint32_t layer : model.dense_layers()) {
    if (static_cast<int>(layer) >= decoder + mtp) {
      return LayerError(where, "dense_layers",
                        absl::StrCat("layer ", layer, " is outside the model's ", decoder + mtp));
    }
    if (!dense.insert(static_cast<int>(layer)).second) {
      return LayerError(where, "dense_layers", absl::StrCat("layer ", layer, " listed twice"));
    }
  }
  // moe_before[l]: MoE layers numbered below l.
  std::vector<int> moe_before(static_cast<size_t>(decoder + mtp + 1), 0);
  for (int l = 0; l < decoder + mtp; ++l) {
    moe_before[static_cast<size_t>(l) + 1] =
        moe_before[static_cast<size_t>(l)] + (dense.count(l) ? 0 : 1);
  }
  out.num_moe_layers_ = moe_before.back();

  out.layers_.resize(static_cast<size_t>(pp * vpp));
  out.moe_.resize(static_cast<size_t>(pp * vpp));
  int next = 0;
  for (int chunk = 0; chunk < vpp; ++chunk) {
    for (int stage = 0; stage < pp; ++stage) {
      const int count = (*per_stage)[static_cast<size_t>(stage)] / vpp;
      std::vector<IndexRange>& layers = out.layers_[static_cast<size_t>(stage * vpp + chunk)];
      layers.push_back({next, next + count});
      next += count;
      if (stage == out.mtp_stage_ && chunk == vpp - 1) layers.push_back({decoder, decoder + mtp});
    }
  }
  for (size_t i = 0; i < out.layers_.size(); ++i) {
    for (const IndexRange& range : out.layers_[i]) {
      const IndexRange moe{moe_before[static_cast<size_t>(range.begin)],
                           moe_before[static_cast<size_t>(range.end)]};
      if (moe.size() == 0) continue;
      if (!out.moe_[i].empty() && out.moe_[i].back().end == moe.begin) {
        out.moe_[i].back().end = moe.end;  // the last decoder layers and MTP's
      } else {
        out.moe_[i].push_back(moe);
      }
    }
  }
  return out;
}

const std::vector<IndexRange>& ModelStages::Layers(int pp_rank, int chunk) const {
  return layers_[static_cast<size_t>(pp_rank * vpp_ + chunk)];
}

const std::vector<IndexRange>& ModelStages::MoeEntries(int pp_rank, int chunk) const {
  return moe_[static_cast<size_t>(pp_rank * vpp_ + chunk)];
}

}  // namespace packfeed::server
