"""Build an ImageFolder tree of JPEG crops of real photographs that ship inside PyPI wheels.

The photographs come from three pinned wheels, read straight out of the zip (nothing is installed):

* scikit-image ``skimage/data/*`` (astronaut, chelsea, coffee, rocket, motorcycle_left/right, ...),
* scikit-learn ``sklearn/datasets/images/*.jpg`` (china, flower),
* matplotlib ``mpl-data/sample_data/*`` (grace_hopper).

Only colour photographs are kept: a file is skipped when it is unreadable, has several frames, has a
side under ``MIN_SOURCE_SIDE`` pixels, is grayscale (by mode or by content), has fewer than
``MIN_SOURCE_COLORS`` distinct colours, or is on the ``SYNTHETIC`` list of drawn test images.
With the pinned wheels this keeps 12 photographs::

    astronaut chelsea china coffee flower grace_hopper hubble_deep_field ihc
    motorcycle_left motorcycle_right retina rocket

Each kept photograph becomes one class; each class gets ``per_class`` random crops (varied size,
aspect, optional resize, flip) re-encoded as JPEG with varied quality and chroma subsampling, a few
progressive and a few grayscale.  The output is deterministic: the same seed and Pillow build give
byte-identical files, whatever the number of workers.

On-disk layout (``OUT`` is what torchvision's ``ImageFolder`` expects)::

    OUT/
      .photos.json                    stamp + manifest (see below); ImageFolder ignores root files
      astronaut/astronaut_000000.jpg
      astronaut/astronaut_000001.jpg
      ...
      rocket/rocket_000039.jpg

``.photos.json`` is written last, so it exists only for a complete tree::

    {"format": 1,
     "params": {"generator": 1, "per_class": 40, "seed": 0, "pillow": "12.1.1.post0",
                "wheels": ["scikit-image==0.26.0", "scikit-learn==1.9.1", "matplotlib==3.11.2"]},
     "classes": ["astronaut", ...],
     "sources": {"astronaut": "scikit-image==0.26.0:skimage/data/astronaut.png 512x512", ...},
     "skipped": {"scikit-image==0.26.0:skimage/data/camera.png": "grayscale image (mode L)", ...},
     "files": [{"path": "astronaut/astronaut_000000.jpg", "bytes": 20933, "width": 180,
                "height": 211, "quality": 83, "subsampling": "4:2:0", "progressive": false,
                "gray": false}, ...]}

A later run with equal ``params`` whose files all exist with the recorded sizes returns at once
(it does not even need the wheels).

Usage::

    python bench/photos.py OUT [--per-class N] [--seed S] [--cache DIR] [--workers W] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

__all__ = [
    "WHEELS",
    "WheelSpec",
    "WheelDownloadError",
    "Photo",
    "CropSpec",
    "fetch_wheels",
    "extract_images",
    "select_photos",
    "load_sources",
    "plan_crops",
    "render_crop",
    "make_crops",
    "build_photo_folder",
    "main",
]

#: Bump whenever the crop/encode recipe changes: it invalidates existing stamps.
GENERATOR_VERSION = 1
STAMP_NAME = ".photos.json"
DEFAULT_CACHE = Path(__file__).resolve().parent / "data" / "wheels"

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".bmp", ".webp")
MIN_SOURCE_SIDE = 256
MIN_SOURCE_COLORS = 4096
#: Drawn or rendered test images that pass the automatic rules (or might in a later release).
SYNTHETIC = frozenset({
    "color", "logo", "logo2", "phantom", "horse", "chessboard_rgb", "chessboard_gray",
    "microaneurysms", "minduka_present_blue_pack", "no_time_for_that_tiny",
    "multipage", "multipage_rgb",
})

# Crop recipe (GENERATOR_VERSION covers these numbers).
CROP_SIDE = (96, 640)            # uniform side (capped by the image) before the aspect is applied
CROP_ASPECT = (3 / 4, 4 / 3)     # width / height, log-uniform
RESIZE_P = 0.25
RESIZE_SCALE = (0.5, 1.25)       # log-uniform; output sides stay >= RESIZE_MIN_SIDE
RESIZE_MIN_SIDE = 32
FLIP_P = 0.5
GRAY_P = 0.05
PROGRESSIVE_P = 0.08
QUALITY = (60, 95)               # inclusive
SUBSAMPLING = (("4:2:0", 0.75), ("4:4:4", 0.17), ("4:2:2", 0.08))


# --------------------------------------------------------------------------------------- wheels

@dataclass(frozen=True)
class WheelSpec:
    """A pinned wheel and the folder inside it whose direct children are candidate photos."""

    name: str
    version: str
    folder: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def file_prefix(self) -> str:
        """Wheel file names use the normalized project name: ``scikit_image-0.26.0-...whl``."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-"


WHEELS = (
    WheelSpec("scikit-image", "0.26.0", "skimage/data/"),
    WheelSpec("scikit-learn", "1.9.1", "sklearn/datasets/images/"),
    WheelSpec("matplotlib", "3.11.2", "matplotlib/mpl-data/sample_data/"),
)


class WheelDownloadError(RuntimeError):
    """A pinned wheel is not in the cache and pip could not download it."""


def _run_pip(args: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=900)


def _cached_wheel(cache_dir: Path, spec: WheelSpec) -> Path | None:
    # Any platform's wheel of the pinned version holds the same data files, so take any.
    for path in sorted(cache_dir.glob(spec.file_prefix + "*.whl")):
        if not zipfile.is_zipfile(path):
            raise ValueError(f"cached wheel {path} for {spec.requirement} is not a zip file; "
                             f"delete it and run again to download it afresh")
        return path
    return None


def _download_hint(wheels: Sequence[WheelSpec]) -> str:
    return (f"To build without network, download the wheels where PyPI is reachable: "
            f"`python -m pip download --no-deps --only-binary=:all: "
            f"{' '.join(w.requirement for w in wheels)} -d WHEELS` "
            f"(a wheel for any platform or Python of these versions works: only its images are "
            f"read), copy WHEELS to this machine and pass `--cache WHEELS` "
            f"(API: build_photo_folder(..., cache_dir=WHEELS)).")


def _pip_excerpt(output: str, keep: int = 6) -> str:
    """The last lines pip printed, without index-location noise and repeated retry warnings."""
    lines = [line[:300] for line in output.splitlines()
             if line.strip() and not line.startswith("WARNING: Location")]
    retries = [i for i, line in enumerate(lines) if "Retrying" in line]
    lines = [line for i, line in enumerate(lines) if i not in retries[:-1]]
    return "\n  ".join(lines[-keep:])


def _download_wheel(cache: Path, spec: WheelSpec, wheels: Sequence[WheelSpec],
                    still_missing: Sequence[WheelSpec]) -> Path:
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        args = ["download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                spec.requirement, "-d", tmp]
        try:
            proc = _run_pip(args)
            detail = f"pip exited with status {proc.returncode}"
            said = _pip_excerpt((proc.stdout or "") + "\n" + (proc.stderr or ""))
        except (OSError, subprocess.TimeoutExpired) as exc:
            proc, detail, said = None, f"running pip failed: {exc}", ""
        got = sorted(Path(tmp).glob(spec.file_prefix + "*.whl"))
        if proc is not None and proc.returncode == 0 and got:
            path = cache / got[0].name
            os.replace(got[0], path)
            return path
    if proc is not None and proc.returncode == 0:
        detail = f"pip succeeded but left no {spec.file_prefix}*.whl"
    also = (f"The cache also lacks {', '.join(w.requirement for w in still_missing)}. "
            if still_missing else "")
    raise WheelDownloadError(
        f"could not download the wheel {spec.requirement} into {cache}: {detail}"
        + (f"; pip said:\n  {said}\n" if said else ". ") + also + _download_hint(wheels))


def fetch_wheels(cache_dir: str | os.PathLike | None = None,
                 wheels: Sequence[WheelSpec] = WHEELS) -> dict[WheelSpec, Path]:
    """Return the cached wheel of each spec, downloading (with pip) only those that are missing."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    found = {spec: _cached_wheel(cache, spec) for spec in wheels}
    missing = [spec for spec, path in found.items() if path is None]
    for i, spec in enumerate(missing):
        found[spec] = _download_wheel(cache, spec, wheels, missing[i + 1:])
    return found


def extract_images(wheel_path: str | os.PathLike, folder: str,
                   suffixes: Sequence[str] = IMAGE_SUFFIXES) -> dict[str, bytes]:
    """Read the image files that sit directly in ``folder`` of a wheel (zip), by member name."""
    prefix = folder.rstrip("/") + "/"
    with zipfile.ZipFile(wheel_path) as zf:
        return {
            name: zf.read(name)
            for name in sorted(zf.namelist())
            if name.startswith(prefix) and "/" not in name[len(prefix):]
            and name.lower().endswith(tuple(suffixes))
        }


# ------------------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class Photo:
    """One source photograph: its class name, where it came from, and its encoded bytes."""

    name: str
    origin: str
    data: bytes


def class_name(stem: str) -> str:
    """``"Grace Hopper-1"`` -> ``"grace_hopper_1"``."""
    return re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_") or "photo"


def load_photo(data: bytes):
    """Decode a source photo to an RGB PIL image."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


def _reject_reason(name: str, data: bytes, min_side: int) -> str | None:
    from PIL import Image, ImageChops

    try:
        with Image.open(io.BytesIO(data)) as im:
            frames = getattr(im, "n_frames", 1)
            if frames != 1:
                return f"{frames} frames"
            if min(im.size) < min_side:
                return f"too small ({im.width}x{im.height}, need a side >= {min_side})"
            if im.mode in ("1", "L", "LA", "I", "I;16", "F"):
                return f"grayscale image (mode {im.mode})"
            rgb = im.convert("RGB")
    except Exception as exc:  # any decoder failure means "not a usable photo"
        return f"unreadable by Pillow ({type(exc).__name__})"
    r, g, b = rgb.split()
    if ImageChops.difference(r, g).getbbox() is None and ImageChops.difference(r, b).getbbox() is None:
        return f"grayscale content in mode {rgb.mode}"
    if rgb.getcolors(MIN_SOURCE_COLORS) is not None:
        return f"fewer than {MIN_SOURCE_COLORS} colours (drawn, not photographed)"
    if class_name(Path(name).stem) in SYNTHETIC:
        return "synthetic test image (on the SYNTHETIC list)"
    return None


def select_photos(members: Mapping[str, bytes], origin: str = "",
                  min_side: int = MIN_SOURCE_SIDE) -> tuple[list[Photo], dict[str, str]]:
    """Split image files into kept photographs and ``{origin:name: reason}`` for skipped ones."""
    from PIL import Image

    kept, skipped = [], {}
    for name, data in sorted(members.items()):
        where = f"{origin}:{name}" if origin else name
        reason = _reject_reason(name, data, min_side)
        if reason is not None:
            skipped[where] = reason
            continue
        with Image.open(io.BytesIO(data)) as im:
            size = f"{im.width}x{im.height}"
        kept.append(Photo(class_name(Path(name).stem), f"{where} {size}", data))
    return kept, skipped


def load_sources(wheel_paths: Mapping[WheelSpec, Path],
                 min_side: int = MIN_SOURCE_SIDE) -> tuple[list[Photo], dict[str, str]]:
    """Kept photos of all wheels sorted by class name, and the skipped files with reasons."""
    photos, skipped = [], {}
    for spec, path in wheel_paths.items():
        kept, sk = select_photos(extract_images(path, spec.folder), spec.requirement, min_side)
        photos += kept
        skipped.update(sk)
    names = Counter(p.name for p in photos)
    clashes = sorted(n for n, c in names.items() if c > 1)
    if clashes:
        raise ValueError(f"class names {clashes} come from several source files "
                         f"({[p.origin for p in photos if p.name in clashes]}); "
                         f"expected one file per class name: rename or add one to SYNTHETIC")
    if not photos:
        raise ValueError(f"no usable photographs in {[str(p) for p in wheel_paths.values()]}; "
                         f"expected colour images with sides >= {min_side}")
    return sorted(photos, key=lambda p: p.name), skipped


# --------------------------------------------------------------------------------------- crops

@dataclass(frozen=True)
class CropSpec:
    """One output image: crop ``box`` (left, upper, right, lower) of the source, resize to
    ``size``, flip, optionally make grayscale, and encode as JPEG."""

    box: tuple[int, int, int, int]
    size: tuple[int, int]
    flip: bool
    gray: bool
    quality: int
    subsampling: str   # "4:2:0", "4:2:2", "4:4:4", or "gray" for grayscale images
    progressive: bool


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def crop_rng(seed: int, key: str) -> random.Random:
    """The random stream for one class; str seeds hash with SHA-512, so it is stable across runs."""
    return random.Random(f"fastload-photos:{seed}:{key}")


def plan_crops(image_size: tuple[int, int], count: int, *, seed: int = 0,
               key: str = "") -> list[CropSpec]:
    """``count`` crop specs for an image of ``image_size``; a larger ``count`` extends the list."""
    width, height = image_size
    if width < 1 or height < 1 or count < 0:
        raise ValueError(f"{image_size=} should be positive and {count=} >= 0")
    rng = crop_rng(seed, key)
    short = min(width, height)
    lo, hi = min(CROP_SIDE[0], short), min(CROP_SIDE[1], short)
    labels, weights = zip(*SUBSAMPLING)
    specs = []
    for _ in range(count):
        # Draw every value every time so that one choice never shifts the others' stream.
        side = rng.uniform(lo, hi)
        aspect = _log_uniform(rng, *CROP_ASPECT)
        u_x, u_y = rng.random(), rng.random()
        resize, scale = rng.random() < RESIZE_P, _log_uniform(rng, *RESIZE_SCALE)
        flip, gray, progressive = rng.random() < FLIP_P, rng.random() < GRAY_P, rng.random() < PROGRESSIVE_P
        quality = rng.randint(*QUALITY)
        subsampling = rng.choices(labels, weights)[0]

        w = min(width, max(1, round(side * math.sqrt(aspect))))
        h = min(height, max(1, round(side / math.sqrt(aspect))))
        x, y = int(u_x * (width - w + 1)), int(u_y * (height - h + 1))
        size = (w, h)
        if resize:
            size = (max(RESIZE_MIN_SIDE, round(w * scale)), max(RESIZE_MIN_SIDE, round(h * scale)))
        specs.append(CropSpec((x, y, x + w, y + h), size, flip, gray, quality,
                              "gray" if gray else subsampling, progressive))
    return specs


def render_crop(image, spec: CropSpec) -> bytes:
    """Apply ``spec`` to an RGB PIL image and return the JPEG bytes."""
    from PIL import Image

    out = image.crop(spec.box)
    if out.size != spec.size:
        out = out.resize(spec.size, Image.Resampling.LANCZOS)
    if spec.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    options = {"quality": spec.quality, "progressive": spec.progressive, "optimize": False}
    if spec.gray:
        out = out.convert("L")
    else:
        options["subsampling"] = spec.subsampling
    buf = io.BytesIO()
    out.save(buf, format="JPEG", **options)
    return buf.getvalue()


def make_crops(image, count: int, *, seed: int = 0, key: str = "") -> Iterator[tuple[CropSpec, bytes]]:
    """Yield ``(spec, jpeg_bytes)`` for ``count`` deterministic crops of an RGB PIL image."""
    image = image if image.mode == "RGB" else image.convert("RGB")
    for spec in plan_crops(image.size, count, seed=seed, key=key):
        yield spec, render_crop(image, spec)


# ---------------------------------------------------------------------------------- the folder

_SOURCES: dict[str, bytes] = {}
_DECODED: dict[str, object] = {}


def _init_worker(sources: dict[str, bytes]) -> None:
    _SOURCES.clear()
    _SOURCES.update(sources)
    _DECODED.clear()


def _render_job(job: tuple[str, str, CropSpec]) -> dict:
    name, path, spec = job
    if name not in _DECODED:
        _DECODED[name] = load_photo(_SOURCES[name])
    data = render_crop(_DECODED[name], spec)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return {"path": path, "bytes": len(data), "width": spec.size[0], "height": spec.size[1],
            "quality": spec.quality, "subsampling": spec.subsampling,
            "progressive": spec.progressive, "gray": spec.gray}


def _stamp_params(per_class: int, seed: int, wheels: Sequence[WheelSpec]) -> dict:
    from PIL import __version__ as pillow_version

    return {"generator": GENERATOR_VERSION, "per_class": per_class, "seed": seed,
            "pillow": pillow_version, "wheels": [w.requirement for w in wheels]}


def _file_name(name: str, index: int) -> str:
    return f"{name}/{name}_{index:06d}.jpg"


def _reusable_stamp(out: Path, params: dict) -> dict | None:
    try:
        stamp = json.loads((out / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("format") != 1 or stamp.get("params") != params:
        return None
    for rec in stamp["files"]:
        try:
            if (out / rec["path"]).stat().st_size != rec["bytes"]:
                return None
        except OSError:
            return None
    return stamp


def _summary(out: Path, stamp: dict, seconds: float, reused: bool) -> dict:
    files = stamp["files"]
    sizes = [r["bytes"] for r in files]
    return {
        "out_dir": str(out),
        "classes": stamp["classes"],
        "per_class": stamp["params"]["per_class"],
        "count": len(files),
        "total_bytes": sum(sizes),
        "bytes": {"min": min(sizes), "median": int(statistics.median(sizes)), "max": max(sizes)},
        "width": [min(r["width"] for r in files), max(r["width"] for r in files)],
        "height": [min(r["height"] for r in files), max(r["height"] for r in files)],
        "quality": [min(r["quality"] for r in files), max(r["quality"] for r in files)],
        "subsampling": dict(sorted(Counter(r["subsampling"] for r in files).items())),
        "progressive": sum(r["progressive"] for r in files),
        "grayscale": sum(r["gray"] for r in files),
        "sources": stamp["sources"],
        "skipped": stamp["skipped"],
        "seconds": round(seconds, 3),
        "reused": reused,
    }


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def build_photo_folder(out_dir: str | os.PathLike, per_class: int = 40, seed: int = 0,
                       cache_dir: str | os.PathLike | None = None, workers: int | None = None,
                       *, progress: bool = True, wheels: Sequence[WheelSpec] = WHEELS) -> dict:
    """Build (or reuse) the ImageFolder tree in ``out_dir`` and return a summary dict.

    ``cache_dir`` holds the wheels (default ``bench/data/wheels``); ``workers`` defaults to the
    usable cores, and ``workers <= 1`` renders in this process.  Summary keys: ``classes``,
    ``count``, ``total_bytes``, ``bytes`` (min/median/max), ``width``/``height``/``quality``
    ([min, max]), ``subsampling`` (counts), ``progressive``, ``grayscale``, ``sources``,
    ``skipped``, ``seconds`` and ``reused`` (True when an identical complete tree was found).
    """
    if isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1:
        raise ValueError(f"{per_class=} should be an int >= 1")
    if workers is not None and workers < 0:
        raise ValueError(f"{workers=} should be >= 0 (0 or 1: render in this process)")
    start = time.perf_counter()
    out = Path(out_dir)
    params = _stamp_params(per_class, seed, wheels)
    stamp = _reusable_stamp(out, params)
    if stamp is not None:
        return _summary(out, stamp, time.perf_counter() - start, reused=True)

    photos, skipped = load_sources(fetch_wheels(cache_dir, wheels))
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP_NAME).unlink(missing_ok=True)   # an interrupted rebuild must not look complete

    from PIL import Image
    from tqdm import tqdm

    jobs = []
    for photo in photos:
        (out / photo.name).mkdir(exist_ok=True)
        with Image.open(io.BytesIO(photo.data)) as im:
            size = im.size
        for i, spec in enumerate(plan_crops(size, per_class, seed=seed, key=photo.name)):
            jobs.append((photo.name, str(out / _file_name(photo.name, i)), spec))

    sources = {p.name: p.data for p in photos}
    workers = _default_workers() if workers is None else workers
    workers = min(workers, len(jobs))
    records = []
    with tqdm(total=len(jobs), desc=f"photos -> {out}", unit="img", disable=not progress) as bar:
        if workers <= 1:
            _init_worker(sources)
            try:
                for job in jobs:
                    records.append(_render_job(job))
                    bar.update()
            finally:
                _init_worker({})
        else:
            import multiprocessing

            chunk = max(1, min(32, len(jobs) // (workers * 8)))
            with multiprocessing.Pool(workers, _init_worker, (sources,)) as pool:
                for rec in pool.imap_unordered(_render_job, jobs, chunksize=chunk):
                    records.append(rec)
                    bar.update()

    # Remove files of ours that an earlier, larger build left behind (ImageFolder would list them).
    expected = {job[1] for job in jobs}
    for photo in photos:
        pattern = re.compile(rf"{re.escape(photo.name)}_\d{{6}}\.jpg(\.tmp\d+)?")
        for path in (out / photo.name).iterdir():
            if pattern.fullmatch(path.name) and str(path) not in expected:
                path.unlink()

    for rec in records:
        rec["path"] = Path(rec["path"]).relative_to(out).as_posix()
    stamp = {"format": 1, "params": params, "classes": [p.name for p in photos],
             "sources": {p.name: p.origin for p in photos}, "skipped": skipped,
             "files": sorted(records, key=lambda r: r["path"])}
    tmp = out / f"{STAMP_NAME}.tmp"
    tmp.write_text(json.dumps(stamp, indent=1))
    os.replace(tmp, out / STAMP_NAME)
    return _summary(out, stamp, time.perf_counter() - start, reused=False)


# ------------------------------------------------------------------------------------------ CLI

def _format_summary(s: dict) -> str:
    mib = s["total_bytes"] / 2**20
    lines = [
        f"{s['out_dir']}: {s['count']} JPEGs in {len(s['classes'])} classes "
        f"({s['per_class']} each), {mib:.1f} MiB, "
        f"{'reused existing tree' if s['reused'] else 'built'} in {s['seconds']:.2f} s",
        f"bytes min/median/max: {s['bytes']['min']} / {s['bytes']['median']} / {s['bytes']['max']}",
        f"width {s['width'][0]}..{s['width'][1]}, height {s['height'][0]}..{s['height'][1]}, "
        f"quality {s['quality'][0]}..{s['quality'][1]}",
        "subsampling " + ", ".join(f"{k}: {v}" for k, v in s["subsampling"].items())
        + f"; progressive: {s['progressive']}; grayscale: {s['grayscale']}",
        "classes:",
        *(f"  {name:20s} {s['sources'][name]}" for name in s["classes"]),
        f"skipped {len(s['skipped'])} files:",
        *(f"  {where}: {why}" for where, why in s["skipped"].items()),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output folder (ImageFolder layout)")
    parser.add_argument("--per-class", type=int, default=40, help="crops per class (default 40)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--cache", type=Path, default=None,
                        help=f"folder of (pre-)downloaded wheels (default {DEFAULT_CACHE})")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes (default: all usable cores; 1: no subprocesses)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    try:
        summary = build_photo_folder(args.out, args.per_class, args.seed, args.cache, args.workers)
    except (WheelDownloadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1) if args.json else _format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
