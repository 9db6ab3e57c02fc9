#include "packfeed/transport/put_protocol.h"

#include "gtest/gtest.h"

namespace packfeed::transport {
namespace {

TEST(PutProtocolTest, AFragmentedCopyInCopyOutPutIsEmulated) {
  // What UCX 1.22 selected for a put from host memory into CUDA memory on
  // one H100 node (issue 16).
  EXPECT_EQ(ClassifyPut("put from host memory length 4194304 rndv using fragmented copy-in "
                        "copy-out"),
            PutPath::kEmulated);
}

TEST(PutProtocolTest, APutOverTcpIsEmulated) {
  // What UCX 1.13 with UCX_PROTO_ENABLE=y says of a put over TCP loopback.
  EXPECT_EQ(ClassifyPut("flags:0x84 put() from host memory length 0 software emulation tcp/lo"),
            PutPath::kEmulated);
}

TEST(PutProtocolTest, ARendezvousIsEmulatedEvenWhenItsFragmentsAreZeroCopy) {
  EXPECT_EQ(ClassifyPut("put from host memory length 4194304 rndv zero-copy read from remote"),
            PutPath::kEmulated);
}

TEST(PutProtocolTest, AZeroCopyPutIsATransportWrite) {
  EXPECT_EQ(ClassifyPut("put from host memory length 4194304 zero-copy 100% on ib0"),
            PutPath::kTransportWrite);
}

TEST(PutProtocolTest, WhatDescribesNoProtocolIsUnknown) {
  EXPECT_EQ(ClassifyPut(""), PutPath::kUnknown);
  // UCX 1.13's default (protocols v1) names no protocol.
  EXPECT_EQ(ClassifyPut("flags:0x1 <no debug info>"), PutPath::kUnknown);
  // UCX 1.13 with protocols v2, a put into shared memory: a CPU copy.
  EXPECT_EQ(ClassifyPut("flags:0x5 put() from host memory length 0 short sysv/memory"),
            PutPath::kUnknown);
}

TEST(PutProtocolTest, EveryPathHasAName) {
  EXPECT_EQ(PutPathName(PutPath::kTransportWrite), "a transport write");
  EXPECT_EQ(PutPathName(PutPath::kEmulated), "emulated");
  EXPECT_EQ(PutPathName(PutPath::kUnknown), "not known to be zero-copy");
}

}  // namespace
}  // namespace packfeed::transport
