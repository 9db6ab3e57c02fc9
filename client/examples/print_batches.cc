// A trainer rank in miniature: attaches to packfeedd with the C++ client and
// prints, per step, what this rank received. The quick start runs one per
// rank.
//
//   print_batches --socket S --job J --rank R [--steps N]

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "packfeed/client/client.h"

int main(int argc, char** argv) {
  CLI::App app{"print what one rank receives from packfeedd"};
  packfeed::client::ClientOptions options;
  int steps = 3;
  app.add_option("--socket", options.socket_path, "packfeedd's socket")->capture_default_str();
  app.add_option("--job", options.job, "job")->required();
  app.add_option("--rank", options.global_rank, "global rank")->required();
  app.add_option("--steps", steps, "steps to receive")->capture_default_str();
  app.add_option("--token", options.auth_token, "the job's auth token");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<std::unique_ptr<packfeed::client::Client>> client =
      packfeed::client::Client::Attach(options);
  if (!client.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", options.global_rank, client.status().ToString().c_str());
    return 1;
  }
  for (int s = 0; s < steps; ++s) {
    absl::StatusOr<packfeed::client::StepInfo> step = (*client)->NextStep();
    if (!step.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", options.global_rank, step.status().ToString().c_str());
      return 1;
    }
    std::vector<std::string> microbatches;
    for (int m = 0; m < step->num_microbatches; ++m) {
      absl::StatusOr<packfeed::client::Microbatch> microbatch = (*client)->Next();
      if (!microbatch.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", options.global_rank,
                     microbatch.status().ToString().c_str());
        return 1;
      }
      // Local tokens, sequences, and the CP group size when it varies.
      const auto* mask = microbatch->Field("padding_mask");
      const auto* cu = microbatch->Field("cu_seqlens");
      const auto* cp = microbatch->Field("local_cp_size");
      std::string text = absl::StrCat(mask->shape[1], "t/", cu->shape[0] - 1, "s");
      if (cp != nullptr) absl::StrAppend(&text, "/cp", *static_cast<const int32_t*>(cp->data));
      microbatches.push_back(text);
    }
    std::printf("rank %2d step %d: %d microbatches [%s]; batch: %lld real, %lld padded tokens\n",
                options.global_rank, static_cast<int>(step->step), step->num_microbatches,
                absl::StrJoin(microbatches, " ").c_str(), static_cast<long long>(step->real_sum),
                static_cast<long long>(step->padded_sum));
  }
  return 0;
}
