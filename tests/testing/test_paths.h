#ifndef PACKFEED_TESTS_TESTING_TEST_PATHS_H_
#define PACKFEED_TESTS_TESTING_TEST_PATHS_H_

// Paths for tests: a scratch directory per test, and the fixtures under
// tests/fixtures/.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace packfeed::testing {

// The repository's test fixtures (tests/fixtures/: Megatron-written
// datasets and golden cases; tests/fixtures/README.md says where each came
// from).
inline std::filesystem::path FixturesDir() {
  return std::filesystem::path(PF_SOURCE_DIR) / "tests" / "fixtures";
}

// A fresh directory removed when the object goes away.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "packfeed-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string Prefix(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string ReadFileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

inline void WriteFileBytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace packfeed::testing

#endif  // PACKFEED_TESTS_TESTING_TEST_PATHS_H_
