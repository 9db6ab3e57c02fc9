#ifndef PACKFEED_SERVER_CONTROL_STATS_PROTO_H_
#define PACKFEED_SERVER_CONTROL_STATS_PROTO_H_

// The libraries below control/ report in plain structs; the admin API's
// messages are made from them here, field for field, and nowhere else.

#include "packfeed/v1/service.pb.h"
#include "server/ingest/ingest_stream.h"
#include "server/pipeline/job_figures.h"
#include "server/storage/ledger.h"
#include "server/storage/storage.h"

namespace packfeed::server {

v1::StorageStats StorageStatsProto(const StorageFigures& figures);
v1::JobLedger JobLedgerProto(const LedgerSnapshot& snapshot);
v1::JobStats JobStatsProto(const JobFigures& figures);
v1::IngestStreamStats IngestStreamStatsProto(const IngestStreamFigures& figures);
// A client's report, the other way.
TrainerTimes TrainerTimesOf(const v1::RankTimes& times);
std::vector<MeasuredMicrobatch> MeasuredOf(
    const google::protobuf::RepeatedPtrField<v1::MicrobatchCompute>& computed);

}  // namespace packfeed::server

#endif  // PACKFEED_SERVER_CONTROL_STATS_PROTO_H_
