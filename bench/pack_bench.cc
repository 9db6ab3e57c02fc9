// How fast the daemon writes one large microbatch into a slot, by the
// number of threads writing it (DaemonConfig.packing_threads; docs/DAEMON.md):
// varlen tokens, labels, positions and loss mask, and a 48×8 int16 side
// field shifted to labels, 8 192 positions per microbatch by default. The
// slot is a page-touched buffer, as a ring mapped into the daemon is; the
// figure is GiB of slot written per second, beside a single-thread memcpy
// of the same bytes in the same run. 24 microbatches are written in turn, so
// that what is read and written comes from memory, not the caches.
//
//   pack_bench [--positions 8192] [--threads 1,2,4] [--rounds 200] [--json]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/pipeline/pack.h"
#include "server/pipeline/pack_workers.h"

namespace packfeed::server {
namespace {

constexpr int kLayers = 48;
constexpr int kTopK = 8;
constexpr int kMicrobatches = 24;

double Seconds(const std::function<void()>& run, int rounds) {
  run();  // warm
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r) run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / rounds;
}

int Main(int argc, char** argv) {
  CLI::App app("pack_bench");
  int64_t positions = 8192;
  std::vector<int> threads = {1, 2, 4};
  int rounds = 200;
  bool json = false;
  app.add_option("--positions", positions, "positions per microbatch")->capture_default_str();
  app.add_option("--threads", threads, "thread counts to time")->delimiter(',');
  app.add_option("--rounds", rounds, "writes timed per thread count")->capture_default_str();
  app.add_flag("--json", json, "one JSON line");
  CLI11_PARSE(app, argc, argv);

  SideFieldInfo field;
  field.name = "routed_experts";
  field.type = transport::ElementType::kInt16;
  field.element_bytes = 2;
  field.inner_shape = {kLayers, kTopK};
  field.row_elements = kLayers * kTopK;
  field.pad = {0xff, 0xff};  // -1
  field.labels_aligned = true;
  field.layer_axis = true;
  const dataset::SampleRules rules{dataset::SampleKind::kVarlen, positions, 0, 0, false};
  // `kMicrobatches` different ones, written in turn, so that neither their
  // rows nor their slots stay in the caches (as a step's would not).
  struct Microbatch {
    std::vector<std::vector<int64_t>> texts;
    std::vector<std::vector<int16_t>> rows;
    scheduler::CpGroup group{0, 1, {}};
    std::vector<absl::Span<const int64_t>> runs;
    std::vector<SideRun> sides;
    MicrobatchSource source;
    std::vector<transport::FieldDescriptor> layout;
    std::vector<uint8_t> slot;
    std::vector<uint8_t> copy_from;
  };
  std::vector<Microbatch> microbatches(static_cast<size_t>(kMicrobatches));
  uint64_t bytes = 0;
  for (Microbatch& mb : microbatches) {
    // Sequences of 1 000 to 4 000 tokens filling the microbatch.
    for (int64_t at = 0, i = 0; at < positions; ++i) {
      const int64_t real = std::min<int64_t>(1000 + (i * 1237) % 3000, positions - at);
      mb.texts.emplace_back(static_cast<size_t>(real) + 1, 7);
      mb.rows.emplace_back(static_cast<size_t>(real) * kLayers * kTopK, 3);
      mb.group.sequences.push_back({i, real, real});
      at += real;
    }
    mb.sides = {{{&field, "routed_experts", {}}, {}, {}}};
    for (size_t i = 0; i < mb.texts.size(); ++i) {
      mb.runs.push_back(mb.texts[i]);
      mb.sides[0].rows.push_back(
          {reinterpret_cast<const char*>(mb.rows[i].data()), mb.rows[i].size() * sizeof(int16_t)});
    }
    absl::StatusOr<MicrobatchSource> source = SourceOfGroup(mb.group, mb.runs, 0, rules, mb.sides);
    if (!source.ok()) {
      std::fprintf(stderr, "pack_bench: %s\n", source.status().ToString().c_str());
      return 1;
    }
    mb.source = *std::move(source);
    auto layout = transport::LayoutFields(MicrobatchSpecs(mb.source), UINT64_MAX);
    if (!layout.ok()) return 1;
    mb.layout = *std::move(layout);
    bytes = mb.layout.back().offset + mb.layout.back().bytes;
    mb.slot.assign(bytes, 1);
    mb.copy_from.assign(bytes, 2);
  }
  const double gib = static_cast<double>(bytes) / (1 << 30);
  size_t turn = 0;
  const double memcpy_rate = gib / Seconds(
                                       [&] {
                                         Microbatch& mb =
                                             microbatches[turn++ % microbatches.size()];
                                         std::memcpy(mb.slot.data(), mb.copy_from.data(), bytes);
                                       },
                                       rounds);
  std::vector<std::string> rates;
  std::string lines;
  for (int t : threads) {
    PackWorkers workers(t);
    const double rate = gib / Seconds(
                                  [&] {
                                    Microbatch& mb = microbatches[turn++ % microbatches.size()];
                                    WriteMicrobatch(mb.source, mb.layout, mb.slot.data(), &workers);
                                  },
                                  rounds);
    rates.push_back(absl::StrCat("\"threads_", t, "_gib_per_s\":", rate));
    absl::StrAppend(&lines, "  ", t, " thread(s): ", rate, " GiB/s (", rate / memcpy_rate,
                    " of memcpy)\n");
  }
  if (json) {
    std::printf("{\"slot_bytes\":%llu,\"memcpy_gib_per_s\":%.3f,%s}\n",
                static_cast<unsigned long long>(bytes), memcpy_rate,
                absl::StrJoin(rates, ",").c_str());
  } else {
    std::printf(
        "pack_bench: a microbatch of %lld positions, %.1f MiB of slot; memcpy %.2f GiB/s\n%s",
        static_cast<long long>(positions), static_cast<double>(bytes) / (1 << 20), memcpy_rate,
        lines.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace packfeed::server

int main(int argc, char** argv) { return packfeed::server::Main(argc, argv); }
