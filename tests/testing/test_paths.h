#ifndef PACKFEED_TESTS_TESTING_TEST_PATHS_H_
#define PACKFEED_TESTS_TESTING_TEST_PATHS_H_

// Paths for tests: a scratch directory per test, and the read-only
// ../shared fixtures (absent on a user's machine: tests that need them skip
// with a message saying so).

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace packfeed::testing {

// The folder holding DESIGN.md's fixtures: $PACKFEED_SHARED_DIR, else the
// `shared/` beside the source tree. nullopt when neither exists.
inline std::optional<std::filesystem::path> SharedDir() {
  if (const char* env = std::getenv("PACKFEED_SHARED_DIR")) {
    if (std::filesystem::is_directory(env)) return std::filesystem::path(env);
  }
  std::filesystem::path beside = std::filesystem::path(PF_SOURCE_DIR).parent_path() / "shared";
  if (std::filesystem::is_directory(beside / "fixtures")) return beside;
  return std::nullopt;
}

// Skips the calling test when the shared fixtures are missing.
#define PF_REQUIRE_SHARED_DIR(var)                                                         \
  const std::optional<std::filesystem::path> var##_opt = ::packfeed::testing::SharedDir(); \
  if (!var##_opt) {                                                                        \
    GTEST_SKIP() << "shared fixtures not found (set PACKFEED_SHARED_DIR or "               \
                    "place shared/ beside the source tree)";                               \
  }                                                                                        \
  const std::filesystem::path var = *var##_opt

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
