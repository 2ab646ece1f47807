// Grow-only scratch memory. Unlike std::vector::resize, asking for less keeps the memory and
// asking again for more (within capacity) neither allocates nor zero-fills, so steady-state
// use touches no fresh pages.
#pragma once

#include <cstddef>
#include <memory>

namespace fastload {

template <typename T>
class GrowBuffer {
 public:
  // Returns room for at least n elements (contents unspecified).
  T* reserve(size_t n) {
    if (n > capacity_) {
      const size_t grown = capacity_ + capacity_ / 4;  // amortize slowly growing requests
      const size_t cap = n > grown ? n : grown;
      data_.reset(new T[cap]);  // default-initialized: no zero-fill for arithmetic T
      capacity_ = cap;
    }
    return data_.get();
  }
  // Frees the memory if it exceeds max_bytes, so one outsized image does not pin it forever.
  void shrink_to(size_t max_bytes) {
    if (capacity_ * sizeof(T) > max_bytes) {
      data_.reset();
      capacity_ = 0;
    }
  }
  T* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<T[]> data_;
  size_t capacity_ = 0;
};

}  // namespace fastload
