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
