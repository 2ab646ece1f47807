"""Shared fixtures: every test builds its data at test time, in a temporary directory."""

from __future__ import annotations

import io
import signal
from pathlib import Path

import numpy as np
import pytest

# A shell without job control starts background commands (`make test &`) with SIGINT ignored, and Python
# then keeps it ignored. The Ctrl-C tests need the usual KeyboardInterrupt, here and in the processes
# they start (an ignored signal stays ignored across exec; a handled one does not).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def jpeg_bytes(h: int, w: int, seed: int = 0, quality: int = 90, mode: str = "RGB") -> bytes:
    """A smooth random picture as JPEG bytes (smooth so resampling comparisons are meaningful)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def png_bytes(h: int, w: int, seed: int = 0) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def pil_rgb(data: bytes) -> np.ndarray:
    """What PIL decodes ``data`` to, as RGB (the reference for stored and decoded pictures)."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def make_image_folder(root: Path, classes: int = 3, per_class: int = 4, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class_{c}"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            h, w = (int(x) for x in rng.integers(40, 120, size=2))
            (d / f"img_{k:03d}.jpg").write_bytes(jpeg_bytes(h, w, seed=c * 100 + k))
    return root


def packed_image_folder(root: Path, classes: int = 3, per_class: int = 4, workers: int = 0) -> Path:
    """``make_image_folder`` packed with ``fastload.pack``: the path of the packed dataset."""
    import fastload

    make_image_folder(root / "src", classes=classes, per_class=per_class)
    fastload.pack(root / "src", root / "ds", workers=workers)
    return root / "ds"


def dir_bytes(path: Path) -> dict[str, bytes]:
    """Every file of a directory by name: two packs are equal byte for byte when these are."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "folder")


FORMATS = ["shards", "lmdb"]


@pytest.fixture(scope="session")
def packed_images_by_format(tmp_path_factory) -> Path:
    """One image folder (4 classes of 12 pictures) packed once per session in every format: ``root / "shards"``
    (16K shards, so several) and ``root / "lmdb"``, for tests that compare the formats or read both.
    Tests must not change these files (copy them first)."""
    import fastload

    root = tmp_path_factory.mktemp("packed_images")
    folder = make_image_folder(root / "src", classes=4, per_class=12)
    fastload.pack(folder, root / "shards", workers=0, shard_size="16K")
    fastload.pack(folder, root / "lmdb", workers=0, format="lmdb")
    return root


@pytest.fixture(params=FORMATS)
def packed_images(request, packed_images_by_format: Path) -> Path:
    """The same pictures in one format: a test that takes this runs once for shards and once for LMDB."""
    return packed_images_by_format / request.param


@pytest.fixture(scope="session")
def pack_once(tmp_path_factory):
    """``pack_once(key, make_source, **pack_options) -> path``: the dataset ``fastload.pack(make_source(),
    path, **pack_options)`` writes, packed once per session per ``key`` (``format=`` in the options picks the
    format: give each format its own key). Tests must not change these files (copy them first)."""
    import fastload

    done: dict[str, Path] = {}

    def get(key: str, make_source, **options) -> Path:
        if key not in done:
            dest = tmp_path_factory.mktemp(f"packed_{key}") / "ds"
            fastload.pack(make_source(), dest, **options)
            done[key] = dest
        return done[key]

    get.root = tmp_path_factory.mktemp("pack_once_sources")
    return get
