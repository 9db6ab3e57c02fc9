#include "server/pipeline/push.h"

#include "packfeed/common/status_macros.h"
#include "packfeed/v1/service.pb.h"

namespace packfeed::server {
namespace {

// What Next() returns beside the fields: the step's shape and FLOPs inputs.
v1::SlotMetadata MetadataOf(const StepPlan& plan, int microbatch) {
  const scheduler::FlopsInputs& flops = plan.plan.flops;
  v1::SlotMetadata metadata;
  metadata.set_step(plan.step);
  metadata.set_microbatch(static_cast<uint32_t>(microbatch));
  metadata.set_num_microbatches(static_cast<uint32_t>(plan.plan.num_microbatches()));
  metadata.set_padded_sum(flops.padded_sum);
  metadata.set_padded_squared_sum(flops.padded_squared_sum);
  metadata.set_real_sum(flops.real_sum);
  metadata.set_real_squared_sum(flops.real_squared_sum);
  return metadata;
}

}  // namespace

absl::StatusOr<MappedWrite> WriteMappedSlot(transport::SlotSender& sender, uint64_t connection_id,
                                            const StepPlan& plan, int microbatch,
                                            const MicrobatchSource& source, PackWorkers* workers,
                                            std::vector<SlotRead>& reads) {
  const std::vector<transport::FieldSpec> specs = MicrobatchSpecs(source);
  PF_ASSIGN_OR_RETURN(transport::MappedSlot slot, sender.MapNextSlot(connection_id));
  PF_ASSIGN_OR_RETURN(std::vector<transport::FieldDescriptor> layout,
                      transport::LayoutFields(specs, slot.bytes));
  WriteMicrobatch(source, layout, slot.data, workers, &reads);
  MappedWrite out;
  out.slot = slot.data;
  out.content.step = plan.step;
  out.content.microbatch = static_cast<uint32_t>(microbatch);
  out.content.inline_metadata = MetadataOf(plan, microbatch).SerializeAsString();
  for (const transport::FieldSpec& spec : specs) out.content.fields.push_back({spec, nullptr});
  return out;
}

absl::Status PushMicrobatch(transport::SlotSender& sender, uint64_t connection_id, bool mapped,
                            bool inline_small_fields, const StepPlan& plan, int microbatch,
                            const MicrobatchSource& source, std::vector<uint8_t>& staging,
                            PackWorkers* workers) {
  transport::SlotContent content;
  content.step = plan.step;
  content.microbatch = static_cast<uint32_t>(microbatch);
  const std::vector<transport::FieldSpec> specs = MicrobatchSpecs(source);
  v1::SlotMetadata metadata = MetadataOf(plan, microbatch);
  // Once the fields are written: a device ring's small fields ride along.
  const auto finish_metadata = [&](const std::vector<transport::FieldDescriptor>& layout,
                                   const uint8_t* written) {
    for (size_t i = 0; inline_small_fields && i < layout.size(); ++i) {
      if (layout[i].bytes > kInlineFieldBytes) continue;
      (*metadata.mutable_small_fields())[specs[i].name] =
          std::string(reinterpret_cast<const char*>(written + layout[i].offset), layout[i].bytes);
    }
    content.inline_metadata = metadata.SerializeAsString();
  };
  if (mapped) {
    PF_ASSIGN_OR_RETURN(transport::MappedSlot slot, sender.MapNextSlot(connection_id));
    PF_ASSIGN_OR_RETURN(std::vector<transport::FieldDescriptor> layout,
                        transport::LayoutFields(specs, slot.bytes));
    WriteMicrobatch(source, layout, slot.data, workers);
    finish_metadata(layout, slot.data);
    for (const transport::FieldSpec& spec : specs) content.fields.push_back({spec, nullptr});
    return sender.CommitMapped(connection_id, content);
  }
  PF_ASSIGN_OR_RETURN(std::vector<transport::FieldDescriptor> layout,
                      transport::LayoutFields(specs, UINT64_MAX));
  // Grows to the largest microbatch and stays: no fresh pages per push.
  const uint64_t bytes = layout.back().offset + layout.back().bytes;
  if (staging.size() < bytes) staging.resize(bytes);
  WriteMicrobatch(source, layout, staging.data(), workers);
  finish_metadata(layout, staging.data());
  for (size_t i = 0; i < specs.size(); ++i) {
    content.fields.push_back({specs[i], staging.data() + layout[i].offset});
  }
  return sender.Push(connection_id, content);
}

}  // namespace packfeed::server
