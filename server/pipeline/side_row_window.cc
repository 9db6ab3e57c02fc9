#include "server/pipeline/side_row_window.h"

#include <algorithm>
#include <utility>

#include "packfeed/scheduler/plan.h"
#include "spdlog/spdlog.h"

namespace packfeed::server {

SideRowWindow::SideRowWindow(const Job& job, Storage& storage, HeldSteps::Post post)
    : job_(job), storage_(storage), post_(std::move(post)) {}

SideRowWindow::~SideRowWindow() { entries_.clear(); }

const SideRows* SideRowWindow::RowsFor(const std::shared_ptr<const StepData>& data, int microbatch,
                                       int dp_cp_rank, int rank, bool urgent) {
  const scheduler::CpGroup& group = scheduler::GroupOfRank(
      data->plan.plan.microbatches[static_cast<size_t>(microbatch)], dp_cp_rank);
  const Key key{data->plan.step, microbatch, group.first_rank};
  auto [found, inserted] = entries_.try_emplace(key);
  Entry& entry = found->second;
  if (inserted) {
    entry.group_size = group.size;
    Fetch(key, entry, group, data, rank, urgent);
    return nullptr;
  }
  if (entry.rows == nullptr) {
    // Read ahead and maybe queued behind the storage's budget, which only
    // this rank's progress may free: asked for again as urgent. (A read
    // already issued is shared, not repeated.)
    if (urgent && !entry.urgent) Fetch(key, entry, group, data, rank, urgent);
    return nullptr;
  }
  if (urgent && !entry.rows->failed.empty() && !entry.retried) {
    entry.retried = true;
    Fetch(key, entry, group, data, rank, urgent);
    return nullptr;
  }
  return entry.rows.get();
}

void SideRowWindow::Fetch(const Key& key, Entry& entry, const scheduler::CpGroup& group,
                          std::shared_ptr<const StepData> data, int rank, bool urgent) {
  std::vector<int64_t> samples;
  for (const scheduler::PlannedSequence& sequence : group.sequences) {
    samples.push_back(sequence.sample);
  }
  std::sort(samples.begin(), samples.end());
  samples.erase(std::unique(samples.begin(), samples.end()), samples.end());
  std::vector<SampleNeed> needs = SideNeedsOf(job_, data->plan, samples);
  bytes_ -= entry.bytes;
  entry.bytes = 0;
  for (const SampleNeed& need : needs) entry.bytes += need.bytes;
  bytes_ += entry.bytes;
  peak_bytes_ = std::max(peak_bytes_, bytes_);
  entry.generation = ++generations_;
  entry.urgent = urgent;
  entry.rows = nullptr;
  // Fetching again: the previous fetch's pin goes only once this one holds
  // the same rows, which the storage does not keep unpinned.
  std::unique_ptr<FetchPin> previous = std::move(entry.pin);
  entry.pin = storage_.Fetch(
      {job_.name(), rank, std::get<0>(key)}, std::move(needs), urgent,
      [this, key, generation = entry.generation, data = std::move(data),
       samples = std::move(samples)](std::vector<FetchedSample> fetched) {
        // Assembled here, on the storage's thread; held on the owner's.
        auto rows =
            std::make_shared<const SideRows>(AssembleSideRows(job_, data->plan, samples, fetched));
        post_([this, key, generation, rows] { OnRead(key, generation, rows); });
      });
}

void SideRowWindow::OnRead(const Key& key, uint64_t generation,
                           std::shared_ptr<const SideRows> rows) {
  auto found = entries_.find(key);
  if (found == entries_.end() || found->second.generation != generation) return;  // dropped
  found->second.rows = std::move(rows);
  const SideRows& ready = *found->second.rows;
  if (!ready.failed.empty()) {
    spdlog::error(
        "job {} step {} microbatch {}: {} sample(s)' side rows could not be read, the ranks that "
        "need them are ended; first: {}",
        job_.name(), std::get<0>(key), std::get<1>(key), ready.failed.size(),
        ready.failed.begin()->second.ToString());
  }
}

void SideRowWindow::ReadAhead(const SideReaders& readers, const HeldSteps& steps, int64_t last_step,
                              uint64_t budget_bytes) {
  uint32_t horizon = 0;  // no reader can be sent more than its ring holds
  for (const SideReaders::Reader& reader : readers.live) {
    horizon = std::max(horizon, reader.ring_slots);
  }
  for (uint32_t ahead = 0; ahead < horizon; ++ahead) {
    for (const SideReaders::Reader& reader : readers.live) {
      if (bytes_ >= budget_bytes) return;
      if (ahead >= reader.ring_slots) continue;
      // The reader's microbatch `ahead` past its next, if its step is held.
      int64_t step = reader.next.step;
      int64_t microbatch = reader.next.microbatch + ahead;
      std::shared_ptr<const StepData> data;
      for (; step <= last_step; ++step) {
        data = steps.Held(step);
        if (data == nullptr || microbatch < data->plan.plan.num_microbatches()) break;
        microbatch -= data->plan.plan.num_microbatches();
      }
      if (data == nullptr || step > last_step) continue;
      RowsFor(data, static_cast<int>(microbatch), reader.dp_cp_rank, reader.global_rank,
              /*urgent=*/false);
    }
  }
}

bool SideRowWindow::Needed(const Key& key, const Entry& entry, const SideReaders& readers) {
  // (Not a structured binding: clang does not let lambdas capture one.)
  const int64_t step = std::get<0>(key);
  const int first_rank = std::get<2>(key);
  const int end_rank = first_rank + entry.group_size;
  auto in_group = [&](int dp_cp_rank) { return dp_cp_rank >= first_rank && dp_cp_rank < end_rank; };
  // Kept for the group's ranks still to attach, as their steps are.
  if (step >= readers.awaited_from &&
      std::any_of(readers.awaited.begin(), readers.awaited.end(), in_group)) {
    return true;
  }
  const LedgerPosition at{step, std::get<1>(key)};
  return std::any_of(readers.live.begin(), readers.live.end(),
                     [&](const SideReaders::Reader& reader) {
                       return in_group(reader.dp_cp_rank) && reader.next <= at;
                     });
}

void SideRowWindow::DropIfUnneeded(const Key& key, const SideReaders& readers) {
  auto found = entries_.find(key);
  if (found == entries_.end() || Needed(key, found->second, readers)) return;
  bytes_ -= found->second.bytes;
  entries_.erase(found);
}

void SideRowWindow::Evict(const SideReaders& readers) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (Needed(it->first, it->second, readers)) {
      ++it;
      continue;
    }
    bytes_ -= it->second.bytes;
    it = entries_.erase(it);
  }
}

}  // namespace packfeed::server
