"""Pictures for the evaluation recipes' exactness tests (test_eval_exact.py with PIL, test_eval_exact_real.py with
torchvision's and timm's own objects): an ImageFolder of JPEGs of sizes whose ``Resize(short side)`` then
``CenterCrop`` starts the crop between two source pixels, and PIL's own resize-then-crop of them (torchvision's
computation on a PIL image: ``F.resize`` is ``Image.resize`` of the whole image, ``F.center_crop`` whole pixels of
that)."""

from __future__ import annotations

import io
from importlib import metadata
from pathlib import Path

import numpy as np

# (height, width): landscape and portrait, odd sizes, upscaled and downscaled by under 2x (a downscale of 2x or more
# is decoded DCT-scaled, which is not PIL's full-size decode); each with a fractional crop origin for the sizes below
SIZES = [(301, 427), (427, 301), (250, 333), (383, 255), (211, 199), (199, 211), (311, 452), (277, 277)]
RECIPES = [(256, 224), (160, 129)]  # Resize(short side), CenterCrop(size)
# (height, width) that SHRUNK_RECIPES' resize shrinks 2x or more in both axes: decoder='native' decodes these DCT-scaled
# (at 1/2 or 1/4 size: not PIL's pixels), decoder='exact' at full size, as PIL does
SHRUNK_SIZES = [(301, 427), (427, 301), (383, 255), (223, 203), (311, 452), (277, 277)]
SHRUNK_RECIPES = [(96, 80), (100, 77)]


def _pillow_simd() -> bool:
    try:
        metadata.version("pillow-simd")
    except metadata.PackageNotFoundError:
        return False
    return True


# Pillow-SIMD (the project's venv) is matched bit for bit; plain Pillow's int32 weights have more fractional bits than
# the int16 ones fastload and Pillow-SIMD use: a level in rare pixels, two where bicubic's overshoot amplifies one
# (csrc/resize.h). The sub-pixel shift these tests catch is tens of levels.
TOLERANCE = 0 if _pillow_simd() else 2


def picture(h: int, w: int, seed: int) -> np.ndarray:
    """Smooth colour with sharp stripes: a sub-pixel shift shows as tens of levels at the edges."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(h // 9 + 2, w // 9 + 2, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC)).astype(np.int64)
    yy, xx = np.mgrid[:h, :w]
    stripes = ((xx // 7 + yy // 11) % 2) * 80 - 40
    return np.clip(base + stripes[..., None], 0, 255).astype(np.uint8)


def image_folder(root: Path, sizes: list[tuple[int, int]] = SIZES) -> Path:
    """``root/pictures/{a,b}/NN.jpg``: ``sizes`` split over two classes, in ImageFolder's order (class, then name)."""
    from PIL import Image

    folder = root / "pictures"
    for k, (h, w) in enumerate(sizes):
        d = folder / ("a" if k % 2 == 0 else "b")
        d.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(picture(h, w, k)).save(buf, format="JPEG", quality=92)
        (d / f"{k:02d}.jpg").write_bytes(buf.getvalue())
    return folder


def files(folder: Path) -> list[tuple[Path, int]]:
    """(path, label) in ImageFolder's order."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return [(p, c) for c, name in enumerate(classes) for p in sorted((folder / name).iterdir())]


def resized_hw(h: int, w: int, size: int) -> tuple[int, int]:
    """torchvision's Resize(int) output size: the shorter side ``size``, the longer ``int(size * long / short)``."""
    if w <= h:
        return int(size * h / w), size
    return size, int(size * w / h)


def shrinks_2x(h: int, w: int, size: int) -> bool:
    """Whether ``Resize(size)`` shrinks an ``h`` x ``w`` image 2x or more in both axes (decoder='native' then decodes
    it DCT-scaled: csrc/batch.cc ``choose_dct_denom``)."""
    nh, nw = resized_hw(h, w, size)
    return h >= 2 * nh and w >= 2 * nw


def resize_then_crop(image, size: int, crop: int, resample) -> np.ndarray:
    """PIL: the whole image resized so its shorter side is ``size``, then its centre ``crop`` x ``crop`` whole
    pixels (torchvision's ``Resize(size)``, ``CenterCrop(crop)`` on a PIL image)."""
    nh, nw = resized_hw(image.height, image.width, size)
    full = image.resize((nw, nh), resample)
    top, left = int(round((nh - crop) / 2.0)), int(round((nw - crop) / 2.0))
    return np.asarray(full.crop((left, top, left + crop, top + crop)))


def fractional(h: int, w: int, size: int, crop: int) -> bool:
    """Whether the centre crop of the resized image starts between two source pixels (in either axis)."""
    nh, nw = resized_hw(h, w, size)
    top, left = round((nh - crop) / 2.0), round((nw - crop) / 2.0)
    return (top * h) % nh != 0 or (left * w) % nw != 0
