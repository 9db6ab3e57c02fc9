#ifndef PACKFEED_SERVER_CONTROL_INGEST_MESSAGES_H_
#define PACKFEED_SERVER_CONTROL_INGEST_MESSAGES_H_

// The Ingest and Admin services' put and forward messages as the ingest
// server takes them (server/ingest/ingest_requests.h), and its answers
// as messages: the one translation, so that server/ingest reads no
// generated message.

#include "packfeed/v1/service.pb.h"
#include "server/ingest/ingest_requests.h"

namespace packfeed::server {

IngestPut IngestPutOf(const v1::PutRequest& put);
ArenaPut ArenaPutOf(const v1::ReserveRequest& request);
LeaseCommit LeaseCommitOf(const v1::CommitRequest& request);
ForwardedStep ForwardedStepOf(const v1::ForwardStepRequest& request);

v1::ReserveReply ReserveReplyOf(const Reservation& reservation);
v1::PutReply PutReplyOf(const PutHeld& held);
v1::ForwardStepReply ForwardStepReplyOf(const ForwardFetched& fetched);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_INGEST_MESSAGES_H_
