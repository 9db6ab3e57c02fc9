#include "server/pipeline/push.h"

#include "packfeed/v1/service.pb.h"

namespace packfeed::server {

absl::Status PushMicrobatch(transport::SlotSender& sender, uint64_t connection_id,
                            const StepPlan& plan, int microbatch, const PackedMicrobatch& packed) {
  const SlotFields fields = MicrobatchFields(packed);
  transport::SlotContent content;
  content.step = plan.step;
  content.microbatch = static_cast<uint32_t>(microbatch);
  for (size_t i = 0; i < fields.specs.size(); ++i) {
    content.fields.push_back({fields.specs[i], fields.data[i]});
  }
  // What Next() returns beside the fields: the step's shape and FLOPs inputs.
  const scheduler::FlopsInputs& flops = plan.plan.flops;
  v1::SlotMetadata metadata;
  metadata.set_step(plan.step);
  metadata.set_microbatch(content.microbatch);
  metadata.set_num_microbatches(static_cast<uint32_t>(plan.plan.num_microbatches()));
  metadata.set_padded_sum(flops.padded_sum);
  metadata.set_padded_squared_sum(flops.padded_squared_sum);
  metadata.set_real_sum(flops.real_sum);
  metadata.set_real_squared_sum(flops.real_squared_sum);
  content.inline_metadata = metadata.SerializeAsString();
  return sender.Push(connection_id, content);
}

}  // namespace packfeed::server
