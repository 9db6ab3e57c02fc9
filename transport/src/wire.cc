#include "packfeed/transport/wire.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "packfeed/common/constant_time.h"
#include "packfeed/common/status_macros.h"

namespace packfeed::transport {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and encoded by memcpy");

constexpr uint16_t kRingDescriptorKind = 16;
constexpr uint16_t kWorkerAddressKind = 17;

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutBytes(absl::string_view bytes) { out_.append(bytes.data(), bytes.size()); }
  std::string Finish(uint16_t kind, uint64_t connection_id) && {
    Writer header;
    header.Put(kWireMagic);
    header.Put(kWireVersion);
    header.Put(kind);
    header.Put(connection_id);
    header.Put(static_cast<uint64_t>(out_.size()));
    return header.out_ + out_;
  }

 private:
  std::string out_;
};

// Reads fixed-size values from untrusted bytes; every read is bounds-checked.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  absl::StatusOr<T> Get(absl::string_view what) {
    if (bytes_.size() < sizeof(T)) return Truncated(what);
    T value;
    std::memcpy(&value, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return value;
  }
  absl::StatusOr<absl::string_view> GetBytes(size_t length, absl::string_view what) {
    if (bytes_.size() < length) return Truncated(what);
    absl::string_view out = bytes_.substr(0, length);
    bytes_.remove_prefix(length);
    return out;
  }
  size_t remaining() const { return bytes_.size(); }

 private:
  static absl::Status Truncated(absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("message truncated in ", what));
  }
  absl::string_view bytes_;
};

uint64_t Checksum(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

struct Header {
  uint16_t kind;
  uint64_t connection_id;
};

absl::StatusOr<Header> ReadHeader(Reader& reader) {
  PF_ASSIGN_OR_RETURN(uint32_t magic, reader.Get<uint32_t>("header"));
  if (magic != kWireMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a packfeed message (magic 0x", absl::Hex(magic), ")"));
  }
  PF_ASSIGN_OR_RETURN(uint16_t version, reader.Get<uint16_t>("header"));
  if (version != kWireVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer speaks packfeed wire protocol v", version, "; this side speaks v", kWireVersion));
  }
  PF_ASSIGN_OR_RETURN(uint16_t kind, reader.Get<uint16_t>("header"));
  PF_ASSIGN_OR_RETURN(uint64_t connection_id, reader.Get<uint64_t>("header"));
  PF_ASSIGN_OR_RETURN(uint64_t body_bytes, reader.Get<uint64_t>("header"));
  if (body_bytes != reader.remaining()) {
    return absl::InvalidArgumentError(
        absl::StrCat("message body is ", reader.remaining(), " bytes, header says ", body_bytes));
  }
  return Header{kind, connection_id};
}

absl::Status CheckName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxFieldNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("field name of ", name.size(), " bytes (1 to ",
                                                   kMaxFieldNameBytes, " allowed)"));
  }
  for (char c : name) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("field name with a non-printable byte");
    }
  }
  return absl::OkStatus();
}

// Bytes of a field of `type` and `shape`, refusing negative dimensions,
// unknown types and overflow.
absl::StatusOr<uint64_t> FieldBytes(absl::string_view name, ElementType type,
                                    const std::vector<int64_t>& shape) {
  const size_t element = ElementSize(type);
  if (element == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field ", name, ": unknown element type ", static_cast<int>(type)));
  }
  if (shape.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("field ", name, ": ", shape.size(), " dimensions (at most ", kMaxDims, ")"));
  }
  uint64_t bytes = element;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("field ", name, ": negative dimension ", dim));
    }
    if (dim != 0 && bytes > UINT64_MAX / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError(absl::StrCat("field ", name, ": size overflows"));
    }
    bytes *= static_cast<uint64_t>(dim);
  }
  return bytes;
}

void EncodeBody(const SlotReady& ready, Writer& writer) {
  writer.Put(ready.seq);
  writer.Put(ready.slot);
  writer.Put(ready.step);
  writer.Put(ready.microbatch);
  writer.Put(static_cast<uint16_t>(ready.fields.size()));
  writer.Put(static_cast<uint16_t>(ready.inline_metadata.size()));
  for (const FieldDescriptor& field : ready.fields) {
    writer.Put(static_cast<uint8_t>(field.name.size()));
    writer.PutBytes(field.name);
    writer.Put(static_cast<uint8_t>(field.type));
    writer.Put(static_cast<uint8_t>(field.shape.size()));
    for (int64_t dim : field.shape) writer.Put(dim);
    writer.Put(field.offset);
    writer.Put(field.bytes);
  }
  writer.PutBytes(ready.inline_metadata);
}

absl::StatusOr<FieldDescriptor> DecodeField(Reader& reader) {
  FieldDescriptor field;
  PF_ASSIGN_OR_RETURN(uint8_t name_bytes, reader.Get<uint8_t>("field name"));
  PF_ASSIGN_OR_RETURN(absl::string_view name, reader.GetBytes(name_bytes, "field name"));
  PF_RETURN_IF_ERROR(CheckName(name));
  field.name = std::string(name);
  PF_ASSIGN_OR_RETURN(uint8_t type, reader.Get<uint8_t>("field type"));
  field.type = static_cast<ElementType>(type);
  PF_ASSIGN_OR_RETURN(uint8_t dims, reader.Get<uint8_t>("field shape"));
  if (dims > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("field ", field.name, ": ", dims, " dimensions (at most ", kMaxDims, ")"));
  }
  for (int d = 0; d < dims; ++d) {
    PF_ASSIGN_OR_RETURN(int64_t dim, reader.Get<int64_t>("field shape"));
    field.shape.push_back(dim);
  }
  PF_ASSIGN_OR_RETURN(field.offset, reader.Get<uint64_t>("field offset"));
  PF_ASSIGN_OR_RETURN(field.bytes, reader.Get<uint64_t>("field bytes"));
  PF_ASSIGN_OR_RETURN(uint64_t expected, FieldBytes(field.name, field.type, field.shape));
  if (expected != field.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("field ", field.name, ": ", field.bytes, " bytes for a shape of ", expected));
  }
  if (field.offset > UINT64_MAX - field.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("field ", field.name, ": offset overflows"));
  }
  return field;
}

absl::StatusOr<SlotReady> DecodeSlotReady(uint64_t connection_id, Reader& reader) {
  SlotReady ready;
  ready.connection_id = connection_id;
  PF_ASSIGN_OR_RETURN(ready.seq, reader.Get<uint64_t>("slot-ready"));
  PF_ASSIGN_OR_RETURN(ready.slot, reader.Get<uint32_t>("slot-ready"));
  PF_ASSIGN_OR_RETURN(ready.step, reader.Get<int64_t>("slot-ready"));
  PF_ASSIGN_OR_RETURN(ready.microbatch, reader.Get<uint32_t>("slot-ready"));
  PF_ASSIGN_OR_RETURN(uint16_t fields, reader.Get<uint16_t>("slot-ready"));
  PF_ASSIGN_OR_RETURN(uint16_t inline_bytes, reader.Get<uint16_t>("slot-ready"));
  if (fields > kMaxFields) {
    return absl::InvalidArgumentError(absl::StrCat(fields, " fields (at most ", kMaxFields, ")"));
  }
  if (inline_bytes > kMaxInlineBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(inline_bytes, " bytes of inline metadata (at most ", kMaxInlineBytes, ")"));
  }
  for (int i = 0; i < fields; ++i) {
    PF_ASSIGN_OR_RETURN(FieldDescriptor field, DecodeField(reader));
    ready.fields.push_back(std::move(field));
  }
  PF_ASSIGN_OR_RETURN(absl::string_view metadata, reader.GetBytes(inline_bytes, "inline metadata"));
  ready.inline_metadata = std::string(metadata);
  if (reader.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(reader.remaining(), " bytes after the slot-ready message"));
  }
  return ready;
}

absl::Status ExpectEmpty(const Reader& reader, absl::string_view what) {
  if (reader.remaining() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(reader.remaining(), " bytes after the ", what, " message"));
}

absl::StatusOr<Credit> DecodeCredit(uint64_t connection_id, Reader& reader) {
  Credit credit;
  credit.connection_id = connection_id;
  PF_ASSIGN_OR_RETURN(credit.seen, reader.Get<uint64_t>("credit"));
  PF_ASSIGN_OR_RETURN(credit.taken, reader.Get<uint64_t>("credit"));
  PF_ASSIGN_OR_RETURN(credit.released, reader.Get<uint64_t>("credit"));
  PF_ASSIGN_OR_RETURN(uint32_t words, reader.Get<uint32_t>("credit"));
  if (words > kMaxSlots / 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("credit with ", words, " words of free slots (at most ", kMaxSlots / 64, ")"));
  }
  for (uint32_t i = 0; i < words; ++i) {
    PF_ASSIGN_OR_RETURN(uint64_t word, reader.Get<uint64_t>("credit free slots"));
    credit.free_slots.push_back(word);
  }
  PF_ASSIGN_OR_RETURN(absl::string_view key, reader.GetBytes(credit.key.size(), "credit key"));
  std::memcpy(credit.key.data(), key.data(), key.size());
  PF_RETURN_IF_ERROR(ExpectEmpty(reader, "credit"));
  if (credit.released > credit.taken || credit.taken > credit.seen) {
    return absl::InvalidArgumentError(absl::StrCat("credit of ", credit.released, " released, ",
                                                   credit.taken, " taken of ", credit.seen,
                                                   " seen: released <= taken <= seen"));
  }
  return credit;
}

}  // namespace

ConnectionKey NewConnectionKey() {
  // libstdc++'s random_device reads the kernel's CSPRNG (getrandom, or
  // rdrand/rdseed where the CPU has them).
  std::random_device random;
  ConnectionKey key;
  for (size_t i = 0; i < key.size(); i += 4) {
    const uint32_t word = random();
    std::memcpy(key.data() + i, &word, 4);
  }
  return key;
}

bool SameKey(const ConnectionKey& a, const ConnectionKey& b) {
  // Views, not copies: a credit's key is checked on the progress thread.
  auto bytes = [](const ConnectionKey& key) {
    return absl::string_view(reinterpret_cast<const char*>(key.data()), key.size());
  };
  return ConstantTimeEquals(bytes(a), bytes(b));
}

std::string KeyBytes(const ConnectionKey& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

absl::StatusOr<ConnectionKey> KeyFromBytes(absl::string_view bytes) {
  ConnectionKey key;
  if (bytes.size() != key.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a connection key of ", bytes.size(), " bytes, not ", key.size()));
  }
  std::memcpy(key.data(), bytes.data(), key.size());
  return key;
}

std::string EncodeMessage(const Message& message) {
  Writer writer;
  if (const auto* ready = std::get_if<SlotReady>(&message)) {
    EncodeBody(*ready, writer);
    return std::move(writer).Finish(static_cast<uint16_t>(MessageKind::kSlotReady),
                                    ready->connection_id);
  }
  if (const auto* credit = std::get_if<Credit>(&message)) {
    writer.Put(credit->seen);
    writer.Put(credit->taken);
    writer.Put(credit->released);
    writer.Put(static_cast<uint32_t>(credit->free_slots.size()));
    for (uint64_t word : credit->free_slots) writer.Put(word);
    writer.PutBytes(
        absl::string_view(reinterpret_cast<const char*>(credit->key.data()), credit->key.size()));
    return std::move(writer).Finish(static_cast<uint16_t>(MessageKind::kCredit),
                                    credit->connection_id);
  }
  const auto& goodbye = std::get<Goodbye>(message);
  if (!goodbye.reason.empty()) {
    writer.Put(static_cast<uint32_t>(goodbye.reason.size()));
    writer.PutBytes(goodbye.reason);
  }
  return std::move(writer).Finish(static_cast<uint16_t>(MessageKind::kGoodbye),
                                  goodbye.connection_id);
}

absl::StatusOr<Message> DecodeMessage(absl::string_view bytes) {
  Reader reader(bytes);
  PF_ASSIGN_OR_RETURN(Header header, ReadHeader(reader));
  switch (static_cast<MessageKind>(header.kind)) {
    case MessageKind::kSlotReady:
      return DecodeSlotReady(header.connection_id, reader);
    case MessageKind::kCredit:
      return DecodeCredit(header.connection_id, reader);
    case MessageKind::kGoodbye: {
      if (reader.remaining() == 0) return Goodbye{header.connection_id, ""};
      PF_ASSIGN_OR_RETURN(uint32_t length, reader.Get<uint32_t>("goodbye reason"));
      PF_ASSIGN_OR_RETURN(absl::string_view reason, reader.GetBytes(length, "goodbye reason"));
      PF_RETURN_IF_ERROR(ExpectEmpty(reader, "goodbye"));
      if (reason.empty()) {
        return absl::InvalidArgumentError("goodbye with an empty reason (omit it instead)");
      }
      return Goodbye{header.connection_id, std::string(reason)};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown message kind ", header.kind));
}

absl::Status ValidateSlotReady(const SlotReady& ready, uint32_t slots, uint64_t slot_bytes,
                               uint64_t expected_seq) {
  if (ready.seq != expected_seq) {
    return absl::DataLossError(
        absl::StrCat("slot-ready for message ", ready.seq, ", expected message ", expected_seq));
  }
  if (ready.slot >= slots) {
    return absl::DataLossError(absl::StrCat("slot-ready names slot ", ready.slot, " for message ",
                                            ready.seq, " of a ", slots, "-slot ring"));
  }
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (const FieldDescriptor& field : ready.fields) {
    if (field.offset > slot_bytes || field.bytes > slot_bytes - field.offset) {
      return absl::DataLossError(absl::StrCat("field ", field.name, " [", field.offset, ", +",
                                              field.bytes, ") lies outside the ", slot_bytes,
                                              "-byte slot"));
    }
    extents.emplace_back(field.offset, field.offset + field.bytes);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].first < extents[i - 1].second) {
      return absl::DataLossError(absl::StrCat("fields overlap at slot offset ", extents[i].first));
    }
  }
  return absl::OkStatus();
}

std::string EncodeRingDescriptor(const RingDescriptor& ring) {
  Writer writer;
  writer.Put(ring.slots);
  writer.Put(ring.slot_bytes);
  writer.Put(ring.base_address);
  writer.Put(static_cast<uint8_t>(ring.memory_kind));
  writer.Put(static_cast<uint32_t>(ring.remote_key.size()));
  writer.PutBytes(ring.remote_key);
  writer.Put(Checksum(ring.remote_key));
  return std::move(writer).Finish(kRingDescriptorKind, 0);
}

absl::StatusOr<RingDescriptor> DecodeRingDescriptor(absl::string_view bytes) {
  Reader reader(bytes);
  PF_ASSIGN_OR_RETURN(Header header, ReadHeader(reader));
  if (header.kind != kRingDescriptorKind) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a ring descriptor, got message kind ", header.kind));
  }
  if (header.connection_id != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring descriptor with connection id ", header.connection_id, " (must be 0)"));
  }
  RingDescriptor ring;
  PF_ASSIGN_OR_RETURN(ring.slots, reader.Get<uint32_t>("ring descriptor"));
  PF_ASSIGN_OR_RETURN(ring.slot_bytes, reader.Get<uint64_t>("ring descriptor"));
  PF_ASSIGN_OR_RETURN(ring.base_address, reader.Get<uint64_t>("ring descriptor"));
  PF_ASSIGN_OR_RETURN(uint8_t kind, reader.Get<uint8_t>("ring descriptor"));
  PF_ASSIGN_OR_RETURN(uint32_t key_bytes, reader.Get<uint32_t>("ring descriptor"));
  PF_ASSIGN_OR_RETURN(absl::string_view key, reader.GetBytes(key_bytes, "remote key"));
  PF_ASSIGN_OR_RETURN(uint64_t checksum, reader.Get<uint64_t>("remote key checksum"));
  PF_RETURN_IF_ERROR(ExpectEmpty(reader, "ring descriptor"));
  if (checksum != Checksum(key)) {
    return absl::InvalidArgumentError("remote key checksum mismatch: a corrupt ring descriptor");
  }
  if (kind > static_cast<uint8_t>(MemoryKind::kCuda)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ring memory kind ", kind));
  }
  ring.memory_kind = static_cast<MemoryKind>(kind);
  ring.remote_key = std::string(key);
  // No key: the ring's memory travels by file descriptor instead (a shared
  // host ring, or device memory the daemon writes itself); Sender::Open
  // checks that one came with it.
  if (ring.slots == 0 || ring.slots > kMaxSlots || ring.slot_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring of ", ring.slots, " slots of ", ring.slot_bytes,
                     " bytes: slots and bytes must be positive, at most ", kMaxSlots, " slots"));
  }
  if (ring.slot_bytes > UINT64_MAX / ring.slots ||
      ring.base_address > UINT64_MAX - ring.slots * ring.slot_bytes) {
    return absl::InvalidArgumentError("ring extent overflows the address space");
  }
  return ring;
}

std::string EncodeWorkerAddress(absl::string_view ucx_address) {
  Writer writer;
  writer.Put(static_cast<uint32_t>(ucx_address.size()));
  writer.PutBytes(ucx_address);
  writer.Put(Checksum(ucx_address));
  return std::move(writer).Finish(kWorkerAddressKind, 0);
}

absl::StatusOr<std::string> DecodeWorkerAddress(absl::string_view bytes) {
  Reader reader(bytes);
  PF_ASSIGN_OR_RETURN(Header header, ReadHeader(reader));
  if (header.kind != kWorkerAddressKind || header.connection_id != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a worker address, got message kind ", header.kind));
  }
  PF_ASSIGN_OR_RETURN(uint32_t length, reader.Get<uint32_t>("worker address"));
  PF_ASSIGN_OR_RETURN(absl::string_view address, reader.GetBytes(length, "worker address"));
  PF_ASSIGN_OR_RETURN(uint64_t checksum, reader.Get<uint64_t>("worker address checksum"));
  PF_RETURN_IF_ERROR(ExpectEmpty(reader, "worker address"));
  if (address.empty()) return absl::InvalidArgumentError("empty worker address");
  if (checksum != Checksum(address)) {
    return absl::InvalidArgumentError("worker address checksum mismatch: a corrupt address");
  }
  return std::string(address);
}

absl::StatusOr<std::vector<FieldDescriptor>> LayoutFields(const std::vector<FieldSpec>& fields,
                                                          uint64_t slot_bytes) {
  if (fields.size() > kMaxFields) {
    return absl::InvalidArgumentError(
        absl::StrCat(fields.size(), " fields (at most ", kMaxFields, ")"));
  }
  std::vector<FieldDescriptor> layout;
  uint64_t end = 0;
  bool overflow = false;
  for (const FieldSpec& spec : fields) {
    PF_RETURN_IF_ERROR(CheckName(spec.name));
    PF_ASSIGN_OR_RETURN(uint64_t bytes, FieldBytes(spec.name, spec.type, spec.shape));
    const uint64_t offset = (end + kFieldAlignment - 1) / kFieldAlignment * kFieldAlignment;
    overflow |= offset < end || bytes > UINT64_MAX - offset;
    end = offset + bytes;
    layout.push_back({spec.name, spec.type, spec.shape, offset, bytes});
  }
  if (overflow || end > slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload of ", overflow ? std::string("more than 2^64") : absl::StrCat(end),
                     " bytes (", fields.size(), " fields, each aligned to ", kFieldAlignment,
                     " B) does not fit a ring slot of ", slot_bytes, " bytes"));
  }
  return layout;
}

}  // namespace packfeed::transport
