// A caller-owned, read-only byte range (an mmap'd shard, a bytes object, ...) that samples and
// rows are read from. The binding keeps the owning Python buffer exported while it is in use.
#pragma once

#include <cstdint>

namespace fastload {

struct Region {
  const uint8_t* data;
  int64_t size;
};

}  // namespace fastload
