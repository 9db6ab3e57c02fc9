#include "packfeed/dataset/npy_file.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packfeed/common/posix_file.h"

namespace packfeed::dataset {
namespace {

TEST(NpyFileTest, RoundTripsAndAlignsTheData) {
  const std::string path = testing::TempDir() + "/a.npy";
  ASSERT_TRUE(WriteNpy(path, Int64Npy({1, -2, 3, 4, 5, 6}, {3, 2})).ok());
  auto read = ReadNpy(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->descr, "<i8");
  EXPECT_EQ(read->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(read->IntAt(1), -2);
  EXPECT_EQ(read->IntAt(5), 6);
}

TEST(NpyFileTest, ReadsNarrowTypes) {
  // numpy.save of numpy.array([7, 65535], dtype=numpy.uint32), header as
  // numpy 1.24 writes it.
  std::string header = "{'descr': '<u4', 'fortran_order': False, 'shape': (2,), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header.push_back('\n');
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes.push_back(static_cast<char>(header.size()));
  bytes.push_back('\0');
  bytes += header;
  bytes += std::string("\x07\x00\x00\x00\xff\xff\x00\x00", 8);
  auto read = ParseNpy(bytes, "x.npy");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->IntAt(0), 7);
  EXPECT_EQ(read->IntAt(1), 65535);
}

TEST(NpyFileTest, RefusesCorruptFiles) {
  const std::string good = [] {
    const std::string path = testing::TempDir() + "/b.npy";
    EXPECT_TRUE(WriteNpy(path, Int64Npy({1, 2}, {2})).ok());
    return *ReadWholeFile(path);
  }();
  EXPECT_TRUE(ParseNpy(good, "b.npy").ok());
  EXPECT_THAT(ParseNpy(good.substr(0, good.size() - 1), "b.npy").status().message(),
              testing::HasSubstr("b.npy"));
  EXPECT_FALSE(ParseNpy("garbage", "b.npy").ok());
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(ParseNpy(good.substr(0, cut), "b.npy").ok()) << cut;
  }
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_FALSE(ParseNpy(fortran, "b.npy").ok());
  std::string floats = good;
  floats.replace(floats.find("<i8"), 3, "<f8");
  EXPECT_THAT(ParseNpy(floats, "b.npy").status().message(), testing::HasSubstr("integer"));
}

}  // namespace
}  // namespace packfeed::dataset
