// next_latency: one rank's Next() latency measured in C++, for
// bench/python_next_bench.py to set beside Python's next() against the same
// daemon in the same run. Attaches at --start-step, takes --steps steps,
// pausing --pause-us before each Next() (so the daemon is ahead and what is
// timed is the client's own cost), detaches, and prints one JSON object:
// per microbatch, the nanoseconds Next() took ("next_ns") and those the
// Microbatch's end took, which gives the slot back ("release_ns").

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "packfeed/client/client.h"

namespace {

int64_t Nanoseconds(std::chrono::steady_clock::duration elapsed) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"next_latency: C++ Next() latency of one rank"};
  packfeed::client::ClientOptions options;
  int steps = 10;
  int pause_us = 300;
  app.add_option("--socket", options.socket_path, "packfeedd's socket")->required();
  app.add_option("--job", options.job, "job")->required();
  app.add_option("--rank", options.global_rank, "global rank")->capture_default_str();
  app.add_option("--start-step", options.start_step, "first step")->capture_default_str();
  app.add_option("--steps", steps, "steps to take")->capture_default_str();
  app.add_option("--pause-us", pause_us, "pause before each Next()")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<std::unique_ptr<packfeed::client::Client>> client =
      packfeed::client::Client::Attach(options);
  if (!client.ok()) {
    std::fprintf(stderr, "next_latency: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<int64_t> latencies;
  std::vector<int64_t> releases;
  for (int s = 0; s < steps; ++s) {
    absl::StatusOr<packfeed::client::StepInfo> step = (*client)->NextStep();
    if (!step.ok()) {
      std::fprintf(stderr, "next_latency: %s\n", step.status().ToString().c_str());
      return 1;
    }
    for (int m = 0; m < step->num_microbatches; ++m) {
      absl::SleepFor(absl::Microseconds(pause_us));
      const auto start = std::chrono::steady_clock::now();
      auto microbatch = std::make_optional((*client)->Next());
      const auto taken = std::chrono::steady_clock::now();
      if (!microbatch->ok()) {
        std::fprintf(stderr, "next_latency: %s\n", microbatch->status().ToString().c_str());
        return 1;
      }
      microbatch.reset();  // gives the slot back
      const auto released = std::chrono::steady_clock::now();
      latencies.push_back(Nanoseconds(taken - start));
      releases.push_back(Nanoseconds(released - taken));
    }
  }
  if (absl::Status detached = (*client)->Detach(); !detached.ok()) {
    std::fprintf(stderr, "next_latency: %s\n", detached.ToString().c_str());
    return 1;
  }
  std::printf("{\"next_ns\": [%s], \"release_ns\": [%s]}\n", absl::StrJoin(latencies, ",").c_str(),
              absl::StrJoin(releases, ",").c_str());
  return 0;
}
