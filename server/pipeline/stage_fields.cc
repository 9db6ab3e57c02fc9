#include "server/pipeline/stage_fields.h"

namespace packfeed::server {

StageFields FieldsOfStage(int pp_rank, int pp_size, int mtp_stage, int vpp) {
  const bool first = pp_rank == 0;
  const bool mtp = pp_rank == mtp_stage;
  StageFields out{first || mtp, pp_rank == pp_size - 1 || mtp};
  if (vpp > 1) {
    // Megatron: the first stage's first chunk embeds, the last stage's last
    // chunk computes the loss, the MTP layers sit in the last chunk. An MTP
    // first stage needs the inputs in two chunks: both get them.
    out.inputs_chunk = first && mtp ? -1 : first ? 0 : vpp - 1;
    out.targets_chunk = vpp - 1;
  }
  return out;
}

std::string ChunkFieldName(absl::string_view name, int chunk) {
  return chunk < 0 ? std::string(name) : absl::StrCat(name, "@", chunk);
}

std::vector<SideSlice> SideSlicesOfStage(absl::Span<const SideFieldInfo> fields,
                                         const ModelStages& stages, int pp_rank) {
  const StageFields stage = FieldsOfStage(pp_rank, stages.pp(), stages.mtp_stage(), stages.vpp());
  std::vector<SideSlice> out;
  for (const SideFieldInfo& field : fields) {
    if (field.loss_mask) {
      if (stage.targets) out.push_back({&field, field.name, {}});
      continue;
    }
    const bool inputs = field.stages == SideFieldStages::kInputs;
    const bool targets = field.stages == SideFieldStages::kTargets;
    if ((inputs && !stage.inputs) || (targets && !stage.targets)) continue;
    if (!field.layer_axis) {
      // With the fields it goes with, in their chunk.
      const int chunk = inputs ? stage.inputs_chunk : targets ? stage.targets_chunk : -1;
      out.push_back({&field, ChunkFieldName(field.name, chunk), {}});
      continue;
    }
    // Cut to each model chunk's layers; a chunk without MoE layers gets
    // none (and under STAGES_LAYERS neither does a stage without any).
    for (int chunk = 0; chunk < stages.vpp(); ++chunk) {
      const std::vector<IndexRange>& entries = stages.MoeEntries(pp_rank, chunk);
      if (entries.empty() && field.stages == SideFieldStages::kLayers) continue;
      std::string name = ChunkFieldName(field.name, stages.vpp() > 1 ? chunk : -1);
      // An empty cut of a field a stage must get: zero layers, not all.
      out.push_back(
          {&field, std::move(name), entries.empty() ? std::vector<IndexRange>{{0, 0}} : entries});
    }
  }
  return out;
}

}  // namespace packfeed::server
