#ifndef PACKFEED_SERVER_PIPELINE_STAGE_FIELDS_H_
#define PACKFEED_SERVER_PIPELINE_STAGE_FIELDS_H_

// Which fields each pipeline stage receives, side fields included, and
// what they are called on the wire (docs/CONTRACT.md). Pure. pack.h lays
// them out; side_rows.h writes a side field's rows.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/config/model_stages.h"
#include "server/config/side_fields.h"

namespace packfeed::server {

// Which fields a pipeline stage receives (docs/CONTRACT.md), and under VPP
// which of its model chunks each belongs to (-1: every chunk). A field of
// one chunk travels as NAME@CHUNK; the clients' chunk views strip that.
struct StageFields {
  bool inputs = true;   // tokens, position_ids (first stage, MTP)
  bool targets = true;  // labels, loss_mask (last stage, MTP)
  int inputs_chunk = -1;
  int targets_chunk = -1;
};
// `mtp_stage`: the stage holding MTP layers (in its last chunk), or -1.
StageFields FieldsOfStage(int pp_rank, int pp_size, int mtp_stage = -1, int vpp = 1);
// NAME, or NAME@CHUNK for a field of one model chunk.
std::string ChunkFieldName(absl::string_view name, int chunk);

// A side field as one pipeline stage receives it: whole, or cut to the
// layer-axis entries of one of its model chunks.
struct SideSlice {
  const SideFieldInfo* field = nullptr;
  std::string wire_name;            // the field's name; NAME.K for model chunk K under VPP
  std::vector<IndexRange> entries;  // of the layer axis; empty = all of it
};
// The side fields stage `pp_rank` receives, in configuration order (the
// loss-mask field, which is not served, on every stage that gets targets).
std::vector<SideSlice> SideSlicesOfStage(absl::Span<const SideFieldInfo> fields,
                                         const ModelStages& stages, int pp_rank);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_STAGE_FIELDS_H_
