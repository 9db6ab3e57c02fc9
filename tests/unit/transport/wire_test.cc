#include "packfeed/transport/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packfeed::transport {
namespace {

using ::testing::HasSubstr;

SlotReady SampleReady() {
  SlotReady ready;
  ready.connection_id = 0x1234'0000'0007;
  ready.seq = 9;
  ready.slot = 1;
  ready.step = 41;
  ready.microbatch = 3;
  ready.fields = {{"tokens", ElementType::kInt64, {1, 100}, 0, 800},
                  {"cu_seqlens", ElementType::kInt32, {3}, 1024, 12},
                  {"max_seqlen", ElementType::kInt32, {}, 1280, 4}};
  ready.inline_metadata = "flops";
  return ready;
}

absl::Status DecodeStatus(const std::string& bytes) { return DecodeMessage(bytes).status(); }

// Slots 0 and 65 of a 70-slot ring free.
Credit SampleCredit() {
  Credit credit{7, 12, 10, 9, {}};
  credit.set_free(0);
  credit.set_free(65);
  credit.key = NewConnectionKey();  // travels with every credit
  return credit;
}

// Keys come from a CSPRNG (two draws differ), compare in constant time, and
// cross a proto's bytes field only at their size.
TEST(WireTest, ConnectionKeysAreRandomAndRoundTripAsBytes) {
  const ConnectionKey a = NewConnectionKey();
  const ConnectionKey b = NewConnectionKey();
  EXPECT_FALSE(SameKey(a, b));
  EXPECT_TRUE(SameKey(a, a));
  absl::StatusOr<ConnectionKey> back = KeyFromBytes(KeyBytes(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameKey(*back, a));
  EXPECT_EQ(KeyFromBytes("short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeyFromBytes("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RoundTripsEveryMessage) {
  for (const Message& message :
       {Message(SampleReady()), Message(SampleCredit()), Message(Goodbye{7, ""}),
        Message(Goodbye{7, "step 3 cannot be served"})}) {
    absl::StatusOr<Message> decoded = DecodeMessage(EncodeMessage(message));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_TRUE(*decoded == message);
  }
  const RingDescriptor ring{4, 1 << 20, 0x7f00'0000'0000, MemoryKind::kCuda, "rkey-bytes"};
  absl::StatusOr<RingDescriptor> decoded = DecodeRingDescriptor(EncodeRingDescriptor(ring));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, ring);
}

// Rings whose memory travels by file descriptor come without a key: a shared
// host ring, and device memory the daemon writes itself (the first GPU run
// of the latter found this refused).
TEST(WireTest, RingsSharedByDescriptorComeWithoutAKey) {
  for (MemoryKind kind : {MemoryKind::kHost, MemoryKind::kCuda}) {
    const RingDescriptor ring{4, 1 << 20, 0x7f00'0000'0000, kind, ""};
    absl::StatusOr<RingDescriptor> decoded = DecodeRingDescriptor(EncodeRingDescriptor(ring));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, ring);
    EXPECT_TRUE(decoded->shared_by_fd());
  }
}

TEST(WireTest, RefusesAnotherVersionByName) {
  std::string bytes = EncodeMessage(SampleCredit());
  const uint16_t version = 7;
  std::memcpy(bytes.data() + 4, &version, 2);
  absl::Status status = DecodeStatus(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("v7"));
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("v", kWireVersion)));
}

TEST(WireTest, ACreditNamesItsFreeSlotsAndKeepsItsCountsInOrder) {
  const Credit credit = SampleCredit();
  for (uint32_t slot = 0; slot < 70; ++slot) {
    EXPECT_EQ(credit.is_free(slot), slot == 0 || slot == 65) << slot;
  }
  EXPECT_FALSE(credit.is_free(200));  // beyond its words
  Credit wrong = credit;
  wrong.released = wrong.taken + 1;  // released more than it took
  EXPECT_THAT(DecodeStatus(EncodeMessage(wrong)).message(), HasSubstr("released <= taken"));
  wrong = credit;
  wrong.taken = wrong.seen + 1;  // took more than it saw
  EXPECT_THAT(DecodeStatus(EncodeMessage(wrong)).message(), HasSubstr("taken <= seen"));
  wrong = credit;
  wrong.free_slots.resize(kMaxSlots / 64 + 1);
  EXPECT_THAT(DecodeStatus(EncodeMessage(wrong)).message(), HasSubstr("words of free slots"));
  const std::string bytes = EncodeMessage(credit);
  for (size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_EQ(DecodeStatus(bytes.substr(0, length)).code(), absl::StatusCode::kInvalidArgument)
        << "prefix of " << length << " bytes";
  }
}

TEST(WireTest, RefusesEveryTruncationAndTrailingBytes) {
  const std::string bytes = EncodeMessage(SampleReady());
  for (size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_EQ(DecodeStatus(bytes.substr(0, length)).code(), absl::StatusCode::kInvalidArgument)
        << "prefix of " << length << " bytes";
  }
  EXPECT_EQ(DecodeStatus(bytes + "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, AGoodbyeReasonIsWholeOrAbsent) {
  const std::string bytes = EncodeMessage(Goodbye{1, "why"});
  for (size_t length = 24; length < bytes.size(); ++length) {  // cut inside the reason
    EXPECT_EQ(DecodeStatus(bytes.substr(0, length)).code(), absl::StatusCode::kInvalidArgument)
        << length;
  }
  // A present but empty reason would not encode back to the same bytes.
  std::string empty = EncodeMessage(Goodbye{1, ""}) + std::string(4, '\0');
  const uint64_t body = 4;
  std::memcpy(empty.data() + 16, &body, 8);  // the header's body length
  EXPECT_FALSE(DecodeMessage(empty).ok());
}

TEST(WireTest, RefusesWrongMagicKindAndCounts) {
  std::string bytes = EncodeMessage(Goodbye{1, ""});
  bytes[0] = 'X';
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("not a packfeed message"));

  bytes = EncodeMessage(Goodbye{1, ""});
  bytes[6] = 42;  // kind
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("unknown message kind 42"));

  SlotReady ready = SampleReady();
  ready.fields[0].bytes = 801;  // does not match the shape
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("800"));

  ready = SampleReady();
  ready.fields[0].type = static_cast<ElementType>(99);
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("element type 99"));

  ready = SampleReady();
  ready.fields[0].shape = {1, 2, 3, 4, 5};
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("5 dimensions"));

  ready = SampleReady();
  ready.fields[0].shape = {-1};
  ready.fields[0].bytes = 0;
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("negative"));

  ready = SampleReady();
  ready.fields[0].name = "with space";
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("non-printable"));

  ready = SampleReady();
  ready.fields.resize(kMaxFields + 1, ready.fields[2]);
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("33 fields"));

  ready = SampleReady();
  ready.inline_metadata.assign(kMaxInlineBytes + 1, 'm');
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("inline metadata"));

  ready = SampleReady();
  ready.fields[0].offset = UINT64_MAX - 10;
  EXPECT_THAT(DecodeStatus(EncodeMessage(ready)).message(), HasSubstr("overflows"));
}

TEST(WireTest, ValidatesAgainstTheRing) {
  const SlotReady ready = SampleReady();  // seq 9, slot 1
  EXPECT_TRUE(ValidateSlotReady(ready, 2, 4096, 9).ok());
  EXPECT_THAT(ValidateSlotReady(ready, 2, 4096, 8).message(), HasSubstr("expected message 8"));
  // Slots are reused in any order: message 9 may fill any slot in range.
  EXPECT_TRUE(ValidateSlotReady(ready, 3, 4096, 9).ok());
  EXPECT_THAT(ValidateSlotReady(ready, 1, 4096, 9).message(), HasSubstr("slot 1"));
  absl::Status outside = ValidateSlotReady(ready, 2, 1030, 9);
  EXPECT_EQ(outside.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(outside.message(), HasSubstr("cu_seqlens"));
  SlotReady overlapping = ready;
  overlapping.fields[1].offset = 512;
  EXPECT_THAT(ValidateSlotReady(overlapping, 2, 4096, 9).message(), HasSubstr("overlap"));
}

TEST(WireTest, RingDescriptorRefusesNonsense) {
  RingDescriptor ring{0, 4096, 0, MemoryKind::kHost, "k"};
  EXPECT_THAT(DecodeRingDescriptor(EncodeRingDescriptor(ring)).status().message(),
              HasSubstr("must be positive"));
  ring = {kMaxSlots + 1, 4096, 0, MemoryKind::kHost, "k"};
  EXPECT_THAT(DecodeRingDescriptor(EncodeRingDescriptor(ring)).status().message(),
              HasSubstr("at most"));
  ring = {2, UINT64_MAX / 2 + 1, 0, MemoryKind::kHost, "k"};
  EXPECT_THAT(DecodeRingDescriptor(EncodeRingDescriptor(ring)).status().message(),
              HasSubstr("overflows"));
  std::string bytes = EncodeRingDescriptor({2, 64, 0, MemoryKind::kHost, "k"});
  bytes[24 + 4 + 8 + 8] = 7;  // memory kind
  EXPECT_THAT(DecodeRingDescriptor(bytes).status().message(), HasSubstr("memory kind 7"));
  // A descriptor belongs to no connection yet: a non-zero connection_id is refused
  // (found by wire_fuzz: it decoded, and encoded back to other bytes).
  bytes = EncodeRingDescriptor({2, 64, 0, MemoryKind::kHost, "k"});
  bytes[8] = 5;  // connection_id
  EXPECT_THAT(DecodeRingDescriptor(bytes).status().message(), HasSubstr("connection id 5"));
  EXPECT_THAT(DecodeRingDescriptor(EncodeMessage(Goodbye{1, ""})).status().message(),
              HasSubstr("expected a ring descriptor"));
  // UCX aborts on a malformed packed key: a corrupt one never reaches it.
  bytes = EncodeRingDescriptor({2, 64, 0, MemoryKind::kHost, "key"});
  bytes[bytes.size() - 9] ^= 1;  // the key's last byte
  EXPECT_THAT(DecodeRingDescriptor(bytes).status().message(), HasSubstr("checksum mismatch"));
}

TEST(WireTest, WorkerAddressesRoundTripAndRefuseCorruption) {
  const std::string ucx(std::string("\x01\x02ucx-address\x00\xff", 16));
  const std::string encoded = EncodeWorkerAddress(ucx);
  ASSERT_TRUE(DecodeWorkerAddress(encoded).ok());
  EXPECT_EQ(*DecodeWorkerAddress(encoded), ucx);
  for (size_t i = 24; i < encoded.size(); ++i) {  // every byte after the header
    std::string corrupt = encoded;
    corrupt[i] ^= 0x20;
    EXPECT_FALSE(DecodeWorkerAddress(corrupt).ok()) << "byte " << i;
  }
  for (size_t n = 0; n < encoded.size(); ++n) {
    EXPECT_FALSE(DecodeWorkerAddress(encoded.substr(0, n)).ok()) << n << " bytes";
  }
  EXPECT_THAT(DecodeWorkerAddress("not an address at all, just text").status().message(),
              HasSubstr("not a packfeed message"));
  EXPECT_THAT(DecodeWorkerAddress(EncodeWorkerAddress("")).status().message(),
              HasSubstr("empty worker address"));
  EXPECT_THAT(DecodeWorkerAddress(EncodeRingDescriptor({2, 64, 0, MemoryKind::kHost, "k"}))
                  .status()
                  .message(),
              HasSubstr("expected a worker address"));
}

TEST(WireTest, LaysOutAlignedFieldsOrSaysHowMuchIsMissing) {
  absl::StatusOr<std::vector<FieldDescriptor>> layout =
      LayoutFields({{"tokens", ElementType::kInt64, {1, 3}},
                    {"loss_mask", ElementType::kFloat32, {1, 3}},
                    {"max_seqlen", ElementType::kInt32, {}}},
                   1024);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ((*layout)[0].offset, 0u);
  EXPECT_EQ((*layout)[0].bytes, 24u);
  EXPECT_EQ((*layout)[1].offset, 256u);
  EXPECT_EQ((*layout)[2].offset, 512u);
  EXPECT_EQ((*layout)[2].bytes, 4u);

  absl::Status too_big =
      LayoutFields({{"a", ElementType::kUInt8, {300}}, {"b", ElementType::kUInt8, {300}}}, 512)
          .status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("812 bytes"));
  EXPECT_THAT(too_big.message(), HasSubstr("512 bytes"));

  EXPECT_THAT(LayoutFields({{"", ElementType::kUInt8, {1}}}, 512).status().message(),
              HasSubstr("field name"));
  EXPECT_THAT(
      LayoutFields({{"x", ElementType::kInt64, {INT64_MAX, INT64_MAX}}}, 512).status().message(),
      HasSubstr("overflows"));
  std::vector<FieldSpec> many(kMaxFields + 1, FieldSpec{"x", ElementType::kUInt8, {1}});
  EXPECT_THAT(LayoutFields(many, 1 << 20).status().message(), HasSubstr("33 fields"));
}

}  // namespace
}  // namespace packfeed::transport
