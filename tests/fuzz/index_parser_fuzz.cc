// libFuzzer target for the .idx parser: any byte string must either be
// rejected with a status or yield a view whose every element can be read
// without touching memory outside the input (ASan checks that). The two
// validation modes must agree: an index passes kFull exactly when it passes
// kOnUse and every one of its documents passes CheckDocument, with the same
// totals. What the daemon does at start-up with an on-use index, building
// the sample table and planning every document, must refuse a corrupt one
// with a status, never read outside it. What a dataset keeps of an index
// (CompactIndex) answers every entry as the parsed view does.

#include <cstddef>
#include <cstdint>

#include "packfeed/dataset/compact_index.h"
#include "packfeed/dataset/index_format.h"
#include "packfeed/dataset/sample_rules.h"

namespace {

using packfeed::dataset::CheckDocument;
using packfeed::dataset::CompactIndex;
using packfeed::dataset::IndexValidation;
using packfeed::dataset::IndexView;
using packfeed::dataset::ParseIndex;
using packfeed::dataset::SampleRules;
using packfeed::dataset::SampleTable;

bool AllDocumentsPass(const IndexView& view) {
  for (uint64_t d = 0; d < view.num_documents(); ++d) {
    if (!CheckDocument(view, d, "fuzz.idx").ok()) return false;
  }
  return true;
}

bool SameEntries(const IndexView& a, const IndexView& b) {
  if (a.num_sequences() != b.num_sequences() || a.num_documents() != b.num_documents() ||
      a.data_bytes() != b.data_bytes() || a.total_tokens() != b.total_tokens()) {
    return false;
  }
  for (uint64_t i = 0; i < a.num_sequences(); ++i) {
    if (a.length(i) != b.length(i) || a.pointer(i) != b.pointer(i) || a.mode(i) != b.mode(i)) {
      return false;
    }
  }
  for (uint64_t d = 0; d <= a.num_documents(); ++d) {
    if (a.document_index(d) != b.document_index(d)) return false;
  }
  return true;
}

}  // namespace

// Written with what the reads compute, so they are not optimised away.
extern volatile int64_t fuzz_sink;
volatile int64_t fuzz_sink = 0;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes = absl::MakeConstSpan(data, size);
  absl::StatusOr<IndexView> full = ParseIndex(bytes, "fuzz.idx", IndexValidation::kFull);
  absl::StatusOr<IndexView> on_use = ParseIndex(bytes, "fuzz.idx", IndexValidation::kOnUse);
  const bool lazily_valid = on_use.ok() && AllDocumentsPass(*on_use);
  if (full.ok() != lazily_valid) __builtin_trap();
  if (on_use.ok() && !SameEntries(*on_use, CompactIndex::From(*on_use).view())) __builtin_trap();
  if (on_use.ok()) {
    // Long documents split into pieces of 64 inputs, as the daemon's
    // default does; the table is built exactly when every document passes.
    SampleRules rules;
    rules.seq_length = 64;
    rules.append_eod = true;
    rules.split_long_documents = true;
    absl::StatusOr<SampleTable> table = SampleTable::Build(*on_use, rules, "fuzz.idx");
    if (table.ok() != lazily_valid) __builtin_trap();
    if (table.ok()) {
      int64_t planned = 0;
      for (int64_t s = 0; s < table->num_samples() && s < 4096; ++s) {
        planned += packfeed::dataset::PlannedLength(*on_use, table->Locate(s), rules);
      }
      fuzz_sink = planned;
    }
  }
  if (!full.ok()) return 0;
  if (full->data_bytes() != on_use->data_bytes() ||
      full->total_tokens() != on_use->total_tokens()) {
    __builtin_trap();
  }
  int64_t checksum = 0;
  for (uint64_t i = 0; i < full->num_sequences(); ++i) {
    checksum += full->length(i) + full->pointer(i) + full->mode(i);
  }
  for (uint64_t d = 0; d <= full->num_documents(); ++d) {
    checksum += full->document_index(d);
  }
  // A valid view's totals agree with its arrays.
  if (full->num_sequences() > 0 &&
      static_cast<uint64_t>(full->pointer(full->num_sequences() - 1)) > full->data_bytes()) {
    __builtin_trap();
  }
  fuzz_sink = checksum;
  return 0;
}
