// IngestStream's bookkeeping without a daemon: serving order, the budget,
// steps freed only when every consumer job is past them, and the checks a
// put and a seal must pass. The gRPC and UCX halves run in
// tests/python/ingest_test.py.
#include "server/ingest/ingest_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

namespace packfeed::server {
namespace {

using ::testing::HasSubstr;

// One float field per token: 4 bytes a row.
SideFieldInfo LogProbs() {
  SideFieldInfo field;
  field.name = "logprobs";
  field.type = transport::ElementType::kFloat32;
  field.element_bytes = 4;
  return field;
}

IngestConsumer Job(const std::string& name, int64_t max_samples = 64) {
  IngestConsumer consumer;
  consumer.job = name;
  consumer.max_samples = max_samples;
  consumer.rules.seq_length = 1024;
  consumer.planner.max_tokens_per_rank = 1024;
  return consumer;
}

// A sample of `tokens` tokens (each equal to `group`) and its field.
IngestedSample Sample(int64_t group, int64_t tokens, int64_t tag = 0) {
  IngestedSample sample;
  sample.group = group;
  sample.tag = tag;
  sample.num_tokens = tokens;
  sample.data_bytes = static_cast<uint64_t>(tokens) * (sizeof(int64_t) + 4);
  auto data = std::make_shared<char[]>(sample.data_bytes);
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(data.get() + t * sizeof(int64_t), &group, sizeof(group));
  }
  sample.data = std::move(data);
  sample.field_offsets = {static_cast<uint64_t>(tokens) * sizeof(int64_t)};
  return sample;
}

// Reserves and commits `samples` into `step`, as the transfer thread does.
absl::Status Put(IngestStream& stream, int64_t step, std::vector<IngestedSample> samples) {
  uint64_t bytes = 0;
  for (const IngestedSample& sample : samples) bytes += sample.bytes();
  if (absl::Status room = stream.Reserve(bytes); !room.ok()) return room;
  return stream.Commit(step, std::move(samples), bytes).status();
}

// A put of `tokens` tokens with `field_bytes` of logprobs.
IngestPut Describe(int64_t step, uint64_t tokens, uint64_t field_bytes) {
  IngestPut put;
  put.step = step;
  put.fields = {"logprobs"};
  put.samples.push_back({.group = 1,
                         .tag = 0,
                         .offset = 0,
                         .tokens = tokens,
                         .field_offsets = {tokens * sizeof(int64_t)},
                         .field_bytes = {field_bytes}});
  put.region.length = tokens * sizeof(int64_t) + field_bytes;
  return put;
}

std::vector<int64_t> GroupsOf(const SealedStep& step) {
  std::vector<int64_t> groups;
  for (const IngestedSample& sample : step.samples) groups.push_back(sample.group);
  return groups;
}

TEST(IngestStreamTest, ServesByGroupWhateverOrderThePutsArrivedIn) {
  IngestStream a("s", "", {LogProbs()}, 0);
  IngestStream b("s", "", {LogProbs()}, 0);
  a.AddConsumer(Job("actor"), [] {});
  b.AddConsumer(Job("actor"), [] {});
  ASSERT_TRUE(Put(a, 0, {Sample(7, 10, 1), Sample(3, 20)}).ok());
  ASSERT_TRUE(Put(a, 0, {Sample(7, 30, 2), Sample(5, 40)}).ok());
  ASSERT_TRUE(Put(b, 0, {Sample(5, 40)}).ok());
  ASSERT_TRUE(Put(b, 0, {Sample(7, 10, 1), Sample(3, 20), Sample(7, 30, 2)}).ok());
  absl::StatusOr<SealOutcome> sealed = a.Seal(0);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(sealed->samples, 4u);
  EXPECT_EQ(sealed->groups, 3u);
  ASSERT_TRUE(b.Seal(0).ok());
  auto first = a.Sealed(0);
  auto second = b.Sealed(0);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(GroupsOf(**first), (std::vector<int64_t>{3, 5, 7, 7}));
  EXPECT_EQ(GroupsOf(**second), GroupsOf(**first));
  // Within a group, as put: tag 1 before tag 2.
  EXPECT_EQ((*first)->samples[2].tag, 1);
  EXPECT_EQ((*first)->samples[3].tag, 2);
  EXPECT_EQ((*first)->samples[3].tokens()[0], 7);
}

TEST(IngestStreamTest, AStepIsFreedOnlyWhenEveryConsumerJobIsPastIt) {
  IngestStream stream("s", "", {LogProbs()}, 0);
  int freed = 0;
  stream.AddConsumer(Job("actor"), [] {});
  stream.AddConsumer(Job("reference"), [] {});
  stream.SetOnFree([&] { ++freed; });
  ASSERT_TRUE(Put(stream, 0, {Sample(1, 100)}).ok());
  ASSERT_TRUE(stream.Seal(0).ok());
  const uint64_t bytes = Sample(1, 100).bytes();
  EXPECT_EQ(stream.Stats().bytes_held, bytes);

  stream.Consumed("actor", 1);
  EXPECT_EQ(freed, 0);
  EXPECT_TRUE(stream.Sealed(0).ok()) << "the reference job has not read it";
  stream.Consumed("reference", 1);
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(stream.Stats().bytes_held, 0u);
  EXPECT_EQ(stream.Sealed(0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stream.Sealed(1).status().code(), absl::StatusCode::kUnavailable);
  // A consumed step takes no more puts and no seal.
  EXPECT_EQ(Put(stream, 0, {Sample(9, 10)}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stream.Seal(0).status().code(), absl::StatusCode::kFailedPrecondition);
  // Its group ids are free again.
  EXPECT_TRUE(Put(stream, 1, {Sample(1, 10)}).ok());
}

TEST(IngestStreamTest, APinnedStepOutlivesItsConsumersUntilUnpinned) {
  // The origin of a forwarded step: its peers may still be getting its bytes.
  IngestStream stream("s", "", {LogProbs()}, 0);
  int freed = 0;
  stream.AddConsumer(Job("actor"), [] {});
  stream.SetOnFree([&] { ++freed; });
  ASSERT_TRUE(Put(stream, 0, {Sample(1, 100)}).ok());
  EXPECT_FALSE(stream.SealedOrConsumed(0));
  ASSERT_TRUE(stream.Seal(0, /*pinned=*/true).ok());
  EXPECT_TRUE(stream.SealedOrConsumed(0));
  stream.Consumed("actor", 1);
  EXPECT_EQ(freed, 0);
  EXPECT_EQ(stream.Stats().bytes_held, Sample(1, 100).bytes());
  EXPECT_TRUE(stream.Sealed(0).ok());
  stream.Unpin(0);
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(stream.Stats().bytes_held, 0u);
  EXPECT_TRUE(stream.SealedOrConsumed(0)) << "consumed";
  EXPECT_FALSE(stream.Pin(0)) << "freed";
  EXPECT_FALSE(stream.Pin(1)) << "never put";
  ASSERT_TRUE(Put(stream, 1, {Sample(2, 10)}).ok());
  EXPECT_FALSE(stream.Pin(1)) << "not sealed";
  ASSERT_TRUE(stream.Seal(1).ok());
  EXPECT_TRUE(stream.Pin(1));
  EXPECT_TRUE(stream.Pin(1)) << "two forwards at once";
  stream.Consumed("actor", 2);
  EXPECT_TRUE(stream.Sealed(1).ok()) << "pinned again";
  stream.Unpin(1);
  EXPECT_TRUE(stream.Sealed(1).ok()) << "one forward still under way";
  stream.Unpin(1);
  EXPECT_EQ(stream.Sealed(1).status().code(), absl::StatusCode::kNotFound);
}

TEST(IngestStreamTest, LocalSamplesAreTheUnionOverConsumerJobs) {
  IngestStream stream("s", "", {LogProbs()}, 0);
  IngestConsumer actor = Job("actor");
  actor.local_samples = [](std::shared_ptr<const SealedStep>) {
    return absl::StatusOr<std::vector<int64_t>>(std::vector<int64_t>{0, 3});
  };
  IngestConsumer reference = Job("reference");
  reference.local_samples = [](std::shared_ptr<const SealedStep> step) {
    EXPECT_EQ(step->samples.size(), 5u);
    return absl::StatusOr<std::vector<int64_t>>(std::vector<int64_t>{3, 4});
  };
  stream.AddConsumer(actor, [] {});
  stream.AddConsumer(reference, [] {});
  auto step = std::make_shared<SealedStep>();
  for (int64_t group = 0; group < 5; ++group) step->samples.push_back(Sample(group, 10));
  absl::StatusOr<std::vector<bool>> local = stream.LocalSamples(step);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, (std::vector<bool>{true, false, false, true, true}));

  IngestConsumer failing = Job("critic");
  failing.local_samples = [](std::shared_ptr<const SealedStep>) {
    return absl::StatusOr<std::vector<int64_t>>(absl::InvalidArgumentError("cannot plan"));
  };
  stream.AddConsumer(failing, [] {});
  EXPECT_THAT(stream.LocalSamples(step).status().message(), HasSubstr("cannot plan"));
}

TEST(IngestStreamTest, TheBudgetCountsHeldAndReservedBytes) {
  const uint64_t one = Sample(1, 100).bytes();
  IngestStream stream("s", "", {LogProbs()}, 2 * one);
  stream.AddConsumer(Job("actor"), [] {});
  ASSERT_TRUE(Put(stream, 0, {Sample(1, 100)}).ok());
  ASSERT_TRUE(stream.Reserve(one).ok());  // a put in flight
  EXPECT_EQ(stream.Reserve(1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(stream.Reserve(2 * one + 1).code(), absl::StatusCode::kResourceExhausted);
  stream.Unreserve(one);  // that put failed: its room is back
  ASSERT_TRUE(Put(stream, 0, {Sample(2, 100)}).ok());
  EXPECT_EQ(stream.Stats().peak_bytes_held, 2 * one);
  ASSERT_TRUE(stream.Seal(0).ok());
  stream.Consumed("actor", 1);
  EXPECT_TRUE(stream.Reserve(2 * one).ok());
}

TEST(IngestStreamTest, AFailedCommitReleasesItsReservation) {
  const uint64_t one = Sample(1, 100).bytes();
  IngestStream stream("s", "", {LogProbs()}, one);
  stream.AddConsumer(Job("actor"), [] {});
  ASSERT_TRUE(Put(stream, 0, {Sample(1, 50)}).ok());
  ASSERT_TRUE(stream.Seal(0).ok());
  stream.Consumed("actor", 1);
  ASSERT_TRUE(Put(stream, 1, {Sample(4, 50)}).ok());
  // Group 4 is in step 1: a put of it into step 2 fails after its transfer.
  const uint64_t bytes = Sample(4, 50).bytes();
  ASSERT_TRUE(stream.Reserve(bytes).ok());
  absl::StatusOr<PutOutcome> reply = stream.Commit(2, {Sample(4, 50)}, bytes);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("group 4 is in step 1"));
  EXPECT_EQ(stream.Stats().bytes_held, bytes);
  EXPECT_TRUE(stream.Reserve(one - bytes).ok()) << "the failed put's room was not returned";
}

TEST(IngestStreamTest, SealsOnceAndNeverAnEmptyStep) {
  IngestStream stream("s", "", {LogProbs()}, 0);
  stream.AddConsumer(Job("actor"), [] {});
  EXPECT_EQ(stream.Seal(0).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Put(stream, 0, {Sample(1, 10)}).ok());
  ASSERT_TRUE(stream.Seal(0).ok());
  EXPECT_EQ(stream.Seal(0).status().code(), absl::StatusCode::kAlreadyExists);
  absl::Status late = Put(stream, 0, {Sample(2, 10)});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.message()), HasSubstr("sealed already"));
}

TEST(IngestStreamTest, SealWakesEveryConsumer) {
  IngestStream stream("s", "", {LogProbs()}, 0);
  int woken = 0;
  stream.AddConsumer(Job("actor"), [&] { ++woken; });
  stream.AddConsumer(Job("critic"), [&] { ++woken; });
  ASSERT_TRUE(Put(stream, 3, {Sample(1, 10)}).ok());
  EXPECT_EQ(woken, 0);
  ASSERT_TRUE(stream.Seal(3).ok());
  EXPECT_EQ(woken, 2);
}

TEST(IngestStreamTest, ChecksTheTokenAndEachPutDescription) {
  IngestStream stream("s", "secret", {LogProbs()}, 0);
  stream.AddConsumer(Job("actor", /*max_samples=*/1), [] {});
  EXPECT_TRUE(stream.CheckToken("secret").ok());
  EXPECT_EQ(stream.CheckToken("").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(stream.CheckToken("guess").code(), absl::StatusCode::kPermissionDenied);

  absl::StatusOr<uint64_t> good = stream.CheckPut(Describe(0, 10, 40));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, 10u * 8 + 40);

  auto error_of = [&](const IngestPut& put) {
    absl::StatusOr<uint64_t> checked = stream.CheckPut(put);
    EXPECT_FALSE(checked.ok());
    return std::string(checked.status().message());
  };
  EXPECT_THAT(error_of(Describe(0, 10, 36)), HasSubstr("'logprobs' has 36 bytes"));
  EXPECT_THAT(error_of(Describe(0, 1, 4)), HasSubstr("at least 2"));
  EXPECT_THAT(error_of(Describe(-1, 10, 40)), HasSubstr("negative step"));
  EXPECT_THAT(error_of(Describe(0, 2000, 8000)), HasSubstr("no rank of job actor"));
  IngestPut unknown = Describe(0, 10, 40);
  unknown.fields.push_back("values");
  EXPECT_THAT(error_of(unknown), HasSubstr("unknown field 'values'"));
  IngestPut missing = Describe(0, 10, 40);
  missing.fields.clear();
  EXPECT_THAT(error_of(missing), HasSubstr("'logprobs' is missing"));
  IngestPut outside = Describe(0, 10, 40);
  outside.region.length = 60;
  EXPECT_THAT(error_of(outside), HasSubstr("outside the put's region"));
  IngestPut too_many = Describe(0, 10, 40);
  too_many.samples.push_back(too_many.samples[0]);
  EXPECT_THAT(error_of(too_many), HasSubstr("global_batch of 1"));
}

}  // namespace
}  // namespace packfeed::server
