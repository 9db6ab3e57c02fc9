// _next_timer: Next()'s latency measured in C++, for bench/python_next_bench.py
// to set beside Python's in the same run. A module of its own so the product
// module (packfeed._native) carries no benchmark code; it takes the Client
// that packfeed._native registered with pybind11.

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "packfeed/client/client.h"
#include "pybind11/pybind11.h"
#include "pybind11/stl.h"

namespace py = pybind11;

namespace packfeed::client {
namespace {

// Next()'s latency measured in C++, for bench/python_next_bench.py to set
// beside Python's in the same run: nanoseconds per microbatch over `steps`,
// each Next() after a pause of `pause_us` (so the daemon is ahead).
std::vector<int64_t> TimeNextInCpp(Client& client, int steps, int pause_us) {
  std::vector<int64_t> latencies;
  absl::Status failure;
  {
    py::gil_scoped_release release;
    for (int s = 0; s < steps && failure.ok(); ++s) {
      absl::StatusOr<StepInfo> step = client.NextStep();
      if (!step.ok()) {
        failure = step.status();
        break;
      }
      for (int m = 0; m < step->num_microbatches; ++m) {
        absl::SleepFor(absl::Microseconds(pause_us));
        const auto start = std::chrono::steady_clock::now();
        absl::StatusOr<Microbatch> microbatch = client.Next();
        latencies.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count());
        if (!microbatch.ok()) {
          failure = microbatch.status();
          break;
        }
      }
    }
  }
  if (!failure.ok()) throw std::runtime_error(failure.ToString());
  return latencies;
}

}  // namespace
}  // namespace packfeed::client

PYBIND11_MODULE(_next_timer, m) {
  py::module_::import("packfeed._native");  // registers Client
  m.def("time_next_in_cpp", &packfeed::client::TimeNextInCpp, py::arg("client"), py::arg("steps"),
        py::arg("pause_us"));
}
