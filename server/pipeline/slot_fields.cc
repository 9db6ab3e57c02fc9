#include "server/pipeline/slot_fields.h"

#include <algorithm>
#include <string>
#include <utility>

#include "packfeed/common/status_macros.h"
#include "server/pipeline/side_rows.h"

namespace packfeed::server {

using transport::ElementType;

// The slot fields of a microbatch of `tokens` local tokens and `sequences`
// sequences, in slot order; `group_ranks` > 0 adds the dynamic-CP fields,
// `sample_ids` the sequences' ids (hybrid CP). `slices`: the side fields
// the rank's stage receives (a loss-mask field is applied, not served).
std::vector<SlotField> FieldsFor(int64_t tokens, int64_t sequences, int64_t group_ranks,
                                 bool sample_ids, StageFields stage,
                                 absl::Span<const SideSlice* const> slices, int64_t bshd_rows) {
  const std::vector<int64_t> per_token = bshd_rows > 0
                                             ? std::vector<int64_t>{bshd_rows, tokens / bshd_rows}
                                             : std::vector<int64_t>{1, tokens};
  std::vector<SlotField> out;
  auto add = [&](std::string name, ElementType type, std::vector<int64_t> shape, SlotFieldRole role,
                 size_t side = 0) {
    out.push_back({{std::move(name), type, std::move(shape)}, role, side});
  };
  if (stage.inputs) {
    add(ChunkFieldName("tokens", stage.inputs_chunk), ElementType::kInt64, per_token,
        SlotFieldRole::kTokens);
    add(ChunkFieldName("position_ids", stage.inputs_chunk), ElementType::kInt64, per_token,
        SlotFieldRole::kPositionIds);
  }
  if (stage.targets) {
    add(ChunkFieldName("labels", stage.targets_chunk), ElementType::kInt64, per_token,
        SlotFieldRole::kLabels);
    add(ChunkFieldName("loss_mask", stage.targets_chunk), ElementType::kFloat32, per_token,
        SlotFieldRole::kLossMask);
  }
  add("padding_mask", ElementType::kBool, per_token, SlotFieldRole::kPaddingMask);
  if (bshd_rows == 0) {
    add("cu_seqlens", ElementType::kInt32, {sequences + 1}, SlotFieldRole::kCuSeqlens);
    add("cu_seqlens_padded", ElementType::kInt32, {sequences + 1}, SlotFieldRole::kCuSeqlensPadded);
  }
  add("max_seqlen", ElementType::kInt32, {}, SlotFieldRole::kMaxSeqlen);
  if (group_ranks > 0) {
    add("local_cp_size", ElementType::kInt32, {}, SlotFieldRole::kLocalCpSize);
    add("cp_group_ranks", ElementType::kInt32, {group_ranks}, SlotFieldRole::kCpGroupRanks);
  }
  if (sample_ids) {
    add("sample_ids", ElementType::kInt64, {sequences}, SlotFieldRole::kSampleIds);
    add("hybrid_group", ElementType::kInt32, {}, SlotFieldRole::kHybridGroup);
  }
  for (size_t f = 0; f < slices.size(); ++f) {
    if (slices[f]->field->loss_mask) continue;
    std::vector<int64_t> shape = {1, tokens};
    for (int64_t dim : SliceInnerShape(*slices[f])) shape.push_back(dim);
    add(slices[f]->wire_name, slices[f]->field->type, std::move(shape), SlotFieldRole::kSide, f);
  }
  return out;
}

absl::StatusOr<uint64_t> MaxSlotBytes(const SlotBounds& bounds,
                                      absl::Span<const SideFieldInfo> side_fields,
                                      const ModelStages& stages) {
  uint64_t largest = 0;
  for (int pp_rank = 0; pp_rank < stages.pp(); ++pp_rank) {
    const std::vector<SideSlice> slices = SideSlicesOfStage(side_fields, stages, pp_rank);
    std::vector<const SideSlice*> served;
    for (const SideSlice& slice : slices) served.push_back(&slice);
    std::vector<transport::FieldSpec> specs;
    for (SlotField& field : FieldsFor(bounds.max_tokens, bounds.max_sequences, bounds.group_ranks,
                                      bounds.sample_ids, {true, true}, served, 0)) {
      specs.push_back(std::move(field.spec));
    }
    PF_ASSIGN_OR_RETURN(std::vector<transport::FieldDescriptor> layout,
                        transport::LayoutFields(specs, UINT64_MAX));
    largest = std::max(largest, layout.back().offset + layout.back().bytes);
  }
  return largest;
}

}  // namespace packfeed::server
