#ifndef PACKFEED_SERVER_CONFIG_SIDE_FIELDS_H_
#define PACKFEED_SERVER_CONFIG_SIDE_FIELDS_H_

// Per-token side fields (docs/CONTRACT.md, config.proto SideField): what a
// configured field means to the pipeline, its start-up checks against the
// files, and the bytes of one position. Pure except CheckSideDataset's
// reading of an open index.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "packfeed/dataset/indexed_dataset.h"
#include "packfeed/transport/wire.h"

namespace packfeed::v1 {
class DatasetSpec;
class SideField;
}  // namespace packfeed::v1

namespace packfeed::server {

class ModelStages;

// The pipeline stages that receive a side field (SideField.stages, its
// default resolved by the field's alignment and axis).
enum class SideFieldStages {
  kAll,
  kInputs,   // the stages that get tokens (first, MTP)
  kTargets,  // the stages that get labels (last, MTP)
  kLayers,   // the stages holding MoE layers (layer_axis only)
};

struct SideFieldInfo {
  std::string name;
  transport::ElementType type = transport::ElementType::kUInt8;
  size_t element_bytes = 1;
  std::vector<int64_t> inner_shape;
  int64_t row_elements = 1;  // prod(inner_shape): values stored per token
  std::vector<uint8_t> pad;  // one element holding pad_value, little-endian
  bool labels_aligned = false;
  bool layer_axis = false;
  bool loss_mask = false;  // replaces loss_mask; not served by name
  SideFieldStages stages = SideFieldStages::kInputs;

  uint64_t row_bytes() const { return static_cast<uint64_t>(row_elements) * element_bytes; }
};

// Checks `field` (InvalidArgument naming `where`.side_fields[i].FIELD) and
// resolves its defaults; `stages` gives the layer axis' length.
absl::StatusOr<SideFieldInfo> ResolveSideField(const v1::SideField& field,
                                               const ModelStages& stages, const std::string& where);

// Where dataset `spec`'s copy of `field` is stored.
std::string SideFieldPrefix(const v1::DatasetSpec& spec, const std::string& field);

// FailedPrecondition unless `side` holds `field` for every sequence of
// `tokens`: the same documents, tokens × row_elements values per sequence
// (naming the first that differs), of a dtype that can hold `field`'s.
absl::Status CheckSideDataset(const SideFieldInfo& field, const dataset::IndexedDataset& tokens,
                              const dataset::IndexedDataset& side);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONFIG_SIDE_FIELDS_H_
