#ifndef PACKFEED_SERVER_CONFIG_MODEL_STAGES_H_
#define PACKFEED_SERVER_CONFIG_MODEL_STAGES_H_

// Which layers each pipeline stage and model chunk holds (Megatron's split:
// num_layers_in_first/last_pipeline_stage, the rest evenly, chunk-major
// under VPP, MTP layers in the MTP stage's last chunk), and so which
// entries of a layer-axis side field each one receives. Pure.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace packfeed::v1 {
class ModelLayers;
}  // namespace packfeed::v1

namespace packfeed::server {

// [begin, end) of some numbering.
struct IndexRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

class ModelStages {
 public:
  // InvalidArgument (naming the field, relative to `where`) when the layer
  // counts do not add up for `pp` stages of `vpp` chunks.
  static absl::StatusOr<ModelStages> Create(const v1::ModelLayers& model, int pp, int vpp,
                                            const std::string& where);

  int pp() const { return pp_; }
  int vpp() const { return vpp_; }
  // The MTP stage, or -1 without MTP layers.
  int mtp_stage() const { return mtp_stage_; }
  // Entries of a layer-axis side field: the layers that are not dense.
  int num_moe_layers() const { return num_moe_layers_; }
  // The layers of chunk `chunk` of stage `pp_rank` (decoder, then MTP).
  const std::vector<IndexRange>& Layers(int pp_rank, int chunk) const;
  // The layer-axis entries that chunk receives, in order (empty ranges
  // dropped).
  const std::vector<IndexRange>& MoeEntries(int pp_rank, int chunk) const;

 private:
  int pp_ = 1;
  int vpp_ = 1;
  int mtp_stage_ = -1;
  int num_moe_layers_ = 0;
  std::vector<std::vector<IndexRange>> layers_;  // by pp_rank · vpp + chunk
  std::vector<std::vector<IndexRange>> moe_;
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_MODEL_STAGES_H_
