"""Issue 32 (raw arrays): row-copy kernels for 150 KB rows, from the shard's mapping (page-cache pages, mostly
4 KiB) and from the same rows in process memory (numpy: huge pages), CPU time of the copying thread per epoch
(1,024 rows in random order, batches of 64), rounds interleaved. The kernels are compiled at run time (g++,
-O3) from the source below and called through ctypes, so variants can be compared without rebuilding fastload:

    main        csrc/gather.cc before 2026-11-28's change: SSE loads, streaming stores, a T0 prefetch 1 KiB ahead
    touch       the same after one T2 prefetch per 4 KiB page of the row (what csrc/gather.cc does now)
    memcpy      glibc's memcpy (regular stores)
    touch+memcpy

    python bench/copy_kernels.py [--rounds 20] [--outputs 1] [--data bench/data]

``--outputs N`` rotates the batches over N output buffers (9.6 MB each): with 1 the output stays in a 32 MiB L3,
where regular stores win; with 4 (38 MB) it does not, which is where streaming stores pay (a loader's slots:
the caller holds batches, a device copy reads them). np.take rows (the in-RAM ceiling's copy) are in the table.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import parser  # noqa: E402
from arrays_ab import data  # noqa: E402
from fastload._ring import huge_empty  # noqa: E402

SOURCE = r"""
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <emmintrin.h>
#include <xmmintrin.h>
static void stream_copy(uint8_t* dst, const uint8_t* src, size_t n) {
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head); dst += head; src += head; n -= head;
  for (; n >= 64; n -= 64, dst += 64, src += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(src) + 1024, _MM_HINT_T0);
    const __m128i a = _mm_loadu_si128((const __m128i*)(src)), b = _mm_loadu_si128((const __m128i*)(src + 16));
    const __m128i c = _mm_loadu_si128((const __m128i*)(src + 32)), d = _mm_loadu_si128((const __m128i*)(src + 48));
    _mm_stream_si128((__m128i*)(dst), a); _mm_stream_si128((__m128i*)(dst + 16), b);
    _mm_stream_si128((__m128i*)(dst + 32), c); _mm_stream_si128((__m128i*)(dst + 48), d);
  }
  std::memcpy(dst, src, n);
}
static void touch(const uint8_t* p, size_t n) {
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095}; a < reinterpret_cast<uintptr_t>(p) + n;
       a += 4096) __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 1);
}
extern "C" void gather(int kind, const uint8_t* base, const int64_t* off, int64_t n, int64_t rb, uint8_t* out) {
  for (int64_t k = 0; k < n; ++k) {
    const uint8_t* s = base + off[k];
    uint8_t* d = out + k * rb;
    if (kind == 1 || kind == 3) touch(s, rb);
    if (kind <= 1) stream_copy(d, s, rb); else std::memcpy(d, s, rb);
  }
  _mm_sfence();
}
"""
KINDS = {"main": 0, "touch": 1, "memcpy": 2, "touch+memcpy": 3}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--outputs", type=int, default=1, help="output buffers the batches rotate over")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "k.cc").write_text(SOURCE)
    subprocess.run(["g++", "-O3", "-shared", "-fPIC", "-o", str(tmp / "k.so"), str(tmp / "k.cc")], check=True)
    lib = ctypes.CDLL(str(tmp / "k.so"))
    ds = fastload.open(data(args.data, "raw"))
    (seg,) = ds.reader.segments
    seg.open()
    mapped = np.asarray(seg.columns[("x", "values")]).reshape(len(ds), -1)
    sources = {"map": mapped, "RAM": mapped.copy()}
    rb = mapped.shape[1]
    outs = [huge_empty((64, rb), torch.uint8).numpy() for _ in range(args.outputs)]

    def ptr(a):
        return a.ctypes.data_as(ctypes.c_void_p)

    def kernel(src, kind):
        def run():
            order = np.random.default_rng(0).permutation(len(src))
            for b in range(len(src) // 64):
                off = np.ascontiguousarray(order[b * 64:(b + 1) * 64] * rb, dtype=np.int64)
                lib.gather(kind, ptr(src), ptr(off), 64, rb, ptr(outs[b % len(outs)]))
        return run

    def take(src):
        def run():
            order = np.random.default_rng(0).permutation(len(src))
            for b in range(len(src) // 64):
                np.take(src, order[b * 64:(b + 1) * 64], axis=0, out=outs[b % len(outs)], mode="clip")
        return run

    fns = {f"np.take, {w}": take(s) for w, s in sources.items()}
    fns.update({f"{k}, {w}": kernel(s, v) for k, v in KINDS.items() for w, s in sources.items()})
    for fn in fns.values():
        fn()
    cpu: dict = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, fn in fns.items():
            c = time.thread_time()
            fn()
            cpu[k].append(time.thread_time() - c)
    top = "np.take, RAM"
    print(f"{len(ds)} rows of {rb} bytes, batches of 64, {args.outputs} output buffer(s), {args.rounds} rounds\n")
    print("| kernel, source | CPU ms an epoch (median) | / np.take from RAM (CPU) |")
    print("|---|---:|---:|")
    for k in fns:
        ratio = np.median(np.array(cpu[top]) / np.array(cpu[k]))
        print(f"| {k} | {1e3 * np.median(cpu[k]):.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
