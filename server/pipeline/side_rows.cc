#include "server/pipeline/side_rows.h"

#include <algorithm>
#include <cstring>

namespace packfeed::server {

uint64_t SliceRowBytes(const SideSlice& slice) {
  const SideFieldInfo& field = *slice.field;
  if (slice.entries.empty()) return field.row_bytes();
  uint64_t bytes = 0;
  for (const IndexRange& range : slice.entries) bytes += static_cast<uint64_t>(range.size());
  return bytes * (field.row_bytes() / static_cast<uint64_t>(field.inner_shape[0]));
}

std::vector<int64_t> SliceInnerShape(const SideSlice& slice) {
  std::vector<int64_t> shape = slice.field->inner_shape;
  if (!slice.entries.empty()) {
    shape[0] = 0;
    for (const IndexRange& range : slice.entries) shape[0] += range.size();
  }
  return shape;
}

std::vector<char> PadRow(const SideSlice& slice) {
  std::vector<char> pad_row;
  const uint64_t row_bytes = SliceRowBytes(slice);
  for (uint64_t b = 0; b < row_bytes; b += slice.field->element_bytes) {
    pad_row.insert(pad_row.end(), slice.field->pad.begin(), slice.field->pad.end());
  }
  return pad_row;
}

namespace {

uint8_t* WritePads(int64_t from, int64_t end, const std::vector<char>& pad_row, uint8_t* out) {
  for (int64_t j = from; j < end; ++j) {
    std::memcpy(out, pad_row.data(), pad_row.size());
    out += pad_row.size();
  }
  return out;
}

// Positions [begin, served) take stored rows (row j + shift), the rest pads.
int64_t ServedEnd(const SideFieldInfo& field, uint64_t stored_bytes, int64_t real_length,
                  int64_t begin, int64_t end) {
  const int64_t shift = field.labels_aligned ? 1 : 0;
  const auto stored = static_cast<int64_t>(stored_bytes / field.row_bytes());
  return std::max(begin, std::min({end, real_length, stored - shift}));
}

}  // namespace

uint8_t* WriteSideRows(const SideSlice& slice, absl::Span<const char> rows, int64_t real_length,
                       int64_t begin, int64_t end, const std::vector<char>& pad_row, uint8_t* out) {
  const SideFieldInfo& field = *slice.field;
  const uint64_t row_bytes = field.row_bytes();
  const int64_t shift = field.labels_aligned ? 1 : 0;
  const int64_t served = ServedEnd(field, rows.size(), real_length, begin, end);
  const uint64_t served_bytes = static_cast<uint64_t>(served - begin) * row_bytes;
  if (served_bytes > 0) {
    const char* first = rows.data() + static_cast<uint64_t>(begin + shift) * row_bytes;
    if (slice.entries.empty()) {  // whole rows: one copy
      out = static_cast<uint8_t*>(std::memcpy(out, first, served_bytes)) + served_bytes;
    } else {
      const uint64_t layer_bytes = row_bytes / static_cast<uint64_t>(field.inner_shape[0]);
      for (const char* row = first; row < first + served_bytes; row += row_bytes) {
        for (const IndexRange& range : slice.entries) {
          const uint64_t bytes = static_cast<uint64_t>(range.size()) * layer_bytes;
          std::memcpy(out, row + static_cast<uint64_t>(range.begin) * layer_bytes, bytes);
          out += bytes;
        }
      }
    }
  }
  return WritePads(served, end, pad_row, out);
}

uint8_t* PlanSideRowsRead(const SideSlice& slice, const SampleNeed& stored, int64_t real_length,
                          int64_t begin, int64_t end, const std::vector<char>& pad_row,
                          uint8_t* out, std::vector<SlotRead>& reads) {
  const SideFieldInfo& field = *slice.field;
  const uint64_t row_bytes = field.row_bytes();
  const int64_t shift = field.labels_aligned ? 1 : 0;
  const int64_t served = ServedEnd(field, stored.bytes, real_length, begin, end);
  if (served > begin) {
    SlotRead& read = reads.emplace_back();
    read.need = stored;
    read.need.offset += static_cast<uint64_t>(begin + shift) * row_bytes;
    read.need.bytes = static_cast<uint64_t>(served - begin) * row_bytes;
    read.destination = out;
    read.row_bytes = row_bytes;
    for (const IndexRange& range : slice.entries) {  // a field without a layer axis has none
      const uint64_t layer_bytes = row_bytes / static_cast<uint64_t>(field.inner_shape[0]);
      read.kept.emplace_back(static_cast<uint64_t>(range.begin) * layer_bytes,
                             static_cast<uint64_t>(range.size()) * layer_bytes);
    }
    out += static_cast<uint64_t>(served - begin) * pad_row.size();
  }
  return WritePads(served, end, pad_row, out);
}

void ApplyLossMask(absl::Span<const char> mask, int64_t real_length, int64_t begin, int64_t end,
                   float* loss_mask) {
  for (int64_t j = begin; j < end; ++j, ++loss_mask) {
    const int64_t i = j + 1;
    if (j >= real_length || i >= static_cast<int64_t>(mask.size()) ||
        mask[static_cast<size_t>(i)] == 0) {
      *loss_mask = 0.0f;
    }
  }
}

}  // namespace packfeed::server
