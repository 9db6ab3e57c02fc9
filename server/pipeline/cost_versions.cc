#include "server/pipeline/cost_versions.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {
namespace {

constexpr char kLineTag[] = "cost_model";

bool ParseDouble(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  return errno == 0 && end == text.c_str() + text.size() && std::isfinite(out) && out >= 0;
}

}  // namespace

std::string CostModelVersionLine(const CostModelVersion& v) {
  const scheduler::CostModel& m = v.model;
  return absl::StrFormat("%s %u %d %a %a %a %a %a %a\n", kLineTag, v.version, v.from_step, m.alpha,
                         m.beta, m.kappa, m.lambda, m.microbatch, m.bubble);
}

absl::StatusOr<CostModelVersion> ParseCostModelVersionLine(const std::string& line) {
  const std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (fields.size() != 9 || fields[0] != kLineTag) {
    return absl::InvalidArgumentError(
        "not 'cost_model VERSION FROM_STEP' and six coefficients (alpha beta kappa lambda mu "
        "bubble)");
  }
  CostModelVersion out;
  char* end = nullptr;
  const unsigned long version = std::strtoul(fields[1].c_str(), &end, 10);
  if (*end != '\0' || version == 0 || version > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("version '", fields[1], "' is no number > 0"));
  }
  out.version = static_cast<uint32_t>(version);
  out.from_step = std::strtoll(fields[2].c_str(), &end, 10);
  if (*end != '\0' || out.from_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("from_step '", fields[2], "' is no step"));
  }
  double* coefficients[] = {&out.model.alpha,  &out.model.beta,       &out.model.kappa,
                            &out.model.lambda, &out.model.microbatch, &out.model.bubble};
  for (size_t i = 0; i < 6; ++i) {
    if (!ParseDouble(fields[3 + i], *coefficients[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("coefficient '", fields[3 + i], "' is no finite number >= 0"));
    }
  }
  return out;
}

CostModelVersions::CostModelVersions(const scheduler::CostModel& configured) {
  versions_.push_back({0, 0, configured});
}

absl::Status CostModelVersions::JournalTo(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  absl::MutexLock lock(&mutex_);
  state_path_ = path;
  if (absl::IsNotFound(text.status())) return absl::OkStatus();
  if (!text.ok()) return text.status();
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  const bool torn = !text->empty() && text->back() != '\n';
  if (torn) {
    spdlog::warn("{}: the last line has no newline (a write cut short); it is dropped", path);
  }
  lines.pop_back();  // after the last newline: empty, or the torn line
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::StatusOr<CostModelVersion> version = ParseCostModelVersionLine(lines[i]);
    const CostModelVersion& latest = versions_.back();
    if (version.ok() &&
        (version->version <= latest.version || version->from_step <= latest.from_step)) {
      version = absl::InvalidArgumentError(absl::StrCat(
          "version ", version->version, " from step ", version->from_step,
          " does not follow version ", latest.version, " from step ", latest.from_step));
    }
    if (!version.ok()) {
      return absl::DataLossError(absl::StrCat(path, " line ", i + 1, ": ",
                                              version.status().message(),
                                              " (move the file aside to start from the "
                                              "configured model and the peers' versions)"));
    }
    versions_.push_back(*version);
  }
  return absl::OkStatus();
}

absl::Status CostModelVersions::Append(const CostModelVersion& version) {
  if (state_path_.empty()) return absl::OkStatus();
  ScopedFd fd(open(state_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640));
  if (!fd.valid()) return ErrnoToStatus(errno, "open", state_path_);
  PF_RETURN_IF_ERROR(WriteFully(fd.get(), state_path_, CostModelVersionLine(version)));
  if (fsync(fd.get()) != 0) return ErrnoToStatus(errno, "fsync", state_path_);
  return SyncDirectoryOf(state_path_);
}

const CostModelVersion& CostModelVersions::ForStepLocked(int64_t step) const {
  auto after =
      std::upper_bound(versions_.begin(), versions_.end(), step,
                       [](int64_t s, const CostModelVersion& v) { return s < v.from_step; });
  return *std::prev(after);  // version 0 is from step 0
}

CostModelVersion CostModelVersions::ForStep(int64_t step) const {
  absl::ReaderMutexLock lock(&mutex_);
  return ForStepLocked(step);
}

CostModelVersion CostModelVersions::ForPlanning(int64_t step) {
  absl::MutexLock lock(&mutex_);
  planned_through_ = std::max(planned_through_, step);
  return ForStepLocked(step);
}

absl::StatusOr<CostModelVersions::Offered> CostModelVersions::Offer(
    const CostModelVersion& version) {
  absl::MutexLock lock(&mutex_);
  for (const CostModelVersion& held : versions_) {
    if (held.version != version.version) continue;
    if (held == version) return Offered::kHeld;
    return absl::InvalidArgumentError(absl::StrCat(
        "version ", version.version, " from step ", version.from_step,
        " differs from the version held under that number (from step ", held.from_step, ")"));
  }
  const CostModelVersion& latest = versions_.back();
  if (version.version < latest.version || version.from_step <= latest.from_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("version ", version.version, " from step ", version.from_step,
                     " does not follow the latest held, version ", latest.version, " from step ",
                     latest.from_step));
  }
  if (version.from_step <= planned_through_) {
    if (version.version != last_missed_) ++missed_;
    last_missed_ = version.version;
    return Offered::kTooLate;
  }
  PF_RETURN_IF_ERROR(Append(version));
  versions_.push_back(version);
  return Offered::kAdopted;
}

std::vector<CostModelVersion> CostModelVersions::All() const {
  absl::ReaderMutexLock lock(&mutex_);
  return versions_;
}

CostModelVersion CostModelVersions::Latest() const {
  absl::ReaderMutexLock lock(&mutex_);
  return versions_.back();
}

int64_t CostModelVersions::planned_through() const {
  absl::ReaderMutexLock lock(&mutex_);
  return planned_through_;
}

int64_t CostModelVersions::missed() const {
  absl::ReaderMutexLock lock(&mutex_);
  return missed_;
}

}  // namespace packfeed::server
