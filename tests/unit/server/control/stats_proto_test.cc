#include "server/control/stats_proto.h"

#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"

namespace packfeed::server {
namespace {

// Every field of `message` and of the messages in its repeated fields holds
// a value other than its default: a field added to the proto and not to the
// conversion fails here.
void ExpectEveryFieldSet(const google::protobuf::Message& message) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> set;
  reflection->ListFields(message, &set);
  EXPECT_EQ(static_cast<int>(set.size()), message.GetDescriptor()->field_count())
      << message.GetTypeName() << ": " << message.DebugString();
  for (const google::protobuf::FieldDescriptor* field : set) {
    if (field->is_repeated() &&
        field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        ExpectEveryFieldSet(reflection->GetRepeatedMessage(message, field, i));
      }
    }
  }
}

TEST(StatsProtoTest, StorageFiguresBecomeStorageStatsFieldForField) {
  StorageFigures figures;
  figures.files.push_back({"/data/a.bin", 2, 100, 3, 90, 10, 100.0 / 90, 1.5, 2.5, 3.5});
  figures.bytes_read = 100;
  figures.distinct_bytes = 90;
  figures.io_amplification = 100.0 / 90;
  figures.bytes_in_flight = 7;
  figures.bytes_held = 8;
  figures.peak_bytes_held = 9;
  figures.memory_budget_bytes = 1 << 20;
  figures.read_threads = 4;
  figures.reread_events = 1;
  figures.rereads.push_back({"actor", 5, 7, "/data/a.bin", 2, 10});
  figures.bytes_kept = 11;

  const v1::StorageStats stats = StorageStatsProto(figures);
  ExpectEveryFieldSet(stats);
  ASSERT_EQ(stats.files_size(), 1);
  EXPECT_EQ(stats.files(0).path(), "/data/a.bin");
  EXPECT_EQ(stats.files(0).jobs(), 2u);
  EXPECT_EQ(stats.files(0).reread_bytes(), 10u);
  EXPECT_EQ(stats.files(0).read_latency_max_ms(), 3.5);
  EXPECT_EQ(stats.memory_budget_bytes(), 1u << 20);
  EXPECT_EQ(stats.read_threads(), 4u);
  ASSERT_EQ(stats.rereads_size(), 1);
  EXPECT_EQ(stats.rereads(0).job(), "actor");
  EXPECT_EQ(stats.rereads(0).rank(), 5u);
  EXPECT_EQ(stats.rereads(0).step(), 7);
  EXPECT_EQ(stats.rereads(0).bytes(), 10u);
  EXPECT_EQ(stats.bytes_kept(), 11u);
}

TEST(StatsProtoTest, LedgerSnapshotBecomesJobLedgerFieldForField) {
  LedgerSnapshot snapshot;
  snapshot.name = "pretrain";
  snapshot.journal = "/var/lib/packfeed/pretrain.ledger";
  snapshot.ranks.push_back({3, 5, 7, 1, 9, 12, 1, 2, 1, 4, {{1, 2, 12, 0xfeedULL}}});

  const v1::JobLedger ledger = JobLedgerProto(snapshot);
  ExpectEveryFieldSet(ledger);
  ASSERT_EQ(ledger.ranks_size(), 1);
  const v1::RankLedger& rank = ledger.ranks(0);
  EXPECT_EQ(rank.global_rank(), 3u);
  EXPECT_EQ(rank.first_step(), 5);
  EXPECT_EQ(rank.next_step(), 7);
  EXPECT_EQ(rank.next_microbatch(), 1u);
  EXPECT_EQ(rank.gaps(), 2u);
  EXPECT_EQ(rank.claimed(), 4u);
  ASSERT_EQ(rank.epochs_size(), 1);
  EXPECT_EQ(rank.epochs(0).dataset(), 1u);
  EXPECT_EQ(rank.epochs(0).epoch(), 2);
  EXPECT_EQ(rank.epochs(0).digest(), 0xfeedULL);
}

TEST(StatsProtoTest, JobFiguresBecomeJobStatsFieldForField) {
  JobFigures figures;
  figures.name = "pretrain";
  figures.steps_planned = 12;
  figures.steps_served = 10;
  figures.bytes_read = 1000;
  figures.unique_bytes_needed = 800;
  figures.io_amplification = 1.25;
  RankFigures rank;
  rank.global_rank = 3;
  rank.attached = true;
  rank.next_step = 11;
  rank.slots_pushed = 40;
  rank.slots_released = 36;
  rank.bytes_sent = 4096;
  rank.slots_in_flight = 4;
  rank.consumed_step = 9;
  rank.consumed_microbatch = 2;
  rank.times = {1.5, 4.5, 80, 1};
  rank.input_bound = 0.25;
  rank.ring = "shm";
  rank.device_ring_fallback = "GPU 0 is in compute mode exclusive-process";
  figures.ranks.push_back(rank);
  figures.mean_step_over_ideal = 1.02;
  figures.slowest_rank = 3;
  figures.slowest_rank_steps_behind = 1;
  figures.cached_bytes = 512;
  figures.side_rows_bytes = 256;
  figures.peak_side_rows_bytes = 768;
  figures.plan_seconds = 0.5;
  figures.read_seconds = 0.75;
  figures.documents_split = 6;
  figures.samples_truncated = 2;
  figures.tokens_truncated = 300;
  figures.most_waiting_rank = 3;
  figures.input_bound = 0.25;
  figures.wait_seconds = 1.5;

  const v1::JobStats stats = JobStatsProto(figures);
  ExpectEveryFieldSet(stats);
  ASSERT_EQ(stats.ranks_size(), 1);
  EXPECT_EQ(stats.ranks(0).global_rank(), 3u);
  EXPECT_EQ(stats.ranks(0).consumed_microbatch(), 2u);
  EXPECT_EQ(stats.ranks(0).busy_seconds(), 4.5);
  EXPECT_EQ(stats.ranks(0).calls(), 80u);
  EXPECT_EQ(stats.ranks(0).copied_out(), 1u);
  EXPECT_EQ(stats.ranks(0).ring(), "shm");
  EXPECT_EQ(stats.ranks(0).device_ring_fallback(), "GPU 0 is in compute mode exclusive-process");
  EXPECT_EQ(stats.slowest_rank_steps_behind(), 1);
  EXPECT_EQ(stats.tokens_truncated(), 300);
  EXPECT_EQ(stats.wait_seconds(), 1.5);
  EXPECT_EQ(stats.side_rows_bytes(), 256u);
  EXPECT_EQ(stats.peak_side_rows_bytes(), 768u);
}

TEST(StatsProtoTest, RankTimesBecomeTrainerTimes) {
  v1::RankTimes times;
  times.set_wait_seconds(1.5);
  times.set_busy_seconds(4.5);
  times.set_calls(80);
  times.set_copied_out(1);
  ExpectEveryFieldSet(times);
  EXPECT_EQ(TrainerTimesOf(times), (TrainerTimes{1.5, 4.5, 80, 1}));
}

TEST(StatsProtoTest, IngestStreamFiguresBecomeIngestStreamStatsFieldForField) {
  IngestStreamFigures figures;
  figures.name = "rollouts";
  figures.bytes_held = 1;
  figures.peak_bytes_held = 2;
  figures.budget_bytes = 3;
  figures.samples_put = 4;
  figures.bytes_put = 5;
  figures.puts_waited = 6;
  figures.puts_refused = 7;
  figures.puts_in_one_call = 13;
  figures.steps.push_back({8, true, 9, 10, {"actor", "critic"}});
  figures.consumers.push_back({"actor", 11, 12});

  const v1::IngestStreamStats stats = IngestStreamStatsProto(figures);
  ExpectEveryFieldSet(stats);
  EXPECT_EQ(stats.name(), "rollouts");
  EXPECT_EQ(stats.puts_refused(), 7u);
  EXPECT_EQ(stats.puts_in_one_call(), 13u);
  ASSERT_EQ(stats.steps_size(), 1);
  EXPECT_EQ(stats.steps(0).step(), 8);
  EXPECT_EQ(stats.steps(0).bytes(), 10u);
  ASSERT_EQ(stats.steps(0).consumed_by_size(), 2);
  EXPECT_EQ(stats.steps(0).consumed_by(1), "critic");
  ASSERT_EQ(stats.consumers_size(), 1);
  EXPECT_EQ(stats.consumers(0).consumed_before(), 11);
  EXPECT_EQ(stats.consumers(0).bytes_pending(), 12u);
}

}  // namespace
}  // namespace packfeed::server
