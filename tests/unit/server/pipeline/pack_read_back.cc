#include "pack_read_back.h"

#include <cstring>

#include "packfeed/common/status_macros.h"

namespace packfeed::server {
namespace {

template <typename T>
std::vector<T> Values(const std::vector<uint8_t>& slot, const transport::FieldDescriptor& field) {
  std::vector<T> out(field.bytes / sizeof(T));
  if (field.bytes > 0) std::memcpy(out.data(), slot.data() + field.offset, field.bytes);
  return out;
}

}  // namespace

PackedMicrobatch ReadBack(const MicrobatchSource& source) {
  // Every field of a source fits an unbounded slot.
  const std::vector<transport::FieldDescriptor> layout =
      transport::LayoutFields(MicrobatchSpecs(source), UINT64_MAX).value();
  std::vector<uint8_t> slot(layout.back().offset + layout.back().bytes);
  WriteMicrobatch(source, layout, slot.data());
  PackedMicrobatch out;
  for (const transport::FieldDescriptor& field : layout) {
    const std::string& name = field.name;
    if (name == "tokens") {
      out.tokens = Values<int64_t>(slot, field);
    } else if (name == "position_ids") {
      out.position_ids = Values<int64_t>(slot, field);
    } else if (name == "labels") {
      out.labels = Values<int64_t>(slot, field);
    } else if (name == "loss_mask") {
      out.loss_mask = Values<float>(slot, field);
    } else if (name == "padding_mask") {
      out.padding_mask = Values<uint8_t>(slot, field);
    } else if (name == "cu_seqlens") {
      out.cu_seqlens = Values<int32_t>(slot, field);
    } else if (name == "cu_seqlens_padded") {
      out.cu_seqlens_padded = Values<int32_t>(slot, field);
    } else if (name == "max_seqlen") {
      out.max_seqlen = Values<int32_t>(slot, field)[0];
    } else if (name == "local_cp_size") {
      out.local_cp_size = Values<int32_t>(slot, field)[0];
    } else if (name == "cp_group_ranks") {
      out.cp_group_ranks = Values<int32_t>(slot, field);
    } else {
      out.side.push_back({name, field.type,
                          std::vector<int64_t>(field.shape.begin() + 2, field.shape.end()),
                          Values<char>(slot, field)});
    }
  }
  return out;
}

absl::StatusOr<PackedMicrobatch> PackMicrobatch(const scheduler::CpGroup& group,
                                                absl::Span<const absl::Span<const int64_t>> runs,
                                                int cp_rank, const dataset::SampleRules& rules,
                                                std::vector<SideRun> sides) {
  PF_ASSIGN_OR_RETURN(MicrobatchSource source,
                      SourceOfGroup(group, runs, cp_rank, rules, std::move(sides)));
  return ReadBack(source);
}

}  // namespace packfeed::server
