#include "server/ctl/admin_commands.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "nlohmann/json.hpp"
#include "packfeed/client/client.h"
#include "packfeed/common/status_macros.h"
#include "packfeed/proto/grpc_status.h"
#include "packfeed/v1/service.grpc.pb.h"
#include "server/config/admin_tls.h"
#include "server/config/daemon_config.h"
#include "server/ctl/exit_code.h"

namespace packfeed::server::ctl {
namespace {

struct AdminArgs {
  std::string socket = std::string(kDefaultSocketPath);
  // The daemon's admin_tcp_address instead of its socket, with its
  // admin_tcp_token and, under admin_tls, the CA (and client certificate).
  std::string address;
  std::string admin_token;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string job;
  std::string token;
  int64_t step = 0;
  int rank = 0;
  int64_t steps = 1;
  std::string fingerprint;
  uint64_t slot_bytes = 0;
  double hold_seconds = 0;
  std::string ring_sharing = "auto";
  std::string ucx_transports;
  bool json = false;
  bool check = false;
};

absl::Status Call(const AdminArgs& args, absl::string_view what,
                  const std::function<grpc::Status(v1::Admin::Stub&, grpc::ClientContext&)>& call) {
  const std::string target = args.address.empty() ? "unix:" + args.socket : args.address;
  PF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      AdminChannelCredentials(args.tls_ca, args.tls_cert, args.tls_key));
  std::unique_ptr<v1::Admin::Stub> stub =
      v1::Admin::NewStub(grpc::CreateChannel(target, credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!args.admin_token.empty()) context.AddMetadata(kAdminTokenMetadata, args.admin_token);
  return proto::FromGrpc(call(*stub, context), absl::StrCat(what, " (", target, ")"));
}

// Prints `reply` as JSON (--json) or as indented "key: value" lines.
void Print(const google::protobuf::Message& reply, bool json) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(reply, &out, options);
  if (json) {
    std::printf("%s\n", out.c_str());
    return;
  }
  std::printf("%s\n", nlohmann::json::parse(out).dump(2).c_str());
}

absl::Status Jobs(const AdminArgs& args) {
  v1::ListJobsReply reply;
  PF_RETURN_IF_ERROR(Call(args, "jobs", [&](v1::Admin::Stub& stub, grpc::ClientContext& c) {
    return stub.ListJobs(&c, {}, &reply);
  }));
  if (args.json) {
    Print(reply, true);
    return absl::OkStatus();
  }
  std::printf("%-20s %-40s %-22s %6s %6s\n", "job", "fingerprint", "scheduler", "world", "local");
  for (const v1::JobSummary& job : reply.jobs()) {
    std::printf("%-20s %-40s %-22s %6u %6d\n", job.name().c_str(), job.fingerprint().c_str(),
                job.scheduler().c_str(), job.world_size(), job.local_ranks_size());
  }
  return absl::OkStatus();
}

using ull = unsigned long long;

void PrintIngest(const v1::IngestStreamStats& stream) {
  std::printf(
      "ingest stream %s: %llu B held (peak %llu, budget %llu); %llu samples, %llu B put; "
      "%llu puts waited for room, %llu refused, %llu in one call\n",
      stream.name().c_str(), static_cast<ull>(stream.bytes_held()),
      static_cast<ull>(stream.peak_bytes_held()), static_cast<ull>(stream.budget_bytes()),
      static_cast<ull>(stream.samples_put()), static_cast<ull>(stream.bytes_put()),
      static_cast<ull>(stream.puts_waited()), static_cast<ull>(stream.puts_refused()),
      static_cast<ull>(stream.puts_in_one_call()));
  for (const v1::IngestStepStats& step : stream.steps()) {
    std::printf(
        "  step %lld %s: %llu samples, %llu B; consumed by: %s\n",
        static_cast<long long>(step.step()), step.sealed() ? "sealed" : "open",
        static_cast<ull>(step.samples()), static_cast<ull>(step.bytes()),
        step.consumed_by().empty() ? "none" : absl::StrJoin(step.consumed_by(), ", ").c_str());
  }
  for (const v1::IngestConsumerStats& consumer : stream.consumers()) {
    std::printf("  consumer %s: consumed the steps before %lld; %llu B still to consume\n",
                consumer.job().c_str(), static_cast<long long>(consumer.consumed_before()),
                static_cast<ull>(consumer.bytes_pending()));
  }
}

// The daemon's stats, of args.job only when it names one.
absl::StatusOr<v1::GetStatsReply> GetStats(const AdminArgs& args, const char* what) {
  v1::GetStatsRequest request;
  request.set_job(args.job);
  v1::GetStatsReply reply;
  PF_RETURN_IF_ERROR(Call(args, what, [&](v1::Admin::Stub& stub, grpc::ClientContext& c) {
    return stub.GetStats(&c, request, &reply);
  }));
  return reply;
}

// The job's cost model fitted from its ranks' measured compute: each rate
// beside the prior's, how sure the fit is, and recent steps as measured and
// as each model has them.
absl::Status CostModel(const AdminArgs& args) {
  PF_ASSIGN_OR_RETURN(const v1::GetStatsReply reply, GetStats(args, "cost-model"));
  if (reply.jobs().empty()) return absl::NotFoundError(absl::StrCat("no job ", args.job));
  const v1::CostFitStats& fit = reply.jobs(0).cost_fit();
  if (args.json) {
    Print(fit, true);
    return absl::OkStatus();
  }
  std::printf(
      "job %s: cost model fitted from %lld measured microbatches (residual %.3g s); "
      "prior: %s\n",
      args.job.c_str(), static_cast<long long>(fit.rows()), fit.residual_rms_seconds(),
      fit.prior_name().c_str());
  if (fit.model_version() > 0 || fit.model_versions_missed() > 0) {
    std::printf("  plans by learned version %u from step %lld (%lld announced too late)\n",
                fit.model_version(), static_cast<long long>(fit.model_from_step()),
                static_cast<long long>(fit.model_versions_missed()));
  }
  std::printf("  %-7s %12s %12s %12s %9s\n", "rate", "fitted", "prior", "stddev", "data %");
  for (const v1::CostRate& rate : fit.rates()) {
    std::printf("  %-7s %12.4g %12.4g %12.3g %9.1f\n", rate.name().c_str(), rate.fitted(),
                rate.prior(), rate.stddev(), 100 * rate.determined());
  }
  std::printf(
      "  %8s %12s %12s %12s   (the slowest local rank, a step's last microbatch left "
      "out)\n",
      "step", "measured_s", "prior_s", "fitted_s");
  for (const v1::StepTimes& step : fit.recent_steps()) {
    std::printf("  %8lld %12.4f %12.4f %12.4f\n", static_cast<long long>(step.step()),
                step.measured_seconds(), step.prior_seconds(), step.fitted_seconds());
  }
  return absl::OkStatus();
}

absl::Status Stats(const AdminArgs& args) {
  PF_ASSIGN_OR_RETURN(const v1::GetStatsReply reply, GetStats(args, "stats"));
  if (args.json) {
    Print(reply, true);
    return absl::OkStatus();
  }
  for (const v1::JobStats& job : reply.jobs()) {
    std::printf(
        "job %s: %lld steps planned, %lld served; read %llu B of %llu B needed "
        "(I/O amplification %.2f); slowest rank %u, %lld steps behind\n",
        job.name().c_str(), static_cast<long long>(job.steps_planned()),
        static_cast<long long>(job.steps_served()),
        static_cast<unsigned long long>(job.bytes_read()),
        static_cast<unsigned long long>(job.unique_bytes_needed()), job.io_amplification(),
        job.slowest_rank(), static_cast<long long>(job.slowest_rank_steps_behind()));
    std::printf("  %llu B of samples held for the steps ahead, %llu B of side rows (peak %llu)\n",
                static_cast<unsigned long long>(job.cached_bytes()),
                static_cast<unsigned long long>(job.side_rows_bytes()),
                static_cast<unsigned long long>(job.peak_side_rows_bytes()));
    std::printf(
        "  trainers waited %.3f s for data; most input-bound: rank %u, %.1f%% of its "
        "time\n",
        job.wait_seconds(), job.most_waiting_rank(), 100 * job.input_bound());
    std::printf("  %6s %9s %14s %10s %8s %9s %14s %9s %9s %9s %7s %10s\n", "rank", "attached",
                "consumed_to", "next_step", "pushed", "released", "bytes_sent", "in_flight",
                "waited_s", "busy_s", "input%", "copied_out");
    for (const v1::RankStats& rank : job.ranks()) {
      const std::string consumed =
          absl::StrCat(rank.consumed_step(), ".", rank.consumed_microbatch());
      std::printf("  %6u %9s %14s %10lld %8llu %9llu %14llu %9u %9.3f %9.3f %7.1f %10llu\n",
                  rank.global_rank(), rank.attached() ? "yes" : "no", consumed.c_str(),
                  static_cast<long long>(rank.next_step()),
                  static_cast<unsigned long long>(rank.slots_pushed()),
                  static_cast<unsigned long long>(rank.slots_released()),
                  static_cast<unsigned long long>(rank.bytes_sent()), rank.slots_in_flight(),
                  rank.wait_seconds(), rank.busy_seconds(), 100 * rank.input_bound(),
                  static_cast<unsigned long long>(rank.copied_out()));
    }
  }
  const v1::StorageStats& storage = reply.storage();
  std::printf(
      "storage: read %llu B for %llu B distinct (I/O amplification %.2f); %llu B in flight, "
      "%llu B held (peak %llu, budget %llu), %u read threads\n",
      static_cast<unsigned long long>(storage.bytes_read()),
      static_cast<unsigned long long>(storage.distinct_bytes()), storage.io_amplification(),
      static_cast<unsigned long long>(storage.bytes_in_flight()),
      static_cast<unsigned long long>(storage.bytes_held()),
      static_cast<unsigned long long>(storage.peak_bytes_held()),
      static_cast<unsigned long long>(storage.memory_budget_bytes()), storage.read_threads());
  for (const v1::StorageFileStats& file : storage.files()) {
    std::printf(
        "  %s (%u jobs): %llu reads, %llu B for %llu B distinct (%.2f), latency p50 %.2f ms "
        "p99 %.2f ms max %.2f ms\n",
        file.path().c_str(), file.jobs(), static_cast<unsigned long long>(file.reads()),
        static_cast<unsigned long long>(file.bytes_read()),
        static_cast<unsigned long long>(file.distinct_bytes()), file.io_amplification(),
        file.read_latency_p50_ms(), file.read_latency_p99_ms(), file.read_latency_max_ms());
  }
  if (storage.reread_events() > 0) {
    std::printf("  %llu re-reads; the latest:\n",
                static_cast<unsigned long long>(storage.reread_events()));
    for (const v1::ReRead& reread : storage.rereads()) {
      std::printf("    job %s rank %u step %lld: %llu B (%llu samples) of %s\n",
                  reread.job().c_str(), reread.rank(), static_cast<long long>(reread.step()),
                  static_cast<unsigned long long>(reread.bytes()),
                  static_cast<unsigned long long>(reread.samples()), reread.path().c_str());
    }
  }
  for (const v1::IngestStreamStats& stream : reply.ingest_streams()) PrintIngest(stream);
  return absl::OkStatus();
}

absl::Status Ledger(const AdminArgs& args) {
  v1::GetLedgerRequest request;
  request.set_job(args.job);
  v1::GetLedgerReply reply;
  PF_RETURN_IF_ERROR(Call(args, "ledger", [&](v1::Admin::Stub& stub, grpc::ClientContext& c) {
    return stub.GetLedger(&c, request, &reply);
  }));
  uint64_t faults = 0;
  for (const v1::JobLedger& job : reply.jobs()) {
    for (const v1::RankLedger& rank : job.ranks()) faults += rank.duplicates() + rank.gaps();
  }
  if (args.json) {
    Print(reply, true);
  } else {
    for (const v1::JobLedger& job : reply.jobs()) {
      std::printf("job %s: ledger %s\n", job.name().c_str(),
                  job.journal().empty() ? "in memory only" : job.journal().c_str());
      std::printf("  %6s %10s %14s %12s %10s %10s %5s %7s %7s\n", "rank", "from_step",
                  "next(step.mb)", "microbatches", "samples", "duplicates", "gaps", "rewinds",
                  "claimed");
      for (const v1::RankLedger& rank : job.ranks()) {
        const std::string next = absl::StrCat(rank.next_step(), ".", rank.next_microbatch());
        std::printf("  %6u %10lld %14s %12llu %10llu %10llu %5llu %7llu %7llu\n",
                    rank.global_rank(), static_cast<long long>(rank.first_step()), next.c_str(),
                    static_cast<unsigned long long>(rank.microbatches()),
                    static_cast<unsigned long long>(rank.samples()),
                    static_cast<unsigned long long>(rank.duplicates()),
                    static_cast<unsigned long long>(rank.gaps()),
                    static_cast<unsigned long long>(rank.rewinds()),
                    static_cast<unsigned long long>(rank.claimed()));
        for (const v1::LedgerEpoch& epoch : rank.epochs()) {
          std::printf("         dataset %u epoch %lld: %llu samples, digest %016llx\n",
                      epoch.dataset(), static_cast<long long>(epoch.epoch()),
                      static_cast<unsigned long long>(epoch.samples()),
                      static_cast<unsigned long long>(epoch.digest()));
        }
      }
    }
  }
  if (args.check && faults > 0) {
    return absl::DataLossError(
        absl::StrCat("the ledger holds ", faults, " duplicated or skipped microbatches"));
  }
  return absl::OkStatus();
}

absl::Status PlanStep(const AdminArgs& args) {
  v1::GetPlanRequest request;
  request.set_job(args.job);
  request.set_step(args.step);
  v1::GetPlanReply reply;
  PF_RETURN_IF_ERROR(Call(args, "plan-step", [&](v1::Admin::Stub& stub, grpc::ClientContext& c) {
    return stub.GetPlan(&c, request, &reply);
  }));
  if (args.json) {
    Print(reply, true);
    return absl::OkStatus();
  }
  std::printf(
      "job %s step %lld: %u microbatches, step/ideal %.4f, %lld real of %lld padded tokens\n",
      reply.job().c_str(), static_cast<long long>(reply.step()), reply.num_microbatches(),
      reply.step_over_ideal(), static_cast<long long>(reply.real_sum()),
      static_cast<long long>(reply.padded_sum()));
  if (reply.cost_model_version() > 0) {
    std::printf("  planned by learned cost model version %u\n", reply.cost_model_version());
  }
  for (const v1::PlannedRank& rank : reply.ranks()) {
    std::printf("  dp-cp rank %u: tokens [%s] cp [%s]\n", rank.dp_cp_rank(),
                absl::StrJoin(rank.tokens(), " ").c_str(),
                absl::StrJoin(rank.cp_size(), " ").c_str());
  }
  return absl::OkStatus();
}

absl::Status Health(const AdminArgs& args) {
  v1::HealthReply reply;
  PF_RETURN_IF_ERROR(Call(args, "health", [&](v1::Admin::Stub& stub, grpc::ClientContext& c) {
    return stub.Health(&c, {}, &reply);
  }));
  if (args.json) {
    Print(reply, true);
  } else {
    std::printf("%s: packfeedd %s, %u job(s), %u rank(s) attached\n",
                reply.serving() ? "serving" : "draining", reply.version().c_str(), reply.jobs(),
                reply.attached_ranks());
  }
  return absl::OkStatus();
}

absl::Status Drain(const AdminArgs& args) {
  v1::DrainRequest request;
  request.set_auth_token(args.token);
  v1::DrainReply reply;
  return Call(args, "drain", [&](v1::Admin::Stub& stub, grpc::ClientContext& c) {
    return stub.Drain(&c, request, &reply);
  });
}

// binary16 / bfloat16 bits as a float.
float HalfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                          : exponent == 31
                              ? (mantissa != 0 ? NAN : INFINITY)
                              : std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  return (h & 0x8000) != 0 ? -magnitude : magnitude;
}
float Bfloat16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

template <typename T>
T Load(const void* data, size_t i) {
  T value;
  std::memcpy(&value, static_cast<const char*>(data) + i * sizeof(T), sizeof(T));
  return value;
}

// The values of a field as JSON: a scalar for a 0-d field, else a flat list.
nlohmann::json FieldValues(const client::FieldView& field) {
  using ::packfeed::ElementType;
  const size_t count = field.bytes / ElementSize(field.dtype);
  nlohmann::json values = nlohmann::json::array();
  for (size_t i = 0; i < count; ++i) {
    switch (field.dtype) {
      case ElementType::kInt8:
        values.push_back(Load<int8_t>(field.data, i));
        break;
      case ElementType::kUInt8:
        values.push_back(Load<uint8_t>(field.data, i));
        break;
      case ElementType::kInt16:
        values.push_back(Load<int16_t>(field.data, i));
        break;
      case ElementType::kUInt16:
        values.push_back(Load<uint16_t>(field.data, i));
        break;
      case ElementType::kInt32:
        values.push_back(Load<int32_t>(field.data, i));
        break;
      case ElementType::kInt64:
        values.push_back(Load<int64_t>(field.data, i));
        break;
      case ElementType::kFloat16:
        values.push_back(HalfToFloat(Load<uint16_t>(field.data, i)));
        break;
      case ElementType::kBFloat16:
        values.push_back(Bfloat16ToFloat(Load<uint16_t>(field.data, i)));
        break;
      case ElementType::kFloat32:
        values.push_back(Load<float>(field.data, i));
        break;
      case ElementType::kBool:
        values.push_back(Load<uint8_t>(field.data, i) != 0);
        break;
      default:
        values.push_back(nullptr);
    }
  }
  if (field.shape.empty()) return values[0];
  return values;
}

absl::Status Dump(const AdminArgs& args) {
  client::ClientOptions options;
  options.socket_path = args.socket;
  options.daemon_address = args.address;
  options.tls_ca_file = args.tls_ca;
  options.tls_cert_file = args.tls_cert;
  options.tls_key_file = args.tls_key;
  options.ucx_transports = args.ucx_transports;
  options.job = args.job;
  options.global_rank = args.rank;
  options.auth_token = args.token;
  options.admin_token = args.admin_token;
  options.start_step = args.step;
  options.fingerprint = args.fingerprint;
  options.slot_bytes = args.slot_bytes;
  options.placement = RingPlacement::kHost;
  options.sharing = args.ring_sharing == "fd"    ? client::RingSharing::kFileDescriptor
                    : args.ring_sharing == "ucx" ? client::RingSharing::kUcx
                                                 : client::RingSharing::kAuto;
  // An operator's look: a daemon that goes away ends it at once.
  options.reconnect_timeout = absl::ZeroDuration();
  PF_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client, client::Client::Attach(options));
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (int64_t s = 0; s < args.steps; ++s) {
    PF_ASSIGN_OR_RETURN(client::StepInfo info, client->NextStep(absl::Seconds(60)));
    nlohmann::ordered_json step;
    step["step"] = info.step;
    step["num_microbatches"] = info.num_microbatches;
    step["flops"] = {{"padded_sum", info.padded_sum},
                     {"padded_squared_sum", info.padded_squared_sum},
                     {"real_sum", info.real_sum},
                     {"real_squared_sum", info.real_squared_sum}};
    nlohmann::ordered_json microbatches = nlohmann::ordered_json::array();
    for (int m = 0; m < info.num_microbatches; ++m) {
      PF_ASSIGN_OR_RETURN(client::Microbatch microbatch, client->Next(absl::Seconds(60)));
      auto fields_of = [](const client::Microbatch& view) {
        nlohmann::ordered_json fields = nlohmann::ordered_json::object();
        for (const client::FieldView& field : view.fields) fields[field.name] = FieldValues(field);
        return fields;
      };
      if (client->num_chunks() == 1) {
        microbatches.push_back(fields_of(microbatch));
        continue;
      }
      // Under VPP: what each model chunk's iterator gets.
      nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
      for (int chunk = 0; chunk < client->num_chunks(); ++chunk) {
        chunks.push_back(fields_of(microbatch.Chunk(chunk)));
      }
      microbatches.push_back({{"chunks", std::move(chunks)}});
    }
    step["microbatches"] = std::move(microbatches);
    steps.push_back(std::move(step));
  }
  nlohmann::ordered_json out;
  out["job"] = args.job;
  out["rank"] = args.rank;
  out["fingerprint"] = client->fingerprint();
  out["steps"] = std::move(steps);
  std::printf("%s\n", args.json ? out.dump().c_str() : out.dump(1).c_str());
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(args.hold_seconds));
  return absl::OkStatus();
}

CLI::App* AddCommand(CLI::App& app, const char* name, const char* help,
                     const std::shared_ptr<AdminArgs>& args) {
  CLI::App* command = app.add_subcommand(name, help);
  command->add_option("--socket", args->socket, "packfeedd's socket")->capture_default_str();
  const bool rank = std::string(name) == "dump";
  command->add_option("--address", args->address,
                      rank ? "Attach over the daemon's admin_tcp_address (host:port) instead, "
                             "as a rank on a node without a daemon (ranks_over_tcp)"
                           : "Ask the daemon's admin_tcp_address (host:port) instead");
  command->add_option("--admin-token", args->admin_token,
                      rank ? "With --address: admin_tcp_token, to start before where the rank "
                             "stands (a rewind)"
                           : "With --address: admin_tcp_token");
  command->add_option("--tls-ca", args->tls_ca,
                      "With --address under admin_tls: the CA that signed the daemon's "
                      "certificate (PEM)");
  command->add_option("--tls-cert", args->tls_cert,
                      "With mutual TLS: this client's certificate (PEM)");
  command->add_option("--tls-key", args->tls_key, "With mutual TLS: its key (PEM)");
  command->add_flag("--json", args->json, "Print JSON");
  return command;
}

}  // namespace

void AddAdminCommands(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<AdminArgs>();
  AddCommand(app, "jobs", "List a daemon's jobs", args)->callback([args, exit_code] {
    *exit_code = ExitCode(Jobs(*args));
  });
  AddCommand(app, "stats", "Per-job and per-rank serving figures", args)
      ->callback([args, exit_code] { *exit_code = ExitCode(Stats(*args)); })
      ->add_option("--job", args->job, "Only this job");
  CLI::App* cost =
      AddCommand(app, "cost-model", "The cost model fitted from the job's measured compute", args);
  cost->add_option("--job", args->job, "Job")->required();
  cost->callback([args, exit_code] { *exit_code = ExitCode(CostModel(*args)); });
  CLI::App* ledger = AddCommand(app, "ledger", "What each rank consumed, per dataset epoch", args);
  ledger->add_option("--job", args->job, "Only this job");
  ledger->add_flag("--check", args->check,
                   "Exit non-zero when any rank has a duplicated or skipped microbatch");
  ledger->callback([args, exit_code] { *exit_code = ExitCode(Ledger(*args)); });
  CLI::App* plan = AddCommand(app, "plan-step", "Dry-run a step's plan on a running daemon", args);
  plan->add_option("--job", args->job, "Job")->required();
  plan->add_option("step", args->step, "Step")->required();
  plan->callback([args, exit_code] { *exit_code = ExitCode(PlanStep(*args)); });
  AddCommand(app, "health", "Is the daemon serving", args)->callback([args, exit_code] {
    *exit_code = ExitCode(Health(*args));
  });
  CLI::App* drain = AddCommand(app, "drain", "Stop the daemon after goodbyes to every rank", args);
  drain->add_option("--token", args->token, "Auth token (every job's that has one)");
  drain->callback([args, exit_code] { *exit_code = ExitCode(Drain(*args)); });
  CLI::App* dump =
      AddCommand(app, "dump", "Attach as a rank and print every field it receives", args);
  dump->add_option("--job", args->job, "Job")->required();
  dump->add_option("--rank", args->rank, "Global rank")->required();
  dump->add_option("--steps", args->steps, "Steps to receive")->capture_default_str();
  dump->add_option("--start-step", args->step, "First step")->capture_default_str();
  dump->add_option("--token", args->token, "The job's auth token");
  dump->add_option("--fingerprint", args->fingerprint, "Refuse a job with another fingerprint");
  dump->add_option("--slot-bytes", args->slot_bytes, "Ring slot size (0 = what the job needs)");
  dump->add_option("--hold-seconds", args->hold_seconds,
                   "Stay attached this long after printing (to inspect the daemon meanwhile)");
  dump->add_option("--ring-sharing", args->ring_sharing,
                   "How the daemon gets the ring: auto, fd (a memfd it maps) or ucx (UCX's "
                   "shared memory)")
      ->check(CLI::IsMember({"auto", "fd", "ucx"}))
      ->capture_default_str();
  dump->add_option("--ucx-transports", args->ucx_transports,
                   "UCX's transports for the ring (UCX_TLS syntax; default: UCX's choice)");
  dump->callback([args, exit_code] { *exit_code = ExitCode(Dump(*args)); });
}

}  // namespace packfeed::server::ctl
