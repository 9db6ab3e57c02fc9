// packfeed._native: the C++ client for Python. Thin on purpose: options in,
// microbatches out as DLPack capsules (zero-copy views of the ring slot),
// or (next_batches) as the torch tensors of the Megatron dicts the Python
// package (client/python/packfeed) hands out.
//
// Errors: every absl::Status becomes a Python exception in Raise(), the one
// place that does it (classes in packfeed/errors.py, chosen by status code).
// Blocking calls run without the GIL.

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "packfeed/client/client.h"
#include "packfeed/client/producer.h"
#include "packfeed/common/defaults.h"
#include "packfeed/common/version.h"

namespace py = pybind11;

namespace packfeed::client {
namespace {

[[noreturn]] void Raise(const absl::Status& status) {
  py::object error_class = py::module_::import("packfeed.errors")
                               .attr("class_for")(absl::StatusCodeToString(status.code()));
  PyErr_SetString(error_class.ptr(), std::string(status.message()).c_str());
  throw py::error_already_set();
}

template <typename T>
T ValueOrRaise(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return *std::move(value);
}

absl::Duration Timeout(std::optional<double> seconds) {
  return seconds.has_value() ? absl::Seconds(*seconds) : absl::InfiniteDuration();
}

absl::StatusOr<RingPlacement> Placement(const std::string& name) {
  if (name == "auto") return RingPlacement::kAuto;
  if (name == "host") return RingPlacement::kHost;
  if (name == "device") return RingPlacement::kDevice;
  if (name == "staged") return RingPlacement::kStagedDevice;
  if (name == "daemon") return RingPlacement::kDaemonDevice;
  return absl::InvalidArgumentError("placement '" + name +
                                    "': expected 'auto', 'host', 'device', 'staged' or 'daemon'");
}

// DLPack 0.8's bool type code; the header here is 0.6, which has none.
constexpr uint8_t kDLBoolCode = 6;

DLDataType DlType(ElementType type, bool native_bool) {
  const uint8_t bits = static_cast<uint8_t>(ElementSize(type) * 8);
  switch (type) {
    case ElementType::kInt8:
    case ElementType::kInt16:
    case ElementType::kInt32:
    case ElementType::kInt64:
      return {kDLInt, bits, 1};
    case ElementType::kFloat16:
    case ElementType::kFloat32:
    case ElementType::kFloat64:
      return {kDLFloat, bits, 1};
    case ElementType::kBFloat16:
      return {kDLBfloat, bits, 1};
    case ElementType::kBool:
      return {native_bool ? kDLBoolCode : static_cast<uint8_t>(kDLUInt), bits, 1};
    default:
      return {kDLUInt, bits, 1};
  }
}

// A DLPack tensor over `data`, holding `owner`: for a field, its microbatch,
// so that the slot goes back to the daemon when the last tensor of every
// field is freed (DLPack's deleter).
struct ExportedTensor {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::shared_ptr<const void> owner;
};

py::capsule MakeCapsule(const void* data, DLDevice device, DLDataType dtype,
                        std::vector<int64_t> shape, std::shared_ptr<const void> owner) {
  auto* exported = new ExportedTensor{{}, std::move(shape), std::move(owner)};
  DLTensor& tensor = exported->managed.dl_tensor;
  tensor.data = const_cast<void*>(data);
  tensor.device = device;
  tensor.ndim = static_cast<int32_t>(exported->shape.size());
  tensor.dtype = dtype;
  tensor.shape = exported->shape.data();
  tensor.strides = nullptr;  // compact, row-major
  tensor.byte_offset = 0;
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportedTensor*>(self->manager_ctx);
  };
  // A capsule nobody consumed (still named "dltensor") frees the tensor.
  PyObject* capsule = PyCapsule_New(&exported->managed, "dltensor", [](PyObject* self) {
    if (PyCapsule_IsValid(self, "dltensor")) {
      auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(self, "dltensor"));
      managed->deleter(managed);
    }
  });
  if (capsule == nullptr) {
    exported->managed.deleter(&exported->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

// torch's objects the hot path uses, looked up once (leaked on purpose: a
// static destroyed after the interpreter would touch freed objects).
struct TorchHandles {
  py::object from_dlpack;  // torch._C._from_dlpack
  py::object bool_dtype;   // torch.bool
  // Whether this torch reads DLPack's bool (2.x does; 1.13 refuses it):
  // then bool fields need no view, which costs as much as every other
  // field's tensor together with cold caches.
  bool native_bool = false;
};

bool AcceptsDlpackBool(const py::object& from_dlpack) {
  static const uint8_t kTrue = 1;
  try {
    from_dlpack(MakeCapsule(&kTrue, DLDevice{kDLCPU, 0}, {kDLBoolCode, 8, 1}, {1}, nullptr));
    return true;
  } catch (const py::error_already_set&) {
    return false;
  }
}

const TorchHandles& Torch() {
  static const TorchHandles* handles = [] {
    auto* torch = new TorchHandles{py::module_::import("torch._C").attr("_from_dlpack"),
                                   py::module_::import("torch").attr("bool")};
    torch->native_bool = AcceptsDlpackBool(torch->from_dlpack);
    return torch;
  }();
  return *handles;
}

// A field's tensor as a capsule: bools as DLPack bools with `native_bool`,
// else as uint8 for the caller to view.
py::capsule ToCapsule(const FieldView& field, int cuda_device,
                      std::shared_ptr<const Microbatch> microbatch, bool native_bool) {
  const DLDevice device = microbatch->memory_kind == MemoryKind::kCuda
                              ? DLDevice{kDLCUDA, cuda_device}
                              : DLDevice{kDLCPU, 0};
  return MakeCapsule(field.data, device, DlType(field.dtype, native_bool), field.shape,
                     std::move(microbatch));
}

std::shared_ptr<Client> Attach(const std::string& socket_path, const std::string& job,
                               int global_rank, const std::string& fingerprint,
                               const std::string& auth_token, int64_t start_step,
                               int start_microbatch, std::optional<int64_t> start_sample,
                               bool elastic, uint32_t slots, uint64_t slot_bytes,
                               const std::string& placement, int cuda_device,
                               const std::string& ucx_transports, double attach_timeout,
                               double reconnect_timeout, const std::string& daemon_address,
                               const std::string& tls_ca, const std::string& tls_cert,
                               const std::string& tls_key, const std::string& admin_token) {
  ClientOptions options;
  options.socket_path = socket_path;
  options.daemon_address = daemon_address;
  options.tls_ca_file = tls_ca;
  options.tls_cert_file = tls_cert;
  options.tls_key_file = tls_key;
  options.job = job;
  options.global_rank = global_rank;
  options.fingerprint = fingerprint;
  options.auth_token = auth_token;
  options.admin_token = admin_token;
  options.start_step = start_step;
  options.start_microbatch = start_microbatch;
  options.start_sample = start_sample;
  options.elastic = elastic;
  options.slots = slots;
  options.slot_bytes = slot_bytes;
  options.placement = ValueOrRaise(Placement(placement));
  options.cuda_device = cuda_device;
  options.ucx_transports = ucx_transports;
  options.attach_timeout = absl::Seconds(attach_timeout);
  options.reconnect_timeout = absl::Seconds(reconnect_timeout);
  absl::StatusOr<std::unique_ptr<Client>> client;
  {
    py::gil_scoped_release release;
    client = Client::Attach(options);
  }
  return std::shared_ptr<Client>(ValueOrRaise(std::move(client)));
}

py::dict NextStep(Client& client, std::optional<double> timeout) {
  absl::StatusOr<StepInfo> info;
  {
    py::gil_scoped_release release;
    info = client.NextStep(Timeout(timeout));
  }
  const StepInfo step = ValueOrRaise(std::move(info));
  py::dict out;
  out["step"] = step.step;
  out["num_microbatches"] = step.num_microbatches;
  out["first_microbatch"] = step.first_microbatch;
  out["padded_sum"] = step.padded_sum;
  out["padded_squared_sum"] = step.padded_squared_sum;
  out["real_sum"] = step.real_sum;
  out["real_squared_sum"] = step.real_squared_sum;
  return out;
}

// {"step", "microbatch", "fields": [(name, dtype name, capsule), ...],
//  "host_copies": {name: bytes} (a staged ring's small fields),
//  "copied_out": the tensors are a private copy, not the ring's memory}.
// Bools as uint8: any DLPack reader takes them, and this path needs no torch.
// `cuda_stream`: the cudaStream_t (torch's Stream.cuda_stream) that reads a
// staged microbatch.
py::dict Next(const std::shared_ptr<Client>& client, std::optional<double> timeout,
              uintptr_t cuda_stream) {
  absl::StatusOr<Microbatch> next;
  {
    py::gil_scoped_release release;
    next = client->Next(Timeout(timeout), reinterpret_cast<void*>(cuda_stream));
  }
  auto microbatch = std::make_shared<const Microbatch>(ValueOrRaise(std::move(next)));
  py::list fields;
  py::dict host_copies;
  for (const FieldView& field : microbatch->fields) {
    if (!field.host_copy.empty()) host_copies[py::str(field.name)] = py::bytes(field.host_copy);
    fields.append(py::make_tuple(field.name, std::string(ElementTypeName(field.dtype)),
                                 ToCapsule(field, client->options().cuda_device, microbatch,
                                           /*native_bool=*/false)));
  }
  py::dict out;
  out["step"] = microbatch->step;
  out["microbatch"] = microbatch->microbatch;
  out["fields"] = std::move(fields);
  out["host_copies"] = std::move(host_copies);
  out["copied_out"] = microbatch->copied_out;
  return out;
}

// A one-element integer field (max_seqlen, local_cp_size) as an int, read
// without waiting for the device where its bytes are on the host (a staged
// ring's host copy, a host ring); else through torch, which waits.
py::object SmallInt(const FieldView& field, MemoryKind memory, const py::object& tensor) {
  const void* bytes = field.host_copy.empty() ? field.data : field.host_copy.data();
  if (!field.host_copy.empty() || memory == MemoryKind::kHost) {
    if (field.dtype == ElementType::kInt32) {
      int32_t value = 0;
      std::memcpy(&value, bytes, sizeof(value));
      return py::int_(value);
    }
    if (field.dtype == ElementType::kInt64) {
      int64_t value = 0;
      std::memcpy(&value, bytes, sizeof(value));
      return py::int_(value);
    }
  }
  return py::int_(tensor);
}

// PackedSeqParams' arguments for a THD microbatch (packfeed.megatron's
// packed_seq_params builds the object); None for Megatron's BSHD batch,
// which carries no cu_seqlens.
struct PackedLengths {
  py::object cu_seqlens = py::none();
  py::object cu_seqlens_padded = py::none();
  py::object max_seqlen = py::none();
  py::object local_cp_size = py::none();
};
py::object PackedSeqParams(const PackedLengths& lengths) {
  if (lengths.cu_seqlens.is_none()) return py::none();
  if (lengths.max_seqlen.is_none()) {
    Raise(absl::DataLossError("a THD microbatch without max_seqlen"));
  }
  py::dict params;
  params["qkv_format"] = "thd";
  params["cu_seqlens_q"] = lengths.cu_seqlens;
  params["cu_seqlens_kv"] = lengths.cu_seqlens;
  params["cu_seqlens_q_padded"] = lengths.cu_seqlens_padded;
  params["cu_seqlens_kv_padded"] = lengths.cu_seqlens_padded;
  params["max_seqlen_q"] = lengths.max_seqlen;
  params["max_seqlen_kv"] = lengths.max_seqlen;
  params["local_cp_size"] = lengths.local_cp_size;
  return params;
}

// The one builder of the dicts packfeed.Client hands out (client.py's
// Batch), here because the Python loop over the fields cost more than the
// whole C++ Next (docs/PYTHON.md, "Speed"). Takes the next microbatch and
// returns one dict per model chunk (`chunks` > 1: VPP, where a field NAME@K
// goes to chunk K only, under NAME): a copy of `keys` (Megatron's keys,
// each None), every field as a torch tensor, and "packed_seq_params".
// Tensors view the slot, or with `copy` are owned clones (on the current
// stream), and the slot goes back as soon as the views are gone.
py::list NextBatches(const std::shared_ptr<Client>& client, std::optional<double> timeout,
                     uintptr_t cuda_stream, const py::dict& keys, bool copy, int chunks) {
  absl::StatusOr<Microbatch> next;
  {
    py::gil_scoped_release release;
    next = client->Next(Timeout(timeout), reinterpret_cast<void*>(cuda_stream));
  }
  auto microbatch = std::make_shared<const Microbatch>(ValueOrRaise(std::move(next)));
  const TorchHandles& torch = Torch();
  std::vector<py::dict> batches;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    batches.push_back(py::reinterpret_steal<py::dict>(PyDict_Copy(keys.ptr())));
  }
  PackedLengths lengths;
  for (const FieldView& field : microbatch->fields) {
    py::object tensor = torch.from_dlpack(
        ToCapsule(field, client->options().cuda_device, microbatch, torch.native_bool));
    if (field.dtype == ElementType::kBool && !torch.native_bool) {
      tensor = tensor.attr("view")(torch.bool_dtype);
    }
    if (copy) tensor = tensor.attr("clone")();
    if (field.name == "cu_seqlens") lengths.cu_seqlens = tensor;
    if (field.name == "cu_seqlens_padded") lengths.cu_seqlens_padded = tensor;
    if (field.name == "max_seqlen") {
      lengths.max_seqlen = SmallInt(field, microbatch->memory_kind, tensor);
    }
    if (field.name == "local_cp_size") {
      lengths.local_cp_size = SmallInt(field, microbatch->memory_kind, tensor);
    }
    // NAME@K: model chunk K's field (FieldsOfStage), served as NAME.
    const size_t at = field.name.find('@');
    if (at == std::string::npos) {
      for (py::dict& batch : batches) batch[py::str(field.name)] = tensor;
      continue;
    }
    const int owner = std::stoi(field.name.substr(at + 1));
    if (owner >= 0 && owner < chunks) batches[owner][py::str(field.name.substr(0, at))] = tensor;
  }
  py::object params = PackedSeqParams(lengths);
  py::list out;
  for (py::dict& batch : batches) {
    batch["packed_seq_params"] = params;
    out.append(std::move(batch));
  }
  return out;
}

std::shared_ptr<Producer> MakeProducer(const std::string& socket_path, const std::string& stream,
                                       const std::string& auth_token) {
  ProducerOptions options;
  options.socket_path = socket_path;
  options.stream = stream;
  options.auth_token = auth_token;
  absl::StatusOr<std::unique_ptr<Producer>> producer;
  {
    py::gil_scoped_release release;
    producer = Producer::Create(options);
  }
  return std::shared_ptr<Producer>(ValueOrRaise(std::move(producer)));
}

absl::Span<const char> BytesOf(const py::buffer_info& info) {
  return {static_cast<const char*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)};
}

// `samples`: (group, tag, tokens, [field buffers in `fields` order]) each;
// tokens a contiguous int64 buffer, fields contiguous buffers of their bytes
// (packfeed.Producer prepares them).
py::dict Put(Producer& producer, int64_t step, const std::vector<std::string>& fields,
             const py::list& samples, double wait_seconds) {
  std::vector<py::buffer_info> held;  // keeps the views alive through the call
  held.reserve(samples.size() * (1 + fields.size()));
  std::vector<ProducerSample> out;
  for (const py::handle& item : samples) {
    const py::tuple sample = item.cast<py::tuple>();
    ProducerSample& s = out.emplace_back();
    s.group = sample[0].cast<int64_t>();
    s.tag = sample[1].cast<int64_t>();
    const py::buffer_info& tokens = held.emplace_back(sample[2].cast<py::buffer>().request());
    // (NumPy spells int64 "l" on LP64, the buffer protocol's canonical "q".)
    if (tokens.itemsize != sizeof(int64_t) || (tokens.format != "q" && tokens.format != "l")) {
      Raise(absl::InvalidArgumentError("tokens must be int64"));
    }
    s.tokens = {static_cast<const int64_t*>(tokens.ptr), static_cast<size_t>(tokens.size)};
    for (const py::handle& field : sample[3].cast<py::list>()) {
      s.fields.push_back(BytesOf(held.emplace_back(field.cast<py::buffer>().request())));
    }
  }
  absl::StatusOr<PutResult> reply;
  {
    py::gil_scoped_release release;
    reply = producer.Put(step, fields, out, absl::Seconds(wait_seconds));
  }
  const PutResult put = ValueOrRaise(std::move(reply));
  py::dict result;
  result["samples_held"] = put.samples_held;
  result["bytes_held"] = put.bytes_held;
  return result;
}

py::dict StreamStats(const IngestStreamStatus& stats) {
  py::dict out;
  out["name"] = stats.name;
  out["bytes_held"] = stats.bytes_held;
  out["peak_bytes_held"] = stats.peak_bytes_held;
  out["budget_bytes"] = stats.budget_bytes;
  out["samples_put"] = stats.samples_put;
  out["bytes_put"] = stats.bytes_put;
  out["puts_waited"] = stats.puts_waited;
  out["puts_in_one_call"] = stats.puts_in_one_call;
  out["puts_refused"] = stats.puts_refused;
  py::list steps;
  for (const IngestStreamStatus::Step& step : stats.steps) {
    py::dict s;
    s["step"] = step.step;
    s["sealed"] = step.sealed;
    s["samples"] = step.samples;
    s["bytes"] = step.bytes;
    s["consumed_by"] = step.consumed_by;
    steps.append(s);
  }
  out["steps"] = steps;
  py::list consumers;
  for (const IngestStreamStatus::Consumer& consumer : stats.consumers) {
    py::dict c;
    c["job"] = consumer.job;
    c["consumed_before"] = consumer.consumed_before;
    c["bytes_pending"] = consumer.bytes_pending;
    consumers.append(c);
  }
  out["consumers"] = consumers;
  return out;
}

}  // namespace
}  // namespace packfeed::client

PYBIND11_MODULE(_native, m) {
  m.attr("__version__") = packfeed::kPackfeedVersion;
  m.attr("DEFAULT_SOCKET") = packfeed::kDefaultSocketPath;
  m.attr("DEFAULT_RECONNECT_TIMEOUT") = static_cast<double>(packfeed::kDefaultReconnectSeconds);
  using namespace packfeed::client;
  m.doc() = "packfeed's C++ client; use the packfeed package, not this module";
  py::class_<Client, std::shared_ptr<Client>>(m, "Client")
      .def("next_step", &NextStep, py::arg("timeout") = py::none())
      .def("next", &Next, py::arg("timeout") = py::none(), py::arg("cuda_stream") = 0)
      .def("detach",
           [](Client& client) {
             absl::Status status;
             {
               py::gil_scoped_release release;
               status = client.Detach();
             }
             if (!status.ok()) Raise(status);
           })
      .def("ring",
           [](const Client& client) {
             const RingUse use = client.Ring();
             py::dict out;
             out["slots"] = use.slots;
             out["held"] = use.held;
             out["handed_out"] = use.handed_out;
             out["copied_out"] = use.copied_out;
             out["device_ring_fallback"] = client.DeviceRingFallback();
             return out;
           })
      .def("state",
           [](const Client& client) {
             const ClientState state = client.State();
             py::dict out;
             out["job"] = state.job;
             out["fingerprint"] = state.fingerprint;
             out["next_step"] = state.next_step;
             out["next_microbatch"] = state.next_microbatch;
             return out;
           })
      .def("times",
           [](const Client& client) {
             const packfeed::client::TrainerTimes times = client.Times();
             py::dict out;
             out["wait_seconds"] = absl::ToDoubleSeconds(times.waited);
             out["busy_seconds"] = absl::ToDoubleSeconds(times.busy);
             out["calls"] = times.calls;
             out["input_bound"] = times.input_bound();
             return out;
           })
      .def("next_batches", &NextBatches, py::arg("timeout"), py::arg("cuda_stream"),
           py::arg("keys"), py::arg("copy"), py::arg("chunks"))
      .def_property_readonly("fingerprint", &Client::fingerprint)
      .def_property_readonly("num_chunks", &Client::num_chunks)
      .def_property_readonly("memory_kind", [](const Client& client) {
        return client.memory_kind() == packfeed::MemoryKind::kCuda ? "cuda" : "host";
      });
  py::class_<Producer, std::shared_ptr<Producer>>(m, "Producer")
      .def("put", &Put, py::arg("step"), py::arg("fields"), py::arg("samples"),
           py::arg("wait_seconds"))
      .def("seal",
           [](Producer& producer, int64_t step) {
             absl::StatusOr<packfeed::client::SealResult> sealed;
             {
               py::gil_scoped_release release;
               sealed = producer.Seal(step);
             }
             const packfeed::client::SealResult reply = ValueOrRaise(std::move(sealed));
             py::dict out;
             out["samples"] = reply.samples;
             out["groups"] = reply.groups;
             out["peers_behind"] = reply.peers_behind;
             return out;
           })
      .def("status",
           [](Producer& producer) {
             absl::StatusOr<packfeed::client::IngestStreamStatus> stats;
             {
               py::gil_scoped_release release;
               stats = producer.Status();
             }
             return StreamStats(ValueOrRaise(std::move(stats)));
           })
      .def_property_readonly("arena_bytes", &Producer::arena_bytes)
      .def_property_readonly("arena_bytes_written", &Producer::arena_bytes_written);
  m.def("producer", &MakeProducer, py::arg("socket_path"), py::arg("stream"),
        py::arg("auth_token"));
  m.def("attach", &Attach, py::arg("socket_path"), py::arg("job"), py::arg("global_rank"),
        py::arg("fingerprint"), py::arg("auth_token"), py::arg("start_step"),
        py::arg("start_microbatch"), py::arg("start_sample"), py::arg("elastic"), py::arg("slots"),
        py::arg("slot_bytes"), py::arg("placement"), py::arg("cuda_device"),
        py::arg("ucx_transports"), py::arg("attach_timeout"), py::arg("reconnect_timeout"),
        py::arg("daemon_address") = "", py::arg("tls_ca") = "", py::arg("tls_cert") = "",
        py::arg("tls_key") = "", py::arg("admin_token") = "");
}
