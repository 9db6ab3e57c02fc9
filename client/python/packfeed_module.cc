// packfeed._native: the C++ client for Python. Thin on purpose: options in,
// microbatches out as DLPack capsules (zero-copy views of the ring slot);
// the Python package (client/python/packfeed) builds the Megatron dict.
//
// Errors: every absl::Status becomes a Python exception in Raise(), the one
// place that does it (classes in packfeed/errors.py, chosen by status code).
// Blocking calls run without the GIL.

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "packfeed/client/client.h"
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

absl::StatusOr<transport::RingPlacement> Placement(const std::string& name) {
  if (name == "auto") return transport::RingPlacement::kAuto;
  if (name == "host") return transport::RingPlacement::kHost;
  if (name == "device") return transport::RingPlacement::kDevice;
  return absl::InvalidArgumentError("placement '" + name +
                                    "': expected 'auto', 'host' or 'device'");
}

// DLPack 0.6 has no bool: bools travel as uint8 and Python views them back.
DLDataType DlType(transport::ElementType type) {
  using transport::ElementType;
  const uint8_t bits = static_cast<uint8_t>(transport::ElementSize(type) * 8);
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
    default:
      return {kDLUInt, bits, 1};
  }
}

// A field's DLPack tensor; owns a reference to the client so the ring it
// points into outlives every tensor made from it.
struct ExportedField {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::shared_ptr<Client> owner;
};

py::capsule ToCapsule(const FieldView& field, transport::MemoryKind kind, int cuda_device,
                      std::shared_ptr<Client> owner) {
  auto* exported = new ExportedField{{}, field.shape, std::move(owner)};
  DLTensor& tensor = exported->managed.dl_tensor;
  tensor.data = const_cast<void*>(field.data);
  tensor.device =
      kind == transport::MemoryKind::kCuda ? DLDevice{kDLCUDA, cuda_device} : DLDevice{kDLCPU, 0};
  tensor.ndim = static_cast<int32_t>(exported->shape.size());
  tensor.dtype = DlType(field.dtype);
  tensor.shape = exported->shape.data();
  tensor.strides = nullptr;  // compact, row-major
  tensor.byte_offset = 0;
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportedField*>(self->manager_ctx);
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

std::shared_ptr<Client> Attach(const std::string& socket_path, const std::string& job,
                               int global_rank, const std::string& fingerprint,
                               const std::string& auth_token, int64_t start_step,
                               int start_microbatch, bool elastic, uint32_t slots,
                               uint64_t slot_bytes, const std::string& placement, int cuda_device,
                               const std::string& ucx_transports, double attach_timeout,
                               double reconnect_timeout) {
  ClientOptions options;
  options.socket_path = socket_path;
  options.job = job;
  options.global_rank = global_rank;
  options.fingerprint = fingerprint;
  options.auth_token = auth_token;
  options.start_step = start_step;
  options.start_microbatch = start_microbatch;
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

// {"step", "microbatch", "fields": [(name, dtype name, capsule), ...]}.
py::dict Next(const std::shared_ptr<Client>& client, std::optional<double> timeout) {
  absl::StatusOr<Microbatch> next;
  {
    py::gil_scoped_release release;
    next = client->Next(Timeout(timeout));
  }
  const Microbatch microbatch = ValueOrRaise(std::move(next));
  py::list fields;
  for (const FieldView& field : microbatch.fields) {
    fields.append(py::make_tuple(
        field.name, std::string(transport::ElementTypeName(field.dtype)),
        ToCapsule(field, microbatch.memory_kind, client->options().cuda_device, client)));
  }
  py::dict out;
  out["step"] = microbatch.step;
  out["microbatch"] = microbatch.microbatch;
  out["fields"] = std::move(fields);
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
      .def("next", &Next, py::arg("timeout") = py::none())
      .def("detach",
           [](Client& client) {
             absl::Status status;
             {
               py::gil_scoped_release release;
               status = client.Detach();
             }
             if (!status.ok()) Raise(status);
           })
      .def("release",
           [](Client& client) {
             if (absl::Status status = client.Release(); !status.ok()) Raise(status);
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
      .def_property_readonly("fingerprint", &Client::fingerprint)
      .def_property_readonly("num_chunks", &Client::num_chunks)
      .def_property_readonly("memory_kind", [](const Client& client) {
        return client.memory_kind() == packfeed::transport::MemoryKind::kCuda ? "cuda" : "host";
      });
  m.def("attach", &Attach, py::arg("socket_path"), py::arg("job"), py::arg("global_rank"),
        py::arg("fingerprint"), py::arg("auth_token"), py::arg("start_step"),
        py::arg("start_microbatch"), py::arg("elastic"), py::arg("slots"), py::arg("slot_bytes"),
        py::arg("placement"), py::arg("cuda_device"), py::arg("ucx_transports"),
        py::arg("attach_timeout"), py::arg("reconnect_timeout"));
}
