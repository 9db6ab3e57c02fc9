#include "server/config/side_fields.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "packfeed/v1/config.pb.h"
#include "server/config/model_stages.h"

namespace packfeed::server {
namespace {

using dataset::DType;
using transport::ElementType;

struct SideType {
  const char* name;
  ElementType type;
  DType file;        // the Megatron dtype that stores it
  DType file_alias;  // another one that may (16-bit floats' bits)
};
constexpr SideType kSideTypes[] = {
    {"int8", ElementType::kInt8, DType::kInt8, DType::kInt8},
    {"uint8", ElementType::kUInt8, DType::kUint8, DType::kUint8},
    {"int16", ElementType::kInt16, DType::kInt16, DType::kInt16},
    {"uint16", ElementType::kUInt16, DType::kUint16, DType::kUint16},
    {"int32", ElementType::kInt32, DType::kInt32, DType::kInt32},
    {"int64", ElementType::kInt64, DType::kInt64, DType::kInt64},
    {"float16", ElementType::kFloat16, DType::kInt16, DType::kUint16},
    {"bfloat16", ElementType::kBFloat16, DType::kInt16, DType::kUint16},
    {"float32", ElementType::kFloat32, DType::kFloat32, DType::kFloat32},
};

const SideType* FindSideType(ElementType type) {
  for (const SideType& t : kSideTypes) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

// The THD fields' names (pack.cc serves them), which a side field may not take.
constexpr const char* kReservedNames[] = {
    "tokens",        "labels",         "loss_mask",         "position_ids",
    "padding_mask",  "cu_seqlens",     "cu_seqlens_padded", "max_seqlen",
    "local_cp_size", "cp_group_ranks", "attention_mask",    "packed_seq_params",
    "sample_ids",    "hybrid_group"};

// IEEE binary16, rounded to nearest even (overflow to infinity).
uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past max
  if (magnitude < 0x38800000u) {                          // a subnormal half (or zero)
    const float scaled = std::fabs(value) * 16777216.0f;  // 2^24: units of the smallest subnormal
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

// bfloat16: the top half of the float's bits, rounded to nearest even.
uint16_t FloatToBfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
std::vector<uint8_t> Bytes(T value) {
  std::vector<uint8_t> out(sizeof(T));
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

// `value` as an integer element of type T, when it is one T holds.
template <typename T>
absl::StatusOr<std::vector<uint8_t>> IntegerPad(double value, ElementType type) {
  // (Doubles hold integers exactly up to 2^53, which bounds int64's range.)
  const double lo = std::max(static_cast<double>(std::numeric_limits<T>::min()), -0x1p53);
  const double hi = std::min(static_cast<double>(std::numeric_limits<T>::max()), 0x1p53);
  if (value != std::floor(value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(value, " is not a ", transport::ElementTypeName(type)));
  }
  return Bytes(static_cast<T>(value));
}

// `value` as one element of `type`; InvalidArgument when it does not fit.
absl::StatusOr<std::vector<uint8_t>> EncodePad(double value, ElementType type) {
  switch (type) {
    case ElementType::kInt8:
      return IntegerPad<int8_t>(value, type);
    case ElementType::kUInt8:
      return IntegerPad<uint8_t>(value, type);
    case ElementType::kInt16:
      return IntegerPad<int16_t>(value, type);
    case ElementType::kUInt16:
      return IntegerPad<uint16_t>(value, type);
    case ElementType::kInt32:
      return IntegerPad<int32_t>(value, type);
    case ElementType::kInt64:
      return IntegerPad<int64_t>(value, type);
    case ElementType::kFloat16:
      return Bytes(FloatToHalf(static_cast<float>(value)));
    case ElementType::kBFloat16:
      return Bytes(FloatToBfloat16(static_cast<float>(value)));
    case ElementType::kFloat32:
      return Bytes(static_cast<float>(value));
    default:
      return absl::InvalidArgumentError("unsupported type");
  }
}

}  // namespace

absl::StatusOr<SideFieldInfo> ResolveSideField(const v1::SideField& field,
                                               const ModelStages& stages,
                                               const std::string& where) {
  auto error = [&](absl::string_view member, absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", member, ": ", problem));
  };
  SideFieldInfo out;
  out.name = field.name();
  if (out.name.empty() || out.name.size() > 24 ||
      out.name.find_first_not_of(
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return error("name", absl::StrCat("'", out.name, "' must be [A-Za-z0-9_]+, at most 24 bytes"));
  }
  for (const char* reserved : kReservedNames) {
    if (out.name == reserved) return error("name", absl::StrCat("'", out.name, "' is a THD field"));
  }
  const SideType* type = nullptr;
  for (const SideType& t : kSideTypes) {
    if (field.dtype() == t.name) type = &t;
  }
  if (type == nullptr) {
    std::vector<std::string> names;
    for (const SideType& t : kSideTypes) names.push_back(t.name);
    return error("dtype",
                 absl::StrCat("'", field.dtype(), "' is not one of ", absl::StrJoin(names, ", ")));
  }
  out.type = type->type;
  out.element_bytes = transport::ElementSize(out.type);
  if (field.inner_shape_size() > 2) {
    return error("inner_shape", "at most two dimensions (the wire holds [1, T, *inner_shape])");
  }
  for (uint32_t extent : field.inner_shape()) {
    if (extent < 1 || extent > 65536) {
      return error("inner_shape", absl::StrCat(extent, " is out of [1, 65536]"));
    }
    out.inner_shape.push_back(extent);
    out.row_elements *= extent;
  }
  absl::StatusOr<std::vector<uint8_t>> pad = EncodePad(field.pad_value(), out.type);
  if (!pad.ok()) return error("pad_value", pad.status().message());
  out.pad = *std::move(pad);
  out.labels_aligned = field.align() == v1::SideField::ALIGN_LABELS;
  out.layer_axis = field.layer_axis();
  if (out.layer_axis) {
    if (out.inner_shape.empty()) return error("layer_axis", "needs inner_shape [layers, ...]");
    if (stages.num_moe_layers() == 0) {
      return error("layer_axis", "needs model.num_layers (the layers to cut per stage)");
    }
    if (out.inner_shape[0] != stages.num_moe_layers()) {
      return error(
          "inner_shape",
          absl::StrCat("the layer axis holds ", out.inner_shape[0], " layers; the model has ",
                       stages.num_moe_layers(),
                       " with experts (model.num_layers + mtp_num_layers − dense_layers)"));
    }
  }
  out.loss_mask = field.role() == v1::SideField::ROLE_LOSS_MASK;
  if (out.loss_mask &&
      (out.type != ElementType::kUInt8 || !out.inner_shape.empty() || !out.labels_aligned)) {
    return error("role", "a loss mask is a uint8 field of one value per token, ALIGN_LABELS");
  }
  switch (field.stages()) {
    case v1::SideField::STAGES_ALL:
      out.stages = SideFieldStages::kAll;
      break;
    case v1::SideField::STAGES_INPUTS:
      out.stages = SideFieldStages::kInputs;
      break;
    case v1::SideField::STAGES_TARGETS:
      out.stages = SideFieldStages::kTargets;
      break;
    case v1::SideField::STAGES_LAYERS:
      out.stages = SideFieldStages::kLayers;
      break;
    default:
      out.stages = out.layer_axis       ? SideFieldStages::kLayers
                   : out.labels_aligned ? SideFieldStages::kTargets
                                        : SideFieldStages::kInputs;
  }
  if (out.stages == SideFieldStages::kLayers && !out.layer_axis) {
    return error("stages", "STAGES_LAYERS needs layer_axis");
  }
  return out;
}

std::string SideFieldPrefix(const v1::DatasetSpec& spec, const std::string& field) {
  auto named = spec.side_field_prefixes().find(field);
  return named != spec.side_field_prefixes().end() ? named->second
                                                   : absl::StrCat(spec.prefix(), "_", field);
}

absl::Status CheckSideDataset(const SideFieldInfo& field, const dataset::IndexedDataset& tokens,
                              const dataset::IndexedDataset& side) {
  const SideType* type = FindSideType(field.type);
  if (side.dtype() != type->file && side.dtype() != type->file_alias) {
    return absl::FailedPreconditionError(absl::StrCat(
        side.prefix(), ": side field ", field.name, " is ", transport::ElementTypeName(field.type),
        " but the file holds ", dataset::DTypeName(side.dtype()), " (expected ",
        dataset::DTypeName(type->file),
        type->file_alias != type->file ? absl::StrCat(" or ", dataset::DTypeName(type->file_alias))
                                       : "",
        ")"));
  }
  if (side.num_documents() != tokens.num_documents() ||
      side.num_sequences() != tokens.num_sequences()) {
    return absl::FailedPreconditionError(
        absl::StrCat(side.prefix(), ": side field ", field.name, " holds ", side.num_documents(),
                     " documents of ", side.num_sequences(), " sequences; ", tokens.prefix(),
                     " holds ", tokens.num_documents(), " of ", tokens.num_sequences()));
  }
  const dataset::IndexView& a = tokens.index();
  const dataset::IndexView& b = side.index();
  for (uint64_t d = 0; d <= a.num_documents(); ++d) {
    if (a.document_index(d) != b.document_index(d)) {
      return absl::FailedPreconditionError(
          absl::StrCat(side.prefix(), ": side field ", field.name, " document ", d,
                       " starts at another sequence than in ", tokens.prefix()));
    }
  }
  for (uint64_t i = 0; i < a.num_sequences(); ++i) {
    if (int64_t{b.length(i)} != int64_t{a.length(i)} * field.row_elements) {
      return absl::FailedPreconditionError(absl::StrCat(
          side.prefix(), ": side field ", field.name, " sequence ", i, " holds ", b.length(i),
          " values; ", tokens.prefix(), "'s has ", a.length(i), " tokens × ", field.row_elements,
          " per token = ", int64_t{a.length(i)} * field.row_elements));
    }
  }
  return absl::OkStatus();
}

}  // namespace packfeed::server
