// libFuzzer target for the .idx parser: any byte string must either be
// rejected with a status or yield a view whose every element can be read
// without touching memory outside the input (ASan checks that).

#include <cstddef>
#include <cstdint>

#include "packfeed/dataset/index_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<packfeed::dataset::IndexView> view =
      packfeed::dataset::ParseIndex(absl::MakeConstSpan(data, size), "fuzz.idx");
  if (!view.ok()) return 0;
  int64_t checksum = 0;
  for (uint64_t i = 0; i < view->num_sequences(); ++i) {
    checksum += view->length(i) + view->pointer(i) + view->mode(i);
  }
  for (uint64_t d = 0; d <= view->num_documents(); ++d) {
    checksum += view->document_index(d);
  }
  // A valid view's totals agree with its arrays.
  if (view->num_sequences() > 0 &&
      static_cast<uint64_t>(view->pointer(view->num_sequences() - 1)) > view->data_bytes()) {
    __builtin_trap();
  }
  // Keep the reads from being optimised away.
  static volatile int64_t sink;
  sink = checksum;
  return 0;
}
