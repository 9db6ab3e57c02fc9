#include "server/control/ingest_messages.h"

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace packfeed::server {
namespace {

using ::testing::ElementsAre;

template <typename Message>
Message Parse(const char* text) {
  Message message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

TEST(IngestMessagesTest, AReservedPutKeepsEveryField) {
  const ArenaPut put = ArenaPutOf(Parse<v1::ReserveRequest>(R"pb(
    put {
      stream: "rollouts"
      auth_token: "t"
      step: 7
      fields: [ "logprobs", "values" ]
      samples {
        group: 3
        tag: 9
        offset: 64
        tokens: 5
        field_offsets: [ 104, 124 ]
        field_bytes: [ 20, 10 ]
      }
      region { worker_address: "w" remote_key: "k" address: 4096 length: 200 }
      timeout_ms: 1500
    }
    arena_token: "a"
    arena: 2
    written_at: 512
  )pb"));
  EXPECT_EQ(put.arena_token, "a");
  EXPECT_EQ(put.arena, 2u);
  EXPECT_EQ(put.written_at, 512u);
  EXPECT_EQ(put.put.stream, "rollouts");
  EXPECT_EQ(put.put.step, 7);
  EXPECT_THAT(put.put.fields, ElementsAre("logprobs", "values"));
  ASSERT_EQ(put.put.samples.size(), 1u);
  const PutSample& sample = put.put.samples[0];
  EXPECT_EQ(sample.group, 3);
  EXPECT_EQ(sample.tag, 9);
  EXPECT_EQ(sample.offset, 64u);
  EXPECT_EQ(sample.tokens, 5u);
  EXPECT_THAT(sample.field_offsets, ElementsAre(104u, 124u));
  EXPECT_THAT(sample.field_bytes, ElementsAre(20u, 10u));
  EXPECT_EQ(put.put.region.worker_address, "w");
  EXPECT_EQ(put.put.region.remote_key, "k");
  EXPECT_EQ(put.put.region.address, 4096u);
  EXPECT_EQ(put.put.region.length, 200u);
  EXPECT_EQ(put.put.timeout_ms, 1500u);
}

TEST(IngestMessagesTest, ACommitAndAForwardedStepKeepEveryField) {
  const LeaseCommit commit =
      LeaseCommitOf(Parse<v1::CommitRequest>(R"pb(stream: "s" arena: 4 lease: 11)pb"));
  EXPECT_EQ(commit.stream, "s");
  EXPECT_EQ(commit.arena, 4u);
  EXPECT_EQ(commit.lease, 11u);
  const ForwardedStep step = ForwardedStepOf(Parse<v1::ForwardStepRequest>(R"pb(
    stream: "s"
    step: 5
    puts {
      step: 5
      samples { tokens: 3 }
    }
    puts { step: 5 }
  )pb"));
  EXPECT_EQ(step.stream, "s");
  EXPECT_EQ(step.step, 5);
  ASSERT_EQ(step.puts.size(), 2u);
  ASSERT_EQ(step.puts[0].samples.size(), 1u);
  EXPECT_EQ(step.puts[0].samples[0].tokens, 3u);
}

TEST(IngestMessagesTest, AnswersBecomeTheirMessages) {
  const v1::ReserveReply reserved = ReserveReplyOf({2, 8, 1024});
  EXPECT_EQ(reserved.arena(), 2u);
  EXPECT_EQ(reserved.lease(), 8u);
  EXPECT_EQ(reserved.offset(), 1024u);
  const v1::PutReply held = PutReplyOf({12, 4096, {{0, 64}, {256, 128}}});
  EXPECT_EQ(held.samples_held(), 12u);
  EXPECT_EQ(held.bytes_held(), 4096u);
  ASSERT_EQ(held.free_spans_size(), 2);
  EXPECT_EQ(held.free_spans(1).offset(), 256u);
  EXPECT_EQ(held.free_spans(1).length(), 128u);
  const v1::ForwardStepReply fetched = ForwardStepReplyOf({16, 9, 777, true});
  EXPECT_EQ(fetched.samples(), 16u);
  EXPECT_EQ(fetched.samples_fetched(), 9u);
  EXPECT_EQ(fetched.bytes_fetched(), 777u);
  EXPECT_TRUE(fetched.held_already());
}

}  // namespace
}  // namespace packfeed::server
