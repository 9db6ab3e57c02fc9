#include "server/ingest/ingest_stream.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "packfeed/common/constant_time.h"
#include "packfeed/common/status_macros.h"

namespace packfeed::server {

IngestStream::IngestStream(std::string name, std::string auth_token,
                           std::vector<SideFieldInfo> fields, uint64_t budget_bytes)
    : name_(std::move(name)),
      auth_token_(std::move(auth_token)),
      fields_(std::move(fields)),
      budget_bytes_(budget_bytes) {}

int IngestStream::FieldIndex(const std::string& name) const {
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (fields_[f].name == name) return static_cast<int>(f);
  }
  return -1;
}

void IngestStream::AddConsumer(IngestConsumer consumer, std::function<void()> wake) {
  absl::MutexLock lock(&mutex_);
  consumers_.push_back({std::move(consumer), std::move(wake), 0});
}

void IngestStream::SetOnFree(std::function<void()> on_free) {
  absl::MutexLock lock(&mutex_);
  on_free_ = std::move(on_free);
}

absl::Status IngestStream::CheckToken(const std::string& token) const {
  if (auth_token_.empty() || ConstantTimeEquals(token, auth_token_)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("ingest stream ", name_, ": ",
                                                  token.empty() ? "no" : "a wrong",
                                                  " auth token (IngestStream.auth_token)"));
}

absl::StatusOr<uint64_t> IngestStream::CheckPut(const IngestPut& put) const {
  const std::string where = absl::StrCat("ingest stream ", name_, " step ", put.step);
  if (put.step < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative step"));
  // The put's fields, in its order, as stream fields.
  std::vector<const SideFieldInfo*> fields;
  std::set<std::string> named;
  for (const std::string& name : put.fields) {
    const int f = FieldIndex(name);
    if (f < 0) {
      std::vector<std::string> names;
      for (const SideFieldInfo& field : fields_) names.push_back(field.name);
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown field '", name,
                       "' (the stream's fields: ", absl::StrJoin(names, ", "), ")"));
    }
    if (!named.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": field '", name, "' twice"));
    }
    fields.push_back(&fields_[static_cast<size_t>(f)]);
  }
  for (const SideFieldInfo& field : fields_) {
    if (named.count(field.name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field '", field.name, "' is missing (every put carries it)"));
    }
  }
  if (put.samples.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no sample"));
  const uint64_t region = put.region.length;
  auto inside = [region](uint64_t offset, uint64_t bytes) {
    return offset <= region && bytes <= region - offset;
  };
  std::vector<IngestConsumer> consumers;
  {
    absl::MutexLock lock(&mutex_);
    for (const Consumer& consumer : consumers_) consumers.push_back(consumer.limits);
  }
  uint64_t total = 0;
  for (size_t i = 0; i < put.samples.size(); ++i) {
    const PutSample& sample = put.samples[i];
    const std::string at = absl::StrCat(where, " sample ", i, " (group ", sample.group, ")");
    const uint64_t tokens = sample.tokens;
    if (tokens < 2 || tokens > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": ", tokens, " tokens; a sample needs at least 2 (inputs and a label)"));
    }
    if (!inside(sample.offset, tokens * sizeof(int64_t))) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": its tokens lie outside the put's region of ", region, " bytes"));
    }
    total += tokens * sizeof(int64_t);
    if (sample.field_offsets.size() != fields.size() ||
        sample.field_bytes.size() != fields.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": ", sample.field_bytes.size(), " field sizes for ", fields.size(), " fields"));
    }
    for (size_t f = 0; f < fields.size(); ++f) {
      const uint64_t want = tokens * fields[f]->row_bytes();
      const uint64_t have = sample.field_bytes[f];
      if (have != want) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": field '", fields[f]->name, "' has ", have, " bytes; ", tokens,
                         " tokens of ", transport::ElementTypeName(fields[f]->type), " [",
                         absl::StrJoin(fields[f]->inner_shape, ","), "] take ", want));
      }
      if (!inside(sample.field_offsets[f], have)) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": field '", fields[f]->name,
                                                       "' lies outside the put's region of ",
                                                       region, " bytes"));
      }
      total += have;
    }
    for (const IngestConsumer& consumer : consumers) {
      const dataset::SampleShape shape =
          dataset::ShapeOfSample(static_cast<int64_t>(tokens), consumer.rules);
      absl::Status fits =
          shape.read_tokens == static_cast<int64_t>(tokens)
              ? scheduler::CheckSequenceFits(dataset::RealLength(shape.run_length, consumer.rules),
                                             consumer.planner)
              : absl::InvalidArgumentError(
                    absl::StrCat("longer than its seq_length ", consumer.rules.seq_length));
      if (!fits.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": ", tokens, " tokens; no rank of job ",
                                                       consumer.job,
                                                       " can hold it: ", fits.message()));
      }
    }
  }
  absl::MutexLock lock(&mutex_);
  PF_RETURN_IF_ERROR(CheckStepOpen(put.step));
  std::vector<int64_t> groups;
  for (const PutSample& sample : put.samples) groups.push_back(sample.group);
  PF_RETURN_IF_ERROR(CheckGroups(put.step, groups));
  auto step = steps_.find(put.step);
  const int64_t after =
      (step == steps_.end() ? 0 : static_cast<int64_t>(step->second.samples.size())) +
      static_cast<int64_t>(put.samples.size());
  for (const Consumer& consumer : consumers_) {
    if (after > consumer.limits.max_samples) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": would hold ", after, " samples; job ", consumer.limits.job,
          " takes at most its global_batch of ", consumer.limits.max_samples, " per step"));
    }
  }
  return total;
}

absl::Status IngestStream::CheckStepOpen(int64_t step) const {
  const std::string where = absl::StrCat("ingest stream ", name_, " step ", step);
  if (step < ConsumedBefore()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": every consumer job is past it (they consumed the steps before ",
                     ConsumedBefore(), ")"));
  }
  auto held = steps_.find(step);
  if (held != steps_.end() && held->second.sealed != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": sealed already"));
  }
  return absl::OkStatus();
}

absl::Status IngestStream::CheckGroups(int64_t step, const std::vector<int64_t>& groups) const {
  for (int64_t group : groups) {
    auto elsewhere = group_steps_.find(group);
    if (elsewhere != group_steps_.end() && elsewhere->second != step) {
      return absl::InvalidArgumentError(
          absl::StrCat("ingest stream ", name_, " step ", step, ": group ", group, " is in step ",
                       elsewhere->second, " already; a group lies in one step"));
    }
  }
  return absl::OkStatus();
}

absl::Status IngestStream::Reserve(uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  if (budget_bytes_ != 0 && bytes > budget_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ingest stream ", name_, ": a put of ", bytes,
                     " bytes can never fit the stream's memory budget of ", budget_bytes_,
                     " bytes; put fewer samples at a time"));
  }
  if (budget_bytes_ != 0 && held_ + reserved_ + bytes > budget_bytes_) {
    return absl::UnavailableError(absl::StrCat("ingest stream ", name_, " holds ", held_,
                                               " bytes of its budget of ", budget_bytes_));
  }
  reserved_ += bytes;
  peak_ = std::max(peak_, held_ + reserved_);
  return absl::OkStatus();
}

void IngestStream::Unreserve(uint64_t bytes) {
  std::function<void()> on_free;
  {
    absl::MutexLock lock(&mutex_);
    reserved_ -= bytes;
    on_free = on_free_;
  }
  if (on_free) on_free();
}

absl::StatusOr<PutOutcome> IngestStream::Commit(int64_t step, std::vector<IngestedSample> samples,
                                                uint64_t reserved) {
  absl::Status status;
  PutOutcome reply;
  {
    absl::MutexLock lock(&mutex_);
    std::vector<int64_t> groups;
    for (const IngestedSample& sample : samples) groups.push_back(sample.group);
    status = CheckStepOpen(step);
    if (status.ok()) status = CheckGroups(step, groups);
    if (status.ok()) {
      reserved_ -= reserved;
      held_ += reserved;
      Step& held = steps_[step];
      held.bytes += reserved;
      // (A peer keeps the samples its ranks are not planned without bytes.)
      samples_put_ += std::count_if(samples.begin(), samples.end(),
                                    [](const IngestedSample& s) { return s.data != nullptr; });
      bytes_put_ += reserved;
      for (IngestedSample& sample : samples) {
        group_steps_[sample.group] = step;
        held.samples.push_back(std::move(sample));
      }
      reply.samples_held = held.samples.size();
      reply.bytes_held = held_;
    }
  }
  if (!status.ok()) {
    Unreserve(reserved);
    return status;
  }
  return reply;
}

absl::StatusOr<SealOutcome> IngestStream::Seal(int64_t step, bool pinned) {
  std::vector<std::function<void()>> wakes;
  SealOutcome reply;
  {
    absl::MutexLock lock(&mutex_);
    const std::string where = absl::StrCat("ingest stream ", name_, " step ", step);
    auto held = steps_.find(step);
    if (held != steps_.end() && held->second.sealed != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat(where, ": sealed already"));
    }
    if (step < ConsumedBefore()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": every consumer job is past it already"));
    }
    if (held == steps_.end() || held->second.samples.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": no sample was put into it"));
    }
    auto sealed = std::make_shared<SealedStep>();
    sealed->step = step;
    sealed->samples = std::move(held->second.samples);
    std::stable_sort(
        sealed->samples.begin(), sealed->samples.end(),
        [](const IngestedSample& a, const IngestedSample& b) { return a.group < b.group; });
    std::set<int64_t> groups;
    for (const IngestedSample& sample : sealed->samples) groups.insert(sample.group);
    reply.samples = sealed->samples.size();
    reply.groups = groups.size();
    held->second.samples.clear();
    held->second.sealed = std::move(sealed);
    held->second.pins = pinned ? 1 : 0;
    for (const Consumer& consumer : consumers_) wakes.push_back(consumer.wake);
  }
  for (const auto& wake : wakes) wake();
  return reply;
}

void IngestStream::Unpin(int64_t step) {
  std::function<void()> on_free;
  {
    absl::MutexLock lock(&mutex_);
    auto held = steps_.find(step);
    if (held != steps_.end() && held->second.pins > 0) --held->second.pins;
    if (FreeConsumed()) on_free = on_free_;
  }
  if (on_free) on_free();
}

bool IngestStream::Pin(int64_t step) {
  absl::MutexLock lock(&mutex_);
  auto held = steps_.find(step);
  if (held == steps_.end() || held->second.sealed == nullptr) return false;
  ++held->second.pins;
  return true;
}

bool IngestStream::SealedOrConsumed(int64_t step) const {
  absl::MutexLock lock(&mutex_);
  auto held = steps_.find(step);
  return step < ConsumedBefore() || (held != steps_.end() && held->second.sealed != nullptr);
}

absl::StatusOr<std::vector<bool>> IngestStream::LocalSamples(
    std::shared_ptr<const SealedStep> step) const {
  std::vector<IngestConsumer> consumers;
  {
    absl::MutexLock lock(&mutex_);
    for (const Consumer& consumer : consumers_) consumers.push_back(consumer.limits);
  }
  std::vector<bool> local(step->samples.size(), false);
  for (const IngestConsumer& consumer : consumers) {
    PF_ASSIGN_OR_RETURN(std::vector<int64_t> samples, consumer.local_samples(step));
    for (int64_t sample : samples) local[static_cast<size_t>(sample)] = true;
  }
  return local;
}

absl::StatusOr<std::shared_ptr<const SealedStep>> IngestStream::Sealed(int64_t step) const {
  absl::MutexLock lock(&mutex_);
  auto held = steps_.find(step);
  if (held != steps_.end() && held->second.sealed != nullptr) return held->second.sealed;
  if (step < ConsumedBefore()) {
    return absl::NotFoundError(absl::StrCat("ingest stream ", name_, " step ", step,
                                            " was consumed by every consumer job and freed"));
  }
  return absl::UnavailableError(
      absl::StrCat("ingest stream ", name_, " step ", step, " is not sealed yet"));
}

int64_t IngestStream::ConsumedBefore() const {
  int64_t before = INT64_MAX;
  for (const Consumer& consumer : consumers_) before = std::min(before, consumer.consumed_before);
  return consumers_.empty() ? 0 : before;
}

void IngestStream::Consumed(const std::string& job, int64_t before) {
  std::function<void()> on_free;
  {
    absl::MutexLock lock(&mutex_);
    for (Consumer& consumer : consumers_) {
      if (consumer.limits.job == job) {
        consumer.consumed_before = std::max(consumer.consumed_before, before);
      }
    }
    if (FreeConsumed()) on_free = on_free_;
  }
  if (on_free) on_free();
}

bool IngestStream::FreeConsumed() {
  const int64_t before = ConsumedBefore();
  bool freed = false;
  while (!steps_.empty() && steps_.begin()->first < before && steps_.begin()->second.pins == 0) {
    Step& step = steps_.begin()->second;
    if (step.sealed != nullptr) {
      for (const IngestedSample& sample : step.sealed->samples) group_steps_.erase(sample.group);
    }
    // (An unsealed step below every consumer cannot be served: freed too.)
    for (const IngestedSample& sample : step.samples) group_steps_.erase(sample.group);
    held_ -= step.bytes;
    steps_.erase(steps_.begin());
    freed = true;
  }
  return freed;
}

void IngestStream::CountWait() {
  absl::MutexLock lock(&mutex_);
  ++puts_waited_;
}

void IngestStream::CountRefusal() {
  absl::MutexLock lock(&mutex_);
  ++puts_refused_;
}

void IngestStream::CountPutInOneCall() {
  absl::MutexLock lock(&mutex_);
  ++puts_in_one_call_;
}

IngestStreamFigures IngestStream::Stats() const {
  absl::MutexLock lock(&mutex_);
  IngestStreamFigures stats;
  stats.name = name_;
  stats.bytes_held = held_;
  stats.peak_bytes_held = peak_;
  stats.budget_bytes = budget_bytes_;
  stats.samples_put = samples_put_;
  stats.bytes_put = bytes_put_;
  stats.puts_waited = puts_waited_;
  stats.puts_refused = puts_refused_;
  stats.puts_in_one_call = puts_in_one_call_;
  for (const auto& [number, step] : steps_) {
    IngestStreamFigures::Step& out = stats.steps.emplace_back();
    out.step = number;
    out.sealed = step.sealed != nullptr;
    out.samples = step.sealed != nullptr ? step.sealed->samples.size() : step.samples.size();
    out.bytes = step.bytes;
    for (const Consumer& consumer : consumers_) {
      if (consumer.consumed_before > number) out.consumed_by.push_back(consumer.limits.job);
    }
  }
  for (const Consumer& consumer : consumers_) {
    IngestStreamFigures::Consumer& out = stats.consumers.emplace_back();
    out.job = consumer.limits.job;
    out.consumed_before = consumer.consumed_before;
    for (auto it = steps_.lower_bound(consumer.consumed_before); it != steps_.end(); ++it) {
      out.bytes_pending += it->second.bytes;
    }
  }
  return stats;
}

}  // namespace packfeed::server
