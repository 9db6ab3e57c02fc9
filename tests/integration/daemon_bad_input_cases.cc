// The bad requests of EveryBadRequestIsRefusedByNameAndAGoodRankIsServedExactly,
// each spoiled from a good one, with the status and message it must get.

#include "daemon_bad_input_fixture.h"

namespace packfeed::bad_input {

std::vector<BadRequest> DaemonBadInputTest::AttachCases(const WouldBeRank& rank) {
  auto attach = [rank](std::function<void(v1::AttachRequest&)> spoil,
                       v1::Control::Stub* control = control_) {
    return [rank, spoil, control] {
      v1::AttachRequest request;
      request.set_job("job");
      request.set_global_rank(1);
      request.set_auth_token(kToken);
      request.set_fingerprint(rank.fingerprint);
      request.set_worker_address(rank.worker_address);
      request.mutable_ring()->set_slots(2);
      request.mutable_ring()->set_slot_bytes(4 << 20);
      request.mutable_ring()->set_ring_descriptor(rank.ring_descriptor);
      spoil(request);
      v1::AttachReply reply;
      grpc::ClientContext context;
      return control->Attach(&context, request, &reply);
    };
  };
  std::string other_topology = rank.fingerprint;
  other_topology.replace(other_topology.find("-t") + 2, 8, "00000000");

  using grpc::StatusCode;
  return {
      {"unknown job", attach([](auto& r) { r.set_job("nope"); }), StatusCode::NOT_FOUND,
       "no job 'nope'"},
      {"wrong token", attach([](auto& r) { r.set_auth_token("guess"); }),
       StatusCode::PERMISSION_DENIED, "wrong auth token"},
      {"no token", attach([](auto& r) { r.clear_auth_token(); }), StatusCode::PERMISSION_DENIED,
       "wrong auth token"},
      {"rank outside the world", attach([](auto& r) { r.set_global_rank(99); }),
       StatusCode::OUT_OF_RANGE, "outside job job's world of 4"},
      {"rank of another node", attach([](auto& r) { r.set_global_rank(3); }),
       StatusCode::FAILED_PRECONDITION, "not hosted by this daemon"},
      {"fingerprint of another topology",
       attach([other_topology](auto& r) { r.set_fingerprint(other_topology); }),
       StatusCode::FAILED_PRECONDITION, "topology differ"},
      {"not a fingerprint", attach([](auto& r) { r.set_fingerprint("pf1-garbage"); }),
       StatusCode::INVALID_ARGUMENT, "not a packfeed job fingerprint"},
      {"no ring descriptor", attach([](auto& r) { r.mutable_ring()->clear_ring_descriptor(); }),
       StatusCode::INVALID_ARGUMENT, "ring descriptor"},
      {"garbage ring descriptor",
       attach([](auto& r) { r.mutable_ring()->set_ring_descriptor(std::string(40, '\x7f')); }),
       StatusCode::INVALID_ARGUMENT, "ring descriptor"},
      {"ring slots too small", attach([small = rank.small_ring_descriptor](auto& r) {
         r.mutable_ring()->set_ring_descriptor(small);
       }),
       StatusCode::INVALID_ARGUMENT, "are needed"},
      {"negative start step", attach([](auto& r) { r.set_start_step(-3); }),
       StatusCode::INVALID_ARGUMENT, "start step -3 < 0"},
      {"start microbatch beyond its step", attach([](auto& r) { r.set_start_microbatch(999); }),
       StatusCode::INVALID_ARGUMENT, "start microbatch 999 of step 0"},
      {"elastic without a fingerprint", attach([](auto& r) {
         r.set_elastic(true);
         r.clear_fingerprint();
       }),
       StatusCode::INVALID_ARGUMENT, "elastic resume needs the fingerprint"},
      {"elastic inside a step", attach([](auto& r) {
         r.set_elastic(true);
         r.set_start_microbatch(1);
       }),
       StatusCode::INVALID_ARGUMENT, "step boundary"},
      {"rank already attached", attach([](auto& r) { r.set_global_rank(0); }),
       StatusCode::ALREADY_EXISTS, "already attached"},
      {"garbage worker address", attach([](auto& r) { r.set_worker_address("not an address"); }),
       StatusCode::INVALID_ARGUMENT, "worker address"},
      // No descriptor crosses TCP, and no uid proves whose ring a token names.
      {"over TCP: a ring shared by descriptor",
       attach([](auto& r) { r.mutable_ring()->set_shared_ring_token("token"); }, control_over_tcp_),
       StatusCode::PERMISSION_DENIED, "shared memory is handed over only on the Unix socket"},
      {"over TCP: wrong token",
       attach([](auto& r) { r.set_auth_token("guess"); }, control_over_tcp_),
       StatusCode::PERMISSION_DENIED, "wrong auth token"},
  };
}

std::vector<BadRequest> DaemonBadInputTest::QueryCases() {
  auto describe = [](std::string job, std::string token) {
    return [job, token] {
      v1::DescribeRequest request;
      request.set_job(job);
      request.set_auth_token(token);
      v1::DescribeReply reply;
      grpc::ClientContext context;
      return control_->Describe(&context, request, &reply);
    };
  };
  auto detach = [](std::function<void(v1::DetachRequest&)> spoil) {
    return [spoil] {
      v1::DetachRequest request;
      request.set_job("job");
      request.set_global_rank(0);
      request.set_auth_token(kToken);
      request.set_connection_id(12345);
      spoil(request);
      v1::DetachReply reply;
      grpc::ClientContext context;
      return control_->Detach(&context, request, &reply);
    };
  };
  auto report = [](std::function<void(v1::ReportRequest&)> spoil) {
    return [spoil] {
      v1::ReportRequest request;
      request.set_job("job");
      request.set_global_rank(0);
      request.set_connection_id(12345);
      spoil(request);
      v1::ReportReply reply;
      grpc::ClientContext context;
      return control_->Report(&context, request, &reply);
    };
  };
  using grpc::StatusCode;
  return {
      {"detach: unknown job", detach([](auto& r) { r.set_job("nope"); }), StatusCode::NOT_FOUND,
       "no job 'nope'"},
      {"report: more measured microbatches than a report holds", report([](auto& r) {
         for (int i = 0; i < 1025; ++i) r.add_computed()->set_seconds(0.01f);
       }),
       StatusCode::INVALID_ARGUMENT, "1025 measured microbatches, at most 1024 per report"},
      // A detach proves itself by the connection's key, never the job's
      // token alone: another rank's connection cannot be ended with it.
      {"detach: the job's token, no key", detach([](auto& r) { r.set_auth_token(kToken); }),
       StatusCode::PERMISSION_DENIED, "connection 12345 with that key is not the rank's"},
      {"detach: another connection", detach([](auto&) {}), StatusCode::PERMISSION_DENIED,
       "connection 12345 with that key is not the rank's"},
      {"plan: unknown job",
       [] {
         v1::GetPlanRequest request;
         request.set_job("nope");
         v1::GetPlanReply reply;
         grpc::ClientContext context;
         return admin_->GetPlan(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "nope"},
      {"plan: negative step",
       [] {
         v1::GetPlanRequest request;
         request.set_job("job");
         request.set_step(-1);
         v1::GetPlanReply reply;
         grpc::ClientContext context;
         return admin_->GetPlan(&context, request, &reply);
       },
       StatusCode::INVALID_ARGUMENT, "step -1 < 0"},
      {"describe: unknown job", describe("nope", kToken), StatusCode::NOT_FOUND,
       "no job 'nope' on this daemon (jobs: job"},
      {"describe: wrong token", describe("job", "guess"), StatusCode::PERMISSION_DENIED,
       "wrong auth token"},
      {"stats: unknown job",
       [] {
         v1::GetStatsRequest request;
         request.set_job("nope");
         v1::GetStatsReply reply;
         grpc::ClientContext context;
         return admin_->GetStats(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no job 'nope'"},
      {"ledger: unknown job",
       [] {
         v1::GetLedgerRequest request;
         request.set_job("nope");
         v1::GetLedgerReply reply;
         grpc::ClientContext context;
         return admin_->GetLedger(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no job 'nope'"},
  };
}

std::vector<BadRequest> DaemonBadInputTest::IngestCases() {
  // A step forwarded as a peer daemon would, spoiled.
  auto forward = [](std::function<void(v1::ForwardStepRequest&)> spoil) {
    return [spoil] {
      v1::ForwardStepRequest request;
      request.set_stream("rollouts");
      request.set_step(0);
      v1::PutRequest* put = request.add_puts();
      put->set_stream("rollouts");
      put->set_auth_token("driver-secret");
      put->set_step(0);
      put->add_fields("logprobs");
      put->mutable_region()->set_length(1 << 20);
      v1::IngestSample* sample = put->add_samples();
      sample->set_tokens(10);
      sample->set_offset(0);
      sample->add_field_offsets(80);
      sample->add_field_bytes(40);
      spoil(request);
      v1::ForwardStepReply reply;
      grpc::ClientContext context;
      return admin_->ForwardStep(&context, request, &reply);
    };
  };
  using grpc::StatusCode;
  return {
      {"forward: unknown stream", forward([](auto& r) { r.set_stream("nope"); }),
       StatusCode::NOT_FOUND, "no ingest stream 'nope'"},
      {"forward: wrong stream token",
       forward([](auto& r) { r.mutable_puts(0)->set_auth_token("guess"); }),
       StatusCode::PERMISSION_DENIED, "auth token"},
      {"forward: a put of another step", forward([](auto& r) { r.mutable_puts(0)->set_step(3); }),
       StatusCode::INVALID_ARGUMENT, "forwarded step 0 of stream rollouts: a put of another step"},
      {"forward: a field shorter than its tokens",
       forward([](auto& r) { r.mutable_puts(0)->mutable_samples(0)->set_field_bytes(0, 36); }),
       StatusCode::INVALID_ARGUMENT, "field 'logprobs' has 36 bytes"},
      {"reserve: an arena never shared",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena(999);
         v1::ReserveReply reply;
         grpc::ClientContext context;
         return ingest_->Reserve(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no staging arena 999"},
      {"reserve: an arena token never given",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena_token("nope");
         v1::ReserveReply reply;
         grpc::ClientContext context;
         return ingest_->Reserve(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no ring was shared under that token"},
      {"put: an arena never shared",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena(999);
         v1::PutReply reply;
         grpc::ClientContext context;
         return ingest_->Put(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no staging arena 999"},
      {"put: an arena token in place of its arena",
       [] {
         v1::ReserveRequest request = ReserveOf(10);
         request.set_arena_token("nope");
         v1::PutReply reply;
         grpc::ClientContext context;
         return ingest_->Put(&context, request, &reply);
       },
       StatusCode::INVALID_ARGUMENT, "names its arena, not an arena token"},
      {"commit: a lease never given",
       [] {
         v1::CommitRequest request;
         request.set_stream("small");
         request.set_auth_token("driver-secret");
         request.set_arena(999);
         request.set_lease(1);
         v1::PutReply reply;
         grpc::ClientContext context;
         return ingest_->Commit(&context, request, &reply);
       },
       StatusCode::NOT_FOUND, "no staging arena 999"},
      {"drain: wrong token",
       [] {
         v1::DrainRequest request;
         request.set_auth_token("guess");
         v1::DrainReply reply;
         grpc::ClientContext context;
         return admin_->Drain(&context, request, &reply);
       },
       StatusCode::PERMISSION_DENIED, "auth token"},
  };
}

}  // namespace packfeed::bad_input
