#include "server/control/stats_proto.h"

namespace packfeed::server {

v1::StorageStats StorageStatsProto(const StorageFigures& figures) {
  v1::StorageStats out;
  for (const StorageFileFigures& file : figures.files) {
    v1::StorageFileStats* f = out.add_files();
    f->set_path(file.path);
    f->set_jobs(file.jobs);
    f->set_bytes_read(file.bytes_read);
    f->set_reads(file.reads);
    f->set_distinct_bytes(file.distinct_bytes);
    f->set_reread_bytes(file.reread_bytes);
    f->set_io_amplification(file.io_amplification);
    f->set_read_latency_p50_ms(file.read_latency_p50_ms);
    f->set_read_latency_p99_ms(file.read_latency_p99_ms);
    f->set_read_latency_max_ms(file.read_latency_max_ms);
  }
  out.set_bytes_read(figures.bytes_read);
  out.set_distinct_bytes(figures.distinct_bytes);
  out.set_io_amplification(figures.io_amplification);
  out.set_bytes_in_flight(figures.bytes_in_flight);
  out.set_bytes_held(figures.bytes_held);
  out.set_peak_bytes_held(figures.peak_bytes_held);
  out.set_memory_budget_bytes(figures.memory_budget_bytes);
  out.set_read_threads(figures.read_threads);
  out.set_reread_events(figures.reread_events);
  for (const ReReadRecord& record : figures.rereads) {
    v1::ReRead* r = out.add_rereads();
    r->set_job(record.job);
    r->set_rank(record.rank);
    r->set_step(record.step);
    r->set_path(record.path);
    r->set_samples(record.samples);
    r->set_bytes(record.bytes);
  }
  out.set_bytes_kept(figures.bytes_kept);
  return out;
}

v1::JobLedger JobLedgerProto(const LedgerSnapshot& snapshot) {
  v1::JobLedger out;
  out.set_name(snapshot.name);
  out.set_journal(snapshot.journal);
  for (const RankLedgerFigures& rank : snapshot.ranks) {
    v1::RankLedger* r = out.add_ranks();
    r->set_global_rank(static_cast<uint32_t>(rank.global_rank));
    r->set_first_step(rank.first_step);
    r->set_next_step(rank.next_step);
    r->set_next_microbatch(static_cast<uint32_t>(rank.next_microbatch));
    r->set_microbatches(rank.microbatches);
    r->set_samples(rank.samples);
    r->set_duplicates(rank.duplicates);
    r->set_gaps(rank.gaps);
    r->set_rewinds(rank.rewinds);
    r->set_claimed(rank.claimed);
    for (const EpochShare& epoch : rank.epochs) {
      v1::LedgerEpoch* e = r->add_epochs();
      e->set_dataset(static_cast<uint32_t>(epoch.dataset));
      e->set_epoch(epoch.epoch);
      e->set_samples(epoch.samples);
      e->set_digest(epoch.digest);
    }
  }
  return out;
}

v1::JobStats JobStatsProto(const JobFigures& figures) {
  v1::JobStats out;
  out.set_name(figures.name);
  out.set_steps_planned(figures.steps_planned);
  out.set_steps_served(figures.steps_served);
  out.set_bytes_read(figures.bytes_read);
  out.set_unique_bytes_needed(figures.unique_bytes_needed);
  out.set_io_amplification(figures.io_amplification);
  for (const RankFigures& rank : figures.ranks) {
    v1::RankStats* r = out.add_ranks();
    r->set_global_rank(static_cast<uint32_t>(rank.global_rank));
    r->set_attached(rank.attached);
    r->set_next_step(rank.next_step);
    r->set_slots_pushed(rank.slots_pushed);
    r->set_slots_released(rank.slots_released);
    r->set_bytes_sent(rank.bytes_sent);
    r->set_slots_in_flight(rank.slots_in_flight);
    r->set_consumed_step(rank.consumed_step);
    r->set_consumed_microbatch(static_cast<uint32_t>(rank.consumed_microbatch));
    r->set_wait_seconds(rank.times.wait_seconds);
    r->set_busy_seconds(rank.times.busy_seconds);
    r->set_input_bound(rank.input_bound);
    r->set_copied_out(rank.times.copied_out);
    r->set_ring(rank.ring);
    r->set_device_ring_fallback(rank.device_ring_fallback);
    r->set_calls(rank.times.calls);
  }
  out.set_mean_step_over_ideal(figures.mean_step_over_ideal);
  out.set_slowest_rank(static_cast<uint32_t>(figures.slowest_rank));
  out.set_slowest_rank_steps_behind(figures.slowest_rank_steps_behind);
  out.set_cached_bytes(figures.cached_bytes);
  out.set_side_rows_bytes(figures.side_rows_bytes);
  out.set_peak_side_rows_bytes(figures.peak_side_rows_bytes);
  out.set_plan_seconds(figures.plan_seconds);
  out.set_read_seconds(figures.read_seconds);
  out.set_documents_split(figures.documents_split);
  out.set_samples_truncated(figures.samples_truncated);
  out.set_tokens_truncated(figures.tokens_truncated);
  out.set_most_waiting_rank(static_cast<uint32_t>(figures.most_waiting_rank));
  out.set_input_bound(figures.input_bound);
  out.set_wait_seconds(figures.wait_seconds);
  const CostFitFigures& fit = figures.cost_fit;
  v1::CostFitStats& cost = *out.mutable_cost_fit();
  cost.set_rows(fit.fit.rows);
  cost.set_prior_name(fit.prior_name);
  cost.set_residual_rms_seconds(fit.fit.residual_rms);
  cost.set_model_version(fit.model_version);
  cost.set_model_from_step(fit.model_from_step);
  cost.set_model_versions_missed(fit.model_versions_missed);
  const double fitted[] = {fit.fit.model.alpha, fit.fit.model.beta, fit.fit.model.kappa,
                           fit.fit.model.lambda, fit.fit.model.microbatch};
  const double prior[] = {fit.prior.alpha, fit.prior.beta, fit.prior.kappa, fit.prior.lambda,
                          fit.prior.microbatch};
  for (int term = 0; term < scheduler::kCostTerms; ++term) {
    v1::CostRate& rate = *cost.add_rates();
    rate.set_name(scheduler::CostTermName(term));
    rate.set_fitted(fitted[term]);
    rate.set_prior(prior[term]);
    rate.set_stddev(fit.fit.stddev[static_cast<size_t>(term)]);
    rate.set_determined(fit.fit.determined[static_cast<size_t>(term)]);
  }
  for (const CostFitFigures::Step& step : fit.recent_steps) {
    v1::StepTimes& times = *cost.add_recent_steps();
    times.set_step(step.step);
    times.set_measured_seconds(step.measured);
    times.set_prior_seconds(step.prior);
    times.set_fitted_seconds(step.fitted);
  }
  return out;
}

std::vector<MeasuredMicrobatch> MeasuredOf(
    const google::protobuf::RepeatedPtrField<v1::MicrobatchCompute>& computed) {
  std::vector<MeasuredMicrobatch> out;
  out.reserve(static_cast<size_t>(computed.size()));
  for (const v1::MicrobatchCompute& row : computed) {
    out.push_back({row.step(), static_cast<int>(row.microbatch()), row.seconds()});
  }
  return out;
}

TrainerTimes TrainerTimesOf(const v1::RankTimes& times) {
  return {times.wait_seconds(), times.busy_seconds(), times.calls(), times.copied_out()};
}

v1::IngestStreamStats IngestStreamStatsProto(const IngestStreamFigures& figures) {
  v1::IngestStreamStats out;
  out.set_name(figures.name);
  out.set_bytes_held(figures.bytes_held);
  out.set_peak_bytes_held(figures.peak_bytes_held);
  out.set_budget_bytes(figures.budget_bytes);
  out.set_samples_put(figures.samples_put);
  out.set_bytes_put(figures.bytes_put);
  out.set_puts_waited(figures.puts_waited);
  out.set_puts_in_one_call(figures.puts_in_one_call);
  out.set_puts_refused(figures.puts_refused);
  for (const IngestStreamFigures::Step& step : figures.steps) {
    v1::IngestStepStats* to = out.add_steps();
    to->set_step(step.step);
    to->set_sealed(step.sealed);
    to->set_samples(step.samples);
    to->set_bytes(step.bytes);
    for (const std::string& job : step.consumed_by) to->add_consumed_by(job);
  }
  for (const IngestStreamFigures::Consumer& consumer : figures.consumers) {
    v1::IngestConsumerStats* to = out.add_consumers();
    to->set_job(consumer.job);
    to->set_consumed_before(consumer.consumed_before);
    to->set_bytes_pending(consumer.bytes_pending);
  }
  return out;
}

}  // namespace packfeed::server
