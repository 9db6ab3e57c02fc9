#ifndef PACKFEED_SERVER_INGEST_INGEST_REQUESTS_H_
#define PACKFEED_SERVER_INGEST_INGEST_REQUESTS_H_

// What a driver's put and a peer's forwarded step ask of the ingest server
// (ingest_server.h), and its answers, in plain values: the Ingest and Admin
// services' messages (docs/PROTOCOLS.md, Ingest) as server/control
// (ingest_messages.h) hands them over. Tokens are checked there, before.

#include <cstdint>
#include <string>
#include <vector>

namespace packfeed::server {

// Registered memory of the daemon that holds a put's bytes.
struct PutRegion {
  std::string worker_address;  // the UCX worker of that daemon
  std::string remote_key;      // packed key of the region
  uint64_t address = 0;        // the region's base, in that daemon
  uint64_t length = 0;         // the bytes the put takes
};

struct PutSample {
  int64_t group = 0;
  int64_t tag = 0;
  uint64_t offset = 0;  // of its tokens (int64, little-endian) in the region
  uint64_t tokens = 0;
  // Per field of the put, in its order: where the field's bytes lie.
  std::vector<uint64_t> field_offsets;
  std::vector<uint64_t> field_bytes;
};

// A put's samples for one step of one stream.
struct IngestPut {
  std::string stream;
  int64_t step = 0;
  std::vector<std::string> fields;  // the stream's fields the samples carry
  std::vector<PutSample> samples;
  PutRegion region;
  uint32_t timeout_ms = 0;  // to wait for room
};

// A driver's put and where in its staging arena it goes.
struct ArenaPut {
  IngestPut put;
  std::string arena_token;  // a new arena, shared through SOCKET.rings
  uint64_t arena = 0;       // or the producer's arena
  uint64_t written_at = 0;  // a put in one call: its region's offset in the arena
};

// Where a reserved put is to be written.
struct Reservation {
  uint64_t arena = 0;
  uint64_t lease = 0;  // what the commit names
  uint64_t offset = 0;
};

// A reserved put, written, named to join its step.
struct LeaseCommit {
  std::string stream;
  uint64_t arena = 0;
  uint64_t lease = 0;
};

struct ArenaFreeSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A put that joined its step.
struct PutHeld {
  uint64_t samples_held = 0;  // in the step, this put's included
  uint64_t bytes_held = 0;    // by the stream
  // The producer's arena's free spans, where a put in one call may go.
  std::vector<ArenaFreeSpan> free_spans;
};

// A step sealed on a peer daemon, its puts' bytes in that daemon's memory.
struct ForwardedStep {
  std::string stream;
  int64_t step = 0;
  std::vector<IngestPut> puts;
};

struct ForwardFetched {
  uint64_t samples = 0;          // in the step
  uint64_t samples_fetched = 0;  // whose bytes this node's ranks need
  uint64_t bytes_fetched = 0;
  bool held_already = false;  // the step was sealed or consumed here before
};

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_INGEST_INGEST_REQUESTS_H_
