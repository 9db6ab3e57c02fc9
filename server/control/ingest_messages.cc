#include "server/control/ingest_messages.h"

namespace packfeed::server {

IngestPut IngestPutOf(const v1::PutRequest& put) {
  IngestPut out;
  out.stream = put.stream();
  out.step = put.step();
  out.fields.assign(put.fields().begin(), put.fields().end());
  out.samples.reserve(static_cast<size_t>(put.samples_size()));
  for (const v1::IngestSample& in : put.samples()) {
    PutSample& sample = out.samples.emplace_back();
    sample.group = in.group();
    sample.tag = in.tag();
    sample.offset = in.offset();
    sample.tokens = in.tokens();
    sample.field_offsets.assign(in.field_offsets().begin(), in.field_offsets().end());
    sample.field_bytes.assign(in.field_bytes().begin(), in.field_bytes().end());
  }
  out.region.worker_address = put.region().worker_address();
  out.region.remote_key = put.region().remote_key();
  out.region.address = put.region().address();
  out.region.length = put.region().length();
  out.timeout_ms = put.timeout_ms();
  return out;
}

ArenaPut ArenaPutOf(const v1::ReserveRequest& request) {
  return {IngestPutOf(request.put()), request.arena_token(), request.arena(), request.written_at()};
}

LeaseCommit LeaseCommitOf(const v1::CommitRequest& request) {
  return {request.stream(), request.arena(), request.lease()};
}

ForwardedStep ForwardedStepOf(const v1::ForwardStepRequest& request) {
  ForwardedStep out;
  out.stream = request.stream();
  out.step = request.step();
  for (const v1::PutRequest& put : request.puts()) out.puts.push_back(IngestPutOf(put));
  return out;
}

v1::ReserveReply ReserveReplyOf(const Reservation& reservation) {
  v1::ReserveReply reply;
  reply.set_arena(reservation.arena);
  reply.set_lease(reservation.lease);
  reply.set_offset(reservation.offset);
  return reply;
}

v1::PutReply PutReplyOf(const PutHeld& held) {
  v1::PutReply reply;
  reply.set_samples_held(held.samples_held);
  reply.set_bytes_held(held.bytes_held);
  for (const ArenaFreeSpan& free : held.free_spans) {
    v1::ArenaFreeSpan* span = reply.add_free_spans();
    span->set_offset(free.offset);
    span->set_length(free.length);
  }
  return reply;
}

v1::ForwardStepReply ForwardStepReplyOf(const ForwardFetched& fetched) {
  v1::ForwardStepReply reply;
  reply.set_samples(fetched.samples);
  reply.set_samples_fetched(fetched.samples_fetched);
  reply.set_bytes_fetched(fetched.bytes_fetched);
  reply.set_held_already(fetched.held_already);
  return reply;
}

}  // namespace packfeed::server
