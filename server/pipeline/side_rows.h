#ifndef PACKFEED_SERVER_PIPELINE_SIDE_ROWS_H_
#define PACKFEED_SERVER_PIPELINE_SIDE_ROWS_H_

// A side field's rows as a rank receives them: cut to its stage's slice of
// the layer axis, shifted to labels where the field says so, padded past a
// sequence's real length; and a loss-mask field applied to loss_mask.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "server/pipeline/stage_fields.h"
#include "server/storage/storage.h"

namespace packfeed::server {

// Bytes of one position of `slice`: its layer-axis entries' values.
uint64_t SliceRowBytes(const SideSlice& slice);
std::vector<int64_t> SliceInnerShape(const SideSlice& slice);
// One position's pad of `slice`: the field's pad value in every entry.
std::vector<char> PadRow(const SideSlice& slice);
// Writes positions [begin, end) of one sequence's side rows at `out` and
// returns the end of what it wrote: stored row j (j + 1 aligned with
// labels) of a real position, else the pad.
uint8_t* WriteSideRows(const SideSlice& slice, absl::Span<const char> rows, int64_t real_length,
                       int64_t begin, int64_t end, const std::vector<char>& pad_row, uint8_t* out);
// The same positions when the rows are read straight into the slot: writes
// the pads, appends the read of the stored rows to `reads` (`stored`: the
// sequence's rows in the file, as SideNeedsOf has them) and returns the end
// of what it and the read fill.
uint8_t* PlanSideRowsRead(const SideSlice& slice, const SampleNeed& stored, int64_t real_length,
                          int64_t begin, int64_t end, const std::vector<char>& pad_row,
                          uint8_t* out, std::vector<SlotRead>& reads);
// The loss mask of positions [begin, end): stored value j + 1 of a real
// position is 0 = not trained.
void ApplyLossMask(absl::Span<const char> mask, int64_t real_length, int64_t begin, int64_t end,
                   float* loss_mask);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_PIPELINE_SIDE_ROWS_H_
