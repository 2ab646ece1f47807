"""Fuzz targets: each turns one input (bytes) into what a crafted or corrupt file would present to one
reader, runs that reader the way training would, and checks the outcome.

=============  ===============================================================================================
``shard``      byte 0 picks a seed dataset, the rest is ``shard-00000.fls`` (the manifest is made to agree on
               size, checksum and sample count, so the bytes reach every structural check); the dataset is
               opened, every sample read with ``ds[i]`` (images decoded natively), one epoch run through the
               fast path (native batch decode / row gather, 2 threads), and ``verify`` run
``manifest``   byte 0 picks a seed dataset, the rest is its ``manifest.json``; then as above
``lmdb``       byte 0 picks a seed LMDB dataset, byte 1 one of its keys (manifest, a column chunk, a sample
               record), the rest is that key's new value; then open, read, fast path and verify
``jpeg``       the bytes are a JPEG: header, full decode, cropped/DCT-scaled decode, and a batch on a 2-thread
               native pool, as JPEG and as raw RGB
``mask``       the bytes are a mask field's PNG: ``decode_mask`` at its header's size (and another), equal to
               Pillow's decode where Pillow reads an 8-bit grayscale image, and a batch on a 2-thread native pool
               moved by a padded crop, flips and a rotation (csrc/mask.cc)
``all``        byte 0 picks one of the above, the rest is its input (one process fuzzes everything)
=============  ===============================================================================================

The oracle: reading may only raise fastload's own errors (``FastloadError``; ``ValueError`` from the
native module's functions, whose contract it is), and every message names the dataset; a sample's error
names the sample. Any other exception, a crash, a sanitizer report or a hang is a finding. A dataset
that fails to open or read must also fail ``verify``.

Seed datasets are built once per process in a temporary directory (``FASTLOAD_FUZZ_DIR`` to choose it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np

MAX_SAMPLES = 64  # samples read per input: bounded work whatever the manifest claims
MAX_FULL_DECODE_PIXELS = 1 << 22  # full-size decodes above this are left to the cropped path (memory)


class Finding(AssertionError):
    """The reader did something the oracle forbids (other than crashing, which speaks for itself)."""


# -- seed data --------------------------------------------------------------------------------------------

def _jpeg(arr: np.ndarray, **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    mode = kw.pop("mode", "RGB")
    Image.fromarray(arr).convert(mode).save(buf, format="JPEG", **kw)
    return buf.getvalue()


def _picture(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w, 1), y * 255 // max(h, 1), (x + y) % 256], -1).astype(np.int64)
    return np.clip(img + rng.integers(-8, 9, img.shape), 0, 255).astype(np.uint8)


def jpeg_seeds() -> list[bytes]:
    """Small JPEGs of every structure the decoder distinguishes."""
    a = _picture(24, 40, 0)
    b = _picture(17, 9, 1)
    return [
        _jpeg(a, quality=80),                       # 4:2:0
        _jpeg(a, quality=90, subsampling=0),        # 4:4:4
        _jpeg(a, quality=70, subsampling=1),        # 4:2:2
        _jpeg(a, quality=75, progressive=True),
        _jpeg(b, quality=60, mode="L"),             # grayscale
        _jpeg(b, quality=85, mode="CMYK"),          # Adobe CMYK
        _jpeg(_picture(1, 1, 2)),
        _jpeg(_picture(70, 3, 3), quality=50, optimize=True),
    ]


def _kinds_samples(n: int) -> list:
    rng = np.random.default_rng(0)
    return [{
        "label": int(rng.integers(-1000, 1000)),
        "score": float(rng.standard_normal()),
        "emb": rng.standard_normal(3).astype("<f4"),
        "var": rng.standard_normal((i % 4, 2)).astype("<f4"),
        "raw": rng.bytes(int(rng.integers(0, 12))),
        "text": "é" * (i % 3) + str(i),
    } for i in range(n)]


def _image_samples() -> list:
    out = []
    for k, data in enumerate(jpeg_seeds()):
        out.append({"image": data, "label": k})
        out.append({"image": _picture(5 + k, 3 + 2 * k, 10 + k), "label": 100 + k})  # stored raw
    return out


class Seeds:
    """The seed datasets (both formats) and per-process scratch directories."""

    def __init__(self, root: Path | None = None):
        import fastload
        from fastload import Field
        from fastload.formats import lmdb as lmdb_format

        base = root or os.environ.get("FASTLOAD_FUZZ_DIR") or None
        self.root = Path(tempfile.mkdtemp(prefix="fastload-fuzz-", dir=base))
        kinds_schema = {"var": Field.ndarray("var", "<f4", (None, 2))}
        image_schema = {"image": Field.image("image"), "label": Field.int("label")}
        self.specs = [  # name, samples, schema, transforms for the fast path
            ("kinds", _kinds_samples(12), kinds_schema, "pad"),
            ("images", _image_samples(), image_schema, "crop"),
        ]
        old_rows = lmdb_format.DEFAULT_ROWS_PER_CHUNK
        lmdb_format.DEFAULT_ROWS_PER_CHUNK = 5  # several chunks, so chunk keys are worth fuzzing
        try:
            for name, samples, schema, _ in self.specs:
                fastload.pack(samples, self.root / "seed" / name, workers=0, schema=schema)
                fastload.pack(samples, self.root / "seed" / f"{name}.lmdb", format="lmdb", workers=0, schema=schema)
        finally:
            lmdb_format.DEFAULT_ROWS_PER_CHUNK = old_rows
        self.shards = [(self.root / "seed" / name / "shard-00000.fls").read_bytes() for name, *_ in self.specs]
        self.manifests = [json.loads((self.root / "seed" / name / "manifest.json").read_text())
                          for name, *_ in self.specs]
        self.lmdb_keys = []
        for name, *_ in self.specs:
            env = lmdb_format._lmdb().open(str(self.root / "seed" / f"{name}.lmdb"), readonly=True, lock=False)
            with env.begin() as txn:
                self.lmdb_keys.append([(bytes(k), bytes(v)) for k, v in txn.cursor()])
            env.close()
        self.work = self.root / "work"
        self.work.mkdir()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# -- reading a dataset the way training does --------------------------------------------------------------

def _fast_transforms(schema) -> dict:
    """Transforms that put this schema on the fast path: a crop for images, padding for variable arrays."""
    from fastload import transforms as T

    out = {}
    for f in schema:
        if f.kind == "image":
            out[f.name] = [T.RandomResizedCrop(8), T.RandomHorizontalFlip()]
        elif f.kind == "ndarray" and not f.fixed_size and f.shape and f.shape[0] is None:
            out[f.name] = T.Pad(4, truncate=True)
    return out


def _check_message(e: Exception, path: Path, sample: int | None = None) -> None:
    from fastload import DecodeError

    msg = str(e)
    if str(path) not in msg:
        raise Finding(f"{type(e).__name__} does not name the dataset {path}: {msg}")
    if sample is not None and isinstance(e, DecodeError) and f"sample {sample}" not in msg:
        raise Finding(f"{type(e).__name__} reading sample {sample} does not name it: {msg}")


def exercise(path: Path) -> str:
    """Open, read every sample (at most MAX_SAMPLES), run one fast-path epoch over them, and check that a
    structural failure is also one for ``verify``. Returns the outcome's shape (which errors, in words,
    numbers left out) for engines that look for new outcomes. Raises Finding, or any unexpected
    exception, for the fuzzer to report."""
    import fastload
    from fastload import FastloadError, FormatError

    seen: list[str] = []
    try:
        ds = fastload.open(path, as_dict=True)
    except FastloadError as e:
        _check_message(e, path)
        _verify_fails(path)
        return "open: " + shape(e)
    structural = whole = False
    try:
        n = min(len(ds), MAX_SAMPLES)
        for i in range(n):
            try:
                ds[i]
            except FastloadError as e:
                _check_message(e, path, i)
                seen.append(shape(e))
                structural = structural or isinstance(e, FormatError)
                if isinstance(e, FormatError) and f"sample {i}" not in str(e):
                    whole = True  # the shard (or environment) itself is refused: every read would say so
                    break
        transforms = _fast_transforms(ds.schema)
    finally:
        ds.close()
    if not whole:
        tds = fastload.open(path, transforms=transforms)
        try:
            loader = fastload.DataLoader(tds, batch_size=4, sampler=range(n), num_workers=2, on_error="skip",
                                         seed=1)
            for _ in loader:
                pass
        except FastloadError as e:
            _check_message(e, path)
            seen.append("loader: " + shape(e))
            structural = structural or isinstance(e, FormatError)
        finally:
            tds.close()
    if structural:
        _verify_fails(path)
    return " | ".join(sorted(set(seen))) or "ok"


def shape(e: BaseException) -> str:
    """An error's kind and wording without paths and numbers: which check fired."""
    return f"{type(e).__name__}: " + re.sub(r"'[^']*'|-?\d+", "#", str(e))[:120]


def _verify_fails(path: Path) -> None:
    from fastload import FastloadError
    from fastload.formats.reader import read_manifest, verify

    try:
        m = read_manifest(path)
    except FastloadError:
        return
    problems = verify(path, m)  # the dataset's own format's verify
    if not problems:
        raise Finding(f"reading {path} failed on its structure but verify found no problem")


# -- the targets --------------------------------------------------------------------------------------------

class ShardTarget:
    name = "shard"

    def __init__(self, seeds: Seeds):
        self.s = seeds
        self.dirs = []
        for k, (name, *_) in enumerate(seeds.specs):
            d = seeds.work / f"shard-{name}"
            d.mkdir()
            self.dirs.append(d)

    def seeds(self) -> list[bytes]:
        return [bytes([k]) + shard for k, shard in enumerate(self.s.shards)]

    def __call__(self, data: bytes) -> None:
        import xxhash

        if not data:
            return
        k = data[0] % len(self.dirs)
        shard, d = data[1:], self.dirs[k]
        doc = json.loads(json.dumps(self.s.manifests[k]))
        entry = doc["shards"][0]
        entry["bytes"], entry["xxh3_64"] = len(shard), xxhash.xxh3_64_hexdigest(shard)
        if len(shard) >= 24:  # the header's sample count, so that changing it reaches the later checks
            n = struct.unpack_from("<Q", shard, 16)[0]
            if n < 1 << 62:
                entry["num_samples"] = doc["num_samples"] = n
        (d / "shard-00000.fls").write_bytes(shard)
        (d / "manifest.json").write_text(json.dumps(doc))
        return exercise(d)


class ManifestTarget:
    name = "manifest"

    def __init__(self, seeds: Seeds):
        self.s = seeds
        self.dirs = []
        for name, *_ in seeds.specs:
            d = seeds.work / f"manifest-{name}"
            shutil.copytree(seeds.root / "seed" / name, d)
            self.dirs.append(d)

    def seeds(self) -> list[bytes]:
        return [bytes([k]) + json.dumps(m, indent=1).encode() for k, m in enumerate(self.s.manifests)]

    def __call__(self, data: bytes) -> None:
        if not data:
            return
        d = self.dirs[data[0] % len(self.dirs)]
        (d / "manifest.json").write_bytes(data[1:])
        return exercise(d)


class LmdbTarget:
    name = "lmdb"

    def __init__(self, seeds: Seeds):
        self.s = seeds
        self.pristine = [seeds.root / "seed" / f"{name}.lmdb" / "data.mdb" for name, *_ in seeds.specs]
        self.dirs = []
        for name, *_ in seeds.specs:
            d = seeds.work / f"lmdb-{name}"
            d.mkdir()
            self.dirs.append(d)

    def seeds(self) -> list[bytes]:
        out = []
        for k, keys in enumerate(self.s.lmdb_keys):
            out.extend(bytes([k, j]) + v for j, (_, v) in enumerate(keys))
        return out

    def __call__(self, data: bytes) -> None:
        from fastload.formats import lmdb as lmdb_format

        if len(data) < 2:
            return
        k = data[0] % len(self.dirs)
        keys = self.s.lmdb_keys[k]
        key = keys[data[1] % len(keys)][0]
        d = self.dirs[k]
        shutil.copyfile(self.pristine[k], d / "data.mdb")
        env = lmdb_format._lmdb().open(str(d), subdir=True, lock=False, sync=False, metasync=False,
                                       map_size=1 << 30)
        try:
            with env.begin(write=True) as txn:
                if data[1] >= 0xF0:  # a few selector values delete the key instead
                    txn.delete(key)
                else:
                    txn.put(key, data[2:])
        finally:
            env.close()
        return exercise(d)


class JpegTarget:
    name = "jpeg"

    def __init__(self, seeds: Seeds | None = None):
        from fastload import _C

        self.C = _C
        self.pool = _C.Pool(2)

    def seeds(self) -> list[bytes]:
        return jpeg_seeds()

    def __call__(self, data: bytes) -> None:
        C = self.C
        sig = []
        h = hashlib.blake2b(data, digest_size=16).digest()
        try:
            hh, ww, _ = C.jpeg_info(data)
        except ValueError as e:
            hh = ww = 0
            sig.append(shape(e))
        if hh and hh * ww <= MAX_FULL_DECODE_PIXELS:
            try:
                arr = C.decode_jpeg(data)
            except ValueError as e:
                sig.append(shape(e))
            else:
                if arr.shape != (hh, ww, 3):
                    raise Finding(f"decode_jpeg gave shape {arr.shape}, the header says {hh}x{ww}")
        # a crop inside the recorded size most of the time, sometimes anywhere
        src_h, src_w = (hh, ww) if hh and h[0] % 8 else (1 + h[1] % 64, 1 + h[2] % 64)
        top, left = h[3] % src_h, h[4] % src_w
        crop = (top, left, 1 + h[5] % (src_h - top), 1 + h[6] % (src_w - left))
        if h[7] % 16 == 0:
            crop = (crop[0] - h[8] % 3, crop[1], crop[2] + h[9] % 5, crop[3])
        out_hw = (1 + h[10] % 24, 1 + h[11] % 24)
        flip, dct = bool(h[12] & 1), bool(h[12] & 2) or src_h * src_w > MAX_FULL_DECODE_PIXELS
        try:
            out = C.decode_crop_resize(data, crop, out_hw, flip, dct)
        except ValueError as e:
            sig.append(shape(e))
        else:
            if out.shape != out_hw + (3,):
                raise Finding(f"decode_crop_resize gave shape {out.shape}, asked for {out_hw}")
        # one batch on the thread pool: the bytes as a JPEG, as raw RGB, and a slice of them
        n = len(data)
        raw_h = max(1, n // 3 // max(1, src_w))
        region = np.frombuffer(data, np.uint8) if n else np.zeros(0, np.uint8)
        cut = h[13] % (n + 1)
        args = dict(
            regions=[region, b"\x00" * 7],
            region=np.array([0, 0, 0, h[14] % 2], np.int64),
            offset=np.array([0, 0, cut, 0], np.int64),
            length=np.array([n, n, n - cut, 7 if h[14] % 2 else 0], np.int64),
            encoding=np.array([0, 1, 0, h[15] % 3], np.uint8),
            src_hw=np.array([[src_h, src_w], [raw_h, src_w], [src_h, src_w], [1, 1]], np.int32),
            crop=np.array([crop, (0, 0, raw_h, src_w), crop, (0, 0, 1, 1)], np.int32),
            flip=np.array([flip, not flip, flip, 0], np.uint8),
            out=np.full((4,) + out_hw + (3,), 7, np.uint8),
        )
        fails = C.decode_batch(self.pool, args["regions"], args["region"], args["offset"], args["length"],
                               args["encoding"], args["src_hw"], args["crop"], args["flip"], args["out"], dct)
        for k, msg in fails:
            if not 0 <= k < 4 or not isinstance(msg, str) or not msg:
                raise Finding(f"decode_batch reported failure {k!r}: {msg!r}")
            if args["out"][k].any():
                raise Finding(f"decode_batch left failed sample {k} not zeroed ({msg})")
            sig.append(f"batch {k}: " + re.sub(r"-?\d+", "#", msg)[:80])
        return " | ".join(sig) or "ok"


def mask_seeds() -> list[bytes]:
    """Mask PNGs as the packer writes them (8-bit grayscale), and the other PNG kinds a file may hold."""
    from fastload.fields.mask import encode_png

    labels = (_picture(20, 28, 3)[..., 0] // 50).astype(np.uint8)
    out = [encode_png(labels), encode_png(np.zeros((1, 1), np.uint8)), encode_png(labels[:, :5])]
    for mode in ("RGB", "P", "1", "I;16"):
        buf = io.BytesIO()
        from PIL import Image

        Image.fromarray(labels).convert(mode).save(buf, format="PNG")
        out.append(buf.getvalue())
    # chunks that would make libpng convert the gray values (refused), and harmless ones (decoded as Pillow does)
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    for extra in (chunk(b"gAMA", struct.pack(">I", 100000)), chunk(b"tRNS", b"\x00\x03"), chunk(b"sBIT", b"\x04")
                  + chunk(b"tEXt", b"k\x00v")):
        out.append(out[0][:33] + extra + out[0][33:])
    return out


def _pil_gray(data: bytes) -> np.ndarray | None:
    """Pillow's 8-bit grayscale decode of ``data``, or None where Pillow does not read it as one."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img) if img.mode == "L" else None
    except Exception:  # noqa: BLE001 - any refusal by Pillow just leaves nothing to compare with
        return None


class MaskTarget:
    name = "mask"

    def __init__(self, seeds: Seeds | None = None):
        from fastload import _C

        self.C = _C
        self.pool = _C.Pool(2)

    def seeds(self) -> list[bytes]:
        return mask_seeds()

    def __call__(self, data: bytes) -> None:
        C = self.C
        sig = []
        h = hashlib.blake2b(data, digest_size=16).digest()
        # the header's size most of the time (so the bytes reach libpng), sometimes any size
        hh, ww = (struct.unpack(">II", data[16:24])[::-1] if len(data) >= 24 and h[0] % 8 else
                  (1 + h[1] % 64, 1 + h[2] % 64))
        hh, ww = min(int(hh), 1 << 31), min(int(ww), 1 << 31)
        if 1 <= hh and 1 <= ww and hh * ww <= MAX_FULL_DECODE_PIXELS:
            try:
                arr = C.decode_mask(data, hh, ww)
            except ValueError as e:
                sig.append(shape(e))
            else:
                if arr.shape != (hh, ww):
                    raise Finding(f"decode_mask gave shape {arr.shape}, asked for {hh}x{ww}")
                ref = _pil_gray(data)  # a class id must come back as itself: what Pillow reads, where it reads one
                if ref is not None and ref.shape == arr.shape and not np.array_equal(ref, arr):
                    raise Finding(f"decode_mask differs from Pillow's decode in {int((ref != arr).sum())} pixels")
        if not (1 <= hh <= 4096 and 1 <= ww <= 4096):
            return " | ".join(sig) or "ok"
        # one batch: the bytes whole and cut, a padded window (-1 = fill), flips and a rotation
        n = len(data)
        oh, ow = 1 + h[3] % 24, 1 + h[4] % 24
        top, left = h[5] % hh, h[6] % ww
        crop = (top, left, 1 + h[7] % (hh - top), 1 + h[8] % (ww - left))
        rows = np.where(np.arange(oh) % 5 == 4, -1, np.arange(oh) % min(oh, 1 + h[9] % oh)).astype(np.int32)
        cols = np.where(np.arange(ow) % 7 == 6, -1, np.arange(ow) % min(ow, 1 + h[10] % ow)).astype(np.int32)
        angle = np.deg2rad(h[11] * 360 / 256)
        c, s = np.cos(angle), np.sin(angle)
        affine = np.array([c, -s, ow / 2 * (1 - c) + oh / 2 * s, s, c, oh / 2 * (1 - c) - ow / 2 * s])
        region = np.frombuffer(data, np.uint8) if n else np.zeros(0, np.uint8)
        cut = h[12] % (n + 1)
        out = np.full((2, oh, ow), 7, np.uint8)
        fails = C.decode_mask_batch(
            self.pool, [region], np.zeros(2, np.int64), np.array([0, cut], np.int64), np.array([n, n - cut], np.int64),
            np.array([[hh, ww]] * 2, np.int32), np.array([crop] * 2, np.int32),
            np.array([[1 + h[9] % oh, 1 + h[10] % ow], [oh, ow]], np.int32), np.array([1, 0], np.uint8),
            np.stack([rows, rows]), np.stack([cols, cols]), np.array([h[13] & 1, h[13] & 2 > 0], np.uint8),
            np.array([h[13] & 4 > 0, 1], np.uint8), np.array([h[13] & 8 > 0, h[13] & 16 > 0], np.uint8),
            np.stack([affine, affine]), int(h[14]), out)
        for k, msg in fails:
            if not 0 <= k < 2 or not isinstance(msg, str) or not msg:
                raise Finding(f"decode_mask_batch reported failure {k!r}: {msg!r}")
            if out[k].any():
                raise Finding(f"decode_mask_batch left failed sample {k} not zeroed ({msg})")
            sig.append(f"batch {k}: " + re.sub(r"-?\d+", "#", msg)[:80])
        return " | ".join(sig) or "ok"


class AllTarget:
    """Every target behind one selector byte: one process (one atheris run) fuzzes them all."""

    name = "all"

    def __init__(self, seeds: Seeds):
        self.targets = [ShardTarget(seeds), ManifestTarget(seeds), LmdbTarget(seeds), JpegTarget(seeds)]

    def seeds(self) -> list[bytes]:
        return [bytes([k]) + s for k, t in enumerate(self.targets) for s in t.seeds()]

    def __call__(self, data: bytes) -> None:
        if data:
            k = data[0] % len(self.targets)
            return f"{k}: {self.targets[k](data[1:])}"


TARGETS = {t.name: t for t in (ShardTarget, ManifestTarget, LmdbTarget, JpegTarget, MaskTarget, AllTarget)}


def make(name: str, seeds: Seeds | None = None):
    """The target called ``name`` (see TARGETS), with the seed datasets it needs."""
    if name not in TARGETS:
        raise ValueError(f"unknown fuzz target {name!r}; choose from {', '.join(TARGETS)}")
    return TARGETS[name](seeds if seeds is not None or name in ("jpeg", "mask") else Seeds())


def allowed(e: BaseException) -> bool:
    """Exceptions a target may end with: fastload's own (the native module's ValueError is caught
    inside the targets already)."""
    from fastload import FastloadError

    return isinstance(e, FastloadError)
