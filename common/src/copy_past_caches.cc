#include "packfeed/common/copy_past_caches.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace packfeed {
#if defined(__x86_64__)
namespace {

// Below this a copy stays in the caches: the fence and the unaligned ends
// would cost more than the lines saved.
constexpr size_t kSmallestStreamed = 1024;

// 128 bytes a round, the destination 32-byte aligned by the caller.
__attribute__((target("avx2"))) void StreamAvx2(char* destination, const char* source,
                                                size_t rounds) {
  for (size_t i = 0; i < rounds; ++i, destination += 128, source += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(destination), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(destination + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(destination + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(destination + 96), d);
  }
}

// The same with SSE2, which every x86-64 has.
void StreamSse2(char* destination, const char* source, size_t rounds) {
  for (size_t i = 0; i < rounds; ++i, destination += 128, source += 128) {
    __m128i lines[8];
    for (int k = 0; k < 8; ++k) {
      lines[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + 16 * k));
    }
    for (int k = 0; k < 8; ++k) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(destination + 16 * k), lines[k]);
    }
  }
}

using Streamer = void (*)(char*, const char*, size_t);

Streamer ChosenStreamer() {
  static const Streamer chosen = __builtin_cpu_supports("avx2") ? StreamAvx2 : StreamSse2;
  return chosen;
}

}  // namespace

void CopyPastCaches(void* destination, const void* source, size_t bytes) {
  auto* to = static_cast<char*>(destination);
  const auto* from = static_cast<const char*>(source);
  if (bytes < kSmallestStreamed) {
    std::memcpy(to, from, bytes);
    return;
  }
  const size_t head = (32 - (reinterpret_cast<uintptr_t>(to) & 31)) & 31;
  std::memcpy(to, from, head);
  to += head;
  from += head;
  bytes -= head;
  const size_t rounds = bytes / 128;
  ChosenStreamer()(to, from, rounds);
  std::memcpy(to + rounds * 128, from + rounds * 128, bytes - rounds * 128);
}

void FenceCopiesPastCaches() { _mm_sfence(); }

#else

void CopyPastCaches(void* destination, const void* source, size_t bytes) {
  std::memcpy(destination, source, bytes);
}
void FenceCopiesPastCaches() {}

#endif
}  // namespace packfeed
