#ifndef PACKFEED_CLIENT_PRODUCER_H_
#define PACKFEED_CLIENT_PRODUCER_H_

// What a driver links to put samples into an ingest stream of packfeedd
// (docs/INGEST.md): an RL loop's rollouts, step by step, for every consumer
// job's ranks to be served balanced and packed.
//
// The producer's staging arena is a memfd shared once with the daemon (over
// SOCKET.rings, at the first put). The first put describes its samples over
// gRPC and the daemon, once the stream has room, answers where in the arena
// to write them; the producer copies them there, the only copy of their
// bytes, and commits the put. Every answer names the arena's free spans,
// so later puts take one call: the producer copies the samples into a span
// the daemon named free, then describes them, and the daemon adds them once
// the stream has room. The daemon serves the samples from that memory and
// frees the span when their step is freed. Nothing is pickled or sent
// through gRPC but the description.
//
// Thread-safe; puts are serialised (one reservation at a time). gRPC stays
// behind the implementation: this header needs Abseil only.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "packfeed/common/defaults.h"

namespace packfeed::client {

struct ProducerOptions {
  std::string socket_path = kDefaultSocketPath;
  std::string stream;  // required
  std::string auth_token;
  // Added to a put's own wait for room, for the call as a whole.
  absl::Duration call_timeout = absl::Seconds(60);
};

// One sample: its tokens and, per field Put names, that field's bytes
// (tokens × the field's row: inner_shape elements of its dtype).
struct ProducerSample {
  int64_t group = 0;
  int64_t tag = 0;
  absl::Span<const int64_t> tokens;
  std::vector<absl::Span<const char>> fields;
};

// What the daemon holds after a put.
struct PutResult {
  uint64_t samples_held = 0;  // in the step, this put's included
  uint64_t bytes_held = 0;    // by the stream
};

// What a sealed step holds.
struct SealResult {
  uint64_t samples = 0;
  uint64_t groups = 0;
  // With peer daemons: those that had not taken the step within the
  // daemon's seal wait. The step is sealed; the daemon goes on forwarding it.
  std::vector<std::string> peers_behind;
};

// An ingest stream as the daemon reports it (Producer::Status).
struct IngestStreamStatus {
  struct Step {
    int64_t step = 0;
    bool sealed = false;
    uint64_t samples = 0;
    uint64_t bytes = 0;                    // held for this step
    std::vector<std::string> consumed_by;  // the consumer jobs done with it
  };
  struct Consumer {
    std::string job;
    int64_t consumed_before = 0;  // every local rank consumed all steps before it
    uint64_t bytes_pending = 0;   // held steps this job has still to consume
  };
  std::string name;
  uint64_t bytes_held = 0;
  uint64_t peak_bytes_held = 0;
  uint64_t budget_bytes = 0;  // 0 = unbounded
  uint64_t samples_put = 0;
  uint64_t bytes_put = 0;
  uint64_t puts_waited = 0;       // puts that waited for room
  uint64_t puts_refused = 0;      // refused for room after their wait
  uint64_t puts_in_one_call = 0;  // the rest took two calls (the first, ...)
  std::vector<Step> steps;
  std::vector<Consumer> consumers;
};

class Producer {
 public:
  // InvalidArgument without a stream or with a socket path longer than a
  // Unix socket allows (107 bytes). The daemon is first called by Put, Seal
  // or Status.
  static absl::StatusOr<std::unique_ptr<Producer>> Create(const ProducerOptions& options);
  ~Producer();

  // Adds `samples` to step `step` (not sealed yet). `fields`: the names of
  // each sample's fields, in order; every field of the stream. When the
  // stream's memory budget is full, waits up to `wait` for consumers to
  // free a step, then ResourceExhausted. The daemon's refusals (unknown
  // field, a length that disagrees with the tokens, a sample no rank can
  // hold, a sealed step, a group in another step, a wrong token) as it
  // words them; nothing of a refused put is kept.
  absl::StatusOr<PutResult> Put(int64_t step, absl::Span<const std::string> fields,
                                absl::Span<const ProducerSample> samples,
                                absl::Duration wait = absl::ZeroDuration());
  // Closes step `step`: the consumer jobs plan and serve it. AlreadyExists
  // when it was sealed before.
  absl::StatusOr<SealResult> Seal(int64_t step);
  // What the stream holds and how far each consumer got.
  absl::StatusOr<IngestStreamStatus> Status();
  // The staging arena's size (twice the stream's budget; 0 before the
  // first put). Only what puts write takes memory.
  uint64_t arena_bytes() const;
  // How far into the arena puts have written (the end of the furthest
  // span so far). The kernel zeroes each page at its first write, which on
  // the development VM made a put's copy 3-4 times slower: a put beyond
  // this mark pays that once, one within it does not.
  uint64_t arena_bytes_written() const;

 private:
  class Impl;
  explicit Producer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace packfeed::client

#endif  // PACKFEED_CLIENT_PRODUCER_H_
