// A caller-owned, read-only byte range (an mmap'd shard, a bytes object, ...) that samples and
// rows are read from. The binding keeps the owning Python buffer exported while it is in use.
#pragma once

#include <cstdint>

namespace fastload {

struct Region {
  const uint8_t* data;
  int64_t size;
};

// Whether the byte ranges [a, a + a_len) and [b, b + b_len) share a byte.
inline bool overlaps(const uint8_t* a, int64_t a_len, const uint8_t* b, int64_t b_len) {
  if (a_len == 0 || b_len == 0) return false;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(b_len) && b0 < a0 + static_cast<uintptr_t>(a_len);
}

}  // namespace fastload
