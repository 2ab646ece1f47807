#include "gather.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "buffer.h"

namespace fastload {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Describes why row k is out of bounds ("" if it is not).
std::string row_error(const GatherSpec& g, int64_t k, int64_t r, int64_t off) {
  const std::string row = "row " + str(k) + ": ";
  if (r < 0 || r >= g.num_regions) {
    return row + "region[" + str(k) + "]=" + str(r) + " is out of range [0, " +
           str(g.num_regions) + ") (the number of regions)";
  }
  const int64_t size = g.regions[r].size;
  if (off < 0) return row + "offset[" + str(k) + "]=" + str(off) + " is negative";
  if (g.row_bytes > size || off > size - g.row_bytes) {
    return row + "offset[" + str(k) + "]=" + str(off) + " + row_bytes=" + str(g.row_bytes) +
           " is past the end of regions[" + str(r) + "] (" + str(size) + " bytes)";
  }
  return "";
}

// Checks every row and writes its source pointer to src[k]. region[k] and offset[k] are read
// once each, so a caller changing them meanwhile cannot slip a bad row past the check.
bool resolve_rows(const GatherSpec& g, const uint8_t** src, std::string* err) {
  std::vector<int64_t> last(static_cast<size_t>(g.num_regions));  // largest valid offset, or -1
  std::vector<const uint8_t*> base(static_cast<size_t>(g.num_regions));
  for (int64_t r = 0; r < g.num_regions; ++r) {
    last[r] = g.row_bytes > g.regions[r].size ? -1 : g.regions[r].size - g.row_bytes;
    base[r] = g.regions[r].data;
  }
  const int64_t n = g.n, num_regions = g.num_regions;
  const int64_t* region = g.region;
  const int64_t* offset = g.offset;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = region[k], off = offset[k];
    if (static_cast<uint64_t>(r) >= static_cast<uint64_t>(num_regions) || off < 0 ||
        off > last[r]) {
      *err = row_error(g, k, r, off);
      return false;
    }
    src[k] = base[r] + off;
  }
  return true;
}

// Source pages are touched this far ahead of the copy (one prefetch per 4 KiB page). A row of a
// shard is read through the page cache's mapping, mostly 4 KiB pages: each one a TLB miss whose
// page walk the copy loop would otherwise wait for in turn (the hardware prefetcher stops at
// every page too). Touching a row's pages first has the walks run side by side: the copy of
// 150 KB rows from the mapping took 0.83x the CPU time (streaming stores) and 0.68-0.78x
// (memcpy) on a 2-vCPU EPYC VM; from huge pages (process memory) 0.98x
// (bench/copy_kernels.py, bench/results/issue32_raw_prefetch_cpu2.md).
constexpr size_t kPageAhead = size_t{256} << 10;
constexpr uintptr_t kPage = 4096;

// One prefetch into the outer caches (T2: not L1, which the copy's own lines need) per 4 KiB page
// of [p, end). Never faults.
inline void prefetch_pages(const uint8_t* p, const uint8_t* end) {
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1); a < reinterpret_cast<uintptr_t>(end);
       a += kPage) {
    __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 1);
  }
}

// Copies with non-temporal stores: for batches larger than the cache, whose output will not be
// read back before it is evicted, this skips reading every destination line first. glibc's
// memcpy does the same only for single copies of several MiB, far more than one row; for 150 KB
// rows this loop (with a software prefetch, as the hardware one stops at each 4 KiB page) was
// 1.4x memcpy's bandwidth with one thread and 1.6x with two. Source pages are touched kPageAhead
// ahead (prefetch_pages).
void copy_streaming(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__SSE2__)
  constexpr int kPrefetchAhead = 1024;
  const uint8_t* const end = src + n;
  const uint8_t* ahead = src + std::min(n, kPageAhead);
  prefetch_pages(src, ahead);
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  while (n >= 64) {
    const size_t block = std::min(n & ~size_t{63}, size_t{kPage});  // whole lines, a page's worth
    if (ahead < end) {
      const uint8_t* next = std::min(ahead + kPage, end);
      prefetch_pages(ahead, next);
      ahead = next;
    }
    for (size_t i = 0; i < block; i += 64, dst += 64, src += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchAhead, _MM_HINT_T0);  // never faults
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    }
    n -= block;
  }
#endif
  std::memcpy(dst, src, n);
}

// memcpy with the source's pages touched kPageAhead ahead (prefetch_pages), for rows of a page
// or more: the copy is cut in kPageAhead blocks, the next one's pages touched before each.
void copy_paged(uint8_t* dst, const uint8_t* src, size_t n) {
  prefetch_pages(src, src + std::min(n, kPageAhead));
  while (n > 0) {
    const size_t len = std::min(n, kPageAhead);
    if (n > len) prefetch_pages(src + len, src + len + std::min(n - len, kPageAhead));
    std::memcpy(dst, src, len);
    dst += len;
    src += len;
    n -= len;
  }
}

void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();  // streaming stores are weakly ordered: publish them before reporting done
#endif
}

// Rows of a size the compiler copies with one or two moves: no call, no run detection.
template <int64_t kRowBytes>
void copy_fixed(const uint8_t* const* src, uint8_t* out, int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; ++k) std::memcpy(out + k * kRowBytes, src[k], kRowBytes);
}

// Copies output bytes [b0, b1) (which may start or end inside a row), one copy per run of
// rows that are contiguous in the source.
template <bool kStream>
void copy_runs(const uint8_t* const* src, int64_t n, int64_t rb, uint8_t* out, int64_t b0,
               int64_t b1) {
  int64_t k = b0 / rb;
  int64_t skip = b0 - k * rb;
  while (b0 < b1) {
    int64_t end = k + 1;  // rows [k, end) are one run
    while (end < n && end * rb < b1 && src[end] == src[end - 1] + rb) ++end;
    const int64_t stop = std::min(end * rb, b1);
    const size_t len = static_cast<size_t>(stop - b0);
    if (kStream) {
      copy_streaming(out + b0, src[k] + skip, len);
    } else if (rb >= static_cast<int64_t>(kPage)) {
      copy_paged(out + b0, src[k] + skip, len);
    } else {
      std::memcpy(out + b0, src[k] + skip, len);
    }
    b0 = stop;
    k = end;
    skip = 0;
  }
}

// Copies output bytes [b0, b1); for small row sizes the range is whole rows.
void copy_range(const uint8_t* const* src, int64_t n, int64_t rb, uint8_t* out, int64_t b0,
                int64_t b1, bool stream) {
  switch (rb) {
    case 1: return copy_fixed<1>(src, out, b0, b1);
    case 2: return copy_fixed<2>(src, out, b0 / 2, b1 / 2);
    case 4: return copy_fixed<4>(src, out, b0 / 4, b1 / 4);
    case 8: return copy_fixed<8>(src, out, b0 / 8, b1 / 8);
    case 16: return copy_fixed<16>(src, out, b0 / 16, b1 / 16);
  }
  if (stream) {
    copy_runs<true>(src, n, rb, out, b0, b1);
    stream_fence();
  } else {
    copy_runs<false>(src, n, rb, out, b0, b1);
  }
}

}  // namespace

bool gather_rows(ThreadPool* pool, const GatherSpec& g, std::string* err) {
  const int64_t n = g.n, rb = g.row_bytes, total = n * rb;
  static thread_local GrowBuffer<const uint8_t*> scratch;
  const uint8_t** src = scratch.reserve(static_cast<size_t>(n));
  if (!resolve_rows(g, src, err)) return false;
  for (int64_t r = 0; r < g.num_regions; ++r) {
    if (overlaps(g.out, total, g.regions[r].data, g.regions[r].size)) {
      *err = "out overlaps regions[" + str(r) + "]; gather into a separate buffer";
      return false;
    }
  }
  const bool stream = total >= kGatherStreamBytes && rb >= 4096;
  const int threads = pool->size();
  if (total == 0) {
  } else if (threads == 0 || total < kGatherInlineBytes) {
    copy_range(src, n, rb, g.out, 0, total, stream);
  } else {
    // The calling thread and the pool's threads (run_shared) take contiguous chunks, cut at a row
    // boundary unless rows are large (then at a cache line, so that a few huge rows still use
    // every thread): a few chunks per thread, so that one woken late or preempted leaves its
    // share to the others instead of holding up the batch. The caller takes the place of one
    // pool thread (as many copy as the pool has threads, two for a pool of one): one more would
    // only wait for a core, holding its chunk, where the pool is sized to the cores.
    const int helpers = std::max(threads - 1, 1);
    const int64_t align = rb <= 4096 ? rb : 64;
    const int64_t pieces = int64_t{kGatherChunksPerThread} * (helpers + 1);
    int64_t chunk = std::max((total + pieces - 1) / pieces, kGatherMinChunkBytes);
    chunk = (chunk + align - 1) / align * align;
    const int64_t chunks = (total + chunk - 1) / chunk;
    pool->run_shared(
        chunks,
        [&](int64_t t, int) {
          const int64_t b0 = std::min(t * chunk, total), b1 = std::min(b0 + chunk, total);
          if (b0 < b1) copy_range(src, n, rb, g.out, b0, b1, stream);
        },
        helpers);
  }
  scratch.shrink_to(size_t{8} << 20);
  return true;
}

namespace {

struct Piece {
  const uint8_t* src;
  uint8_t* dst;
  int64_t len;
};

std::string piece_error(const PieceSpec& g, int64_t k, int64_t r, int64_t off, int64_t len,
                        int64_t d) {
  const std::string piece = "piece " + str(k) + ": ";
  if (r < 0 || r >= g.num_regions) {
    return piece + "region[" + str(k) + "]=" + str(r) + " is out of range [0, " +
           str(g.num_regions) + ") (the number of regions)";
  }
  if (len < 0) return piece + "length[" + str(k) + "]=" + str(len) + " is negative";
  if (off < 0) return piece + "offset[" + str(k) + "]=" + str(off) + " is negative";
  const int64_t size = g.regions[r].size;
  if (len > size || off > size - len) {
    return piece + "offset[" + str(k) + "]=" + str(off) + " + length[" + str(k) + "]=" + str(len) +
           " is past the end of regions[" + str(r) + "] (" + str(size) + " bytes)";
  }
  return piece + "dst[" + str(k) + "]=" + str(d) + " + length[" + str(k) + "]=" + str(len) +
         " is outside out (" + str(g.out_bytes) + " bytes)";
}

}  // namespace

bool gather_pieces(ThreadPool* pool, const PieceSpec& g, std::string* err) {
  const int64_t n = g.n;
  static thread_local GrowBuffer<Piece> scratch;
  Piece* pieces = scratch.reserve(static_cast<size_t>(n));
  int64_t total = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = g.region[k], off = g.offset[k], len = g.length[k], d = g.dst[k];
    const bool ok = static_cast<uint64_t>(r) < static_cast<uint64_t>(g.num_regions) && len >= 0 &&
                    off >= 0 && len <= g.regions[r].size && off <= g.regions[r].size - len &&
                    d >= 0 && len <= g.out_bytes && d <= g.out_bytes - len;
    if (!ok) {
      *err = piece_error(g, k, r, off, len, d);
      return false;
    }
    pieces[k] = {g.regions[r].data + off, g.out + d, len};
    total += len;
  }
  for (int64_t r = 0; r < g.num_regions; ++r) {
    if (overlaps(g.out, g.out_bytes, g.regions[r].data, g.regions[r].size)) {
      *err = "out overlaps regions[" + str(r) + "]; gather into a separate buffer";
      return false;
    }
  }
  const int threads = pool->size();
  if (threads <= 1 || total < kGatherInlineBytes) {
    for (int64_t k = 0; k < n; ++k) std::memcpy(pieces[k].dst, pieces[k].src, pieces[k].len);
  } else {
    // Consecutive pieces per thread, about total / threads bytes each.
    static thread_local GrowBuffer<int64_t> cuts_buf;
    int64_t* cuts = cuts_buf.reserve(static_cast<size_t>(threads) + 1);
    cuts[0] = 0;
    int64_t k = 0, acc = 0;
    for (int t = 1; t < threads; ++t) {
      const int64_t target = total / threads * t;
      while (k < n && acc < target) acc += pieces[k++].len;
      cuts[t] = k;
    }
    cuts[threads] = n;
    pool->run(threads, [&](int64_t t, int) {
      for (int64_t j = cuts[t]; j < cuts[t + 1]; ++j) {
        std::memcpy(pieces[j].dst, pieces[j].src, pieces[j].len);
      }
    });
  }
  scratch.shrink_to(size_t{8} << 20);
  return true;
}

}  // namespace fastload
