"""Tests for bench/photos.py: the photo-crop ImageFolder builder.

Everything runs offline on images and wheels built here; one test uses the real pinned wheels when
they are already in bench/data/wheels and is skipped otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import zipfile
from pathlib import Path

import pytest

PIL = pytest.importorskip("PIL", reason="Pillow is required. Run `pip install pillow-simd`")
from PIL import Image, ImageChops, ImageFilter, ImageStat, JpegImagePlugin  # noqa: E402

pytestmark = pytest.mark.timeout(120)

_PATH = Path(__file__).resolve().parents[1] / "bench" / "photos.py"
_spec = importlib.util.spec_from_file_location("fastload_bench_photos", _PATH)
photos = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = photos          # dataclasses and worker pickling look the module up
_spec.loader.exec_module(photos)
_REAL_RUN_PIP = photos._run_pip


# ------------------------------------------------------------------------------------ helpers

def fake_photo(width=400, height=300, seed=0) -> Image.Image:
    """A colourful, smooth-ish RGB image with well over 4096 colours."""
    r = Image.linear_gradient("L").resize((width, height))
    g = Image.radial_gradient("L").resize((width, height))
    noise = Image.effect_noise((width, height), 60 + seed).filter(ImageFilter.GaussianBlur(2))
    b = ImageChops.add(ImageChops.invert(r), noise, scale=2.0)
    return Image.merge("RGB", (r, g, b))


def encode(im: Image.Image, fmt="PNG", **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


FAKE = photos.WheelSpec("fake-photos", "1.0", "fake_photos/data/")


@pytest.fixture
def fake_cache(tmp_path) -> Path:
    cache = tmp_path / "wheels"
    cache.mkdir()
    make_wheel(cache / "fake_photos-1.0-py3-none-any.whl", {
        "fake_photos/data/Sun Set.png": encode(fake_photo(400, 300, 0)),
        "fake_photos/data/tall.jpg": encode(fake_photo(260, 500, 7), "JPEG", quality=92),
        "fake_photos/data/tiny.png": encode(fake_photo(64, 64)),
        "fake_photos/data/README.txt": b"not an image",
    })
    return cache


@pytest.fixture(autouse=True)
def no_pip(monkeypatch):
    """Fail loudly instead of reaching for the network."""
    def refuse(args):
        raise AssertionError(f"unexpected pip call: {args}")
    monkeypatch.setattr(photos, "_run_pip", refuse)


def tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.jpg"))}


# ------------------------------------------------------------------------------ wheels/sources

def test_wheel_file_prefix_matches_pip_names():
    prefixes = {w.name: w.file_prefix for w in photos.WHEELS}
    assert prefixes == {"scikit-image": "scikit_image-0.26.0-",
                        "scikit-learn": "scikit_learn-1.9.1-",
                        "matplotlib": "matplotlib-3.11.2-"}


def test_extract_images_reads_only_direct_image_children(tmp_path):
    png = encode(fake_photo(32, 32))
    wheel = make_wheel(tmp_path / "x.whl", {
        "pkg/data/a.png": png,
        "pkg/data/B.JPG": b"jpeg?",
        "pkg/data/sub/c.png": png,
        "pkg/data/notes.txt": b"text",
        "pkg/database/d.png": png,
        "other/data/e.png": png,
    })
    got = photos.extract_images(wheel, "pkg/data")
    assert got == {"pkg/data/B.JPG": b"jpeg?", "pkg/data/a.png": png}


def test_select_photos_keeps_colour_photos_and_says_why_others_are_skipped():
    photo = fake_photo()
    gray_rgb = photo.convert("L").convert("RGB")
    frames = [photo.convert("P"), photo.rotate(90).convert("P")]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    members = {
        "d/Grace Hopper-1.JPG": encode(photo, "JPEG"),
        "d/small.png": encode(photo.resize((200, 150))),
        "d/gray.png": encode(photo.convert("L")),
        "d/grayrgb.png": encode(gray_rgb),
        "d/anim.gif": gif.getvalue(),
        "d/flat.png": encode(Image.new("RGB", (300, 300), (10, 200, 30))),
        "d/color.png": encode(photo),
        "d/broken.png": b"\x89PNG garbage",
    }
    kept, skipped = photos.select_photos(members, origin="pkg==1")
    assert [(p.name, p.origin) for p in kept] == [("grace_hopper_1", "pkg==1:d/Grace Hopper-1.JPG 400x300")]
    assert kept[0].data == members["d/Grace Hopper-1.JPG"]
    reasons = {k.split(":", 1)[1]: v for k, v in skipped.items()}
    assert set(reasons) == set(members) - {"d/Grace Hopper-1.JPG"}
    assert reasons["d/small.png"].startswith("too small (200x150")
    assert reasons["d/gray.png"] == "grayscale image (mode L)"
    assert reasons["d/grayrgb.png"].startswith("grayscale content")
    assert reasons["d/anim.gif"] == "2 frames"
    assert reasons["d/flat.png"].startswith("fewer than 4096 colours")
    assert reasons["d/color.png"].startswith("synthetic")
    assert reasons["d/broken.png"].startswith("unreadable")


def test_load_sources_rejects_clashing_class_names(tmp_path):
    png = encode(fake_photo())
    a = make_wheel(tmp_path / "a.whl", {"a/x.png": png})
    b = make_wheel(tmp_path / "b.whl", {"b/X.jpg": encode(fake_photo(), "JPEG")})
    specs = {photos.WheelSpec("a", "1", "a/"): a, photos.WheelSpec("b", "1", "b/"): b}
    with pytest.raises(ValueError, match=r"class names \['x'\]"):
        photos.load_sources(specs)


def test_download_failure_names_the_wheel_and_the_cache_option(tmp_path, monkeypatch):
    def offline_pip(args):   # the real pip, with no index at all: it fails as it would offline
        return _REAL_RUN_PIP(list(args) + ["--no-index"])

    monkeypatch.setattr(photos, "_run_pip", offline_pip)
    with pytest.raises(photos.WheelDownloadError) as info:
        photos.fetch_wheels(tmp_path, [FAKE])
    message = str(info.value)
    assert "fake-photos==1.0" in message and "--cache" in message and "pip download" in message
    assert not list(tmp_path.iterdir())          # no half-downloaded leftovers


def test_fetch_wheels_uses_the_cache_without_pip(fake_cache):
    assert photos.fetch_wheels(fake_cache, [FAKE]) == {FAKE: fake_cache / "fake_photos-1.0-py3-none-any.whl"}


def test_fetch_wheels_downloads_only_the_missing_wheels(tmp_path, fake_cache, monkeypatch):
    other = photos.WheelSpec("other.Pkg", "2.0", "other/")
    calls = []

    def fake_pip(args):
        calls.append(list(args))
        dest = Path(args[args.index("-d") + 1])
        make_wheel(dest / "other_pkg-2.0-py3-none-any.whl", {"other/a.txt": b"x"})
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(photos, "_run_pip", fake_pip)
    got = photos.fetch_wheels(fake_cache, [FAKE, other])
    assert got == {FAKE: fake_cache / "fake_photos-1.0-py3-none-any.whl",
                   other: fake_cache / "other_pkg-2.0-py3-none-any.whl"}
    assert len(calls) == 1 and "other.Pkg==2.0" in calls[0] and "--no-deps" in calls[0]
    assert photos.fetch_wheels(fake_cache, [FAKE, other]) == got and len(calls) == 1
    assert sorted(p.name for p in fake_cache.iterdir()) == sorted(p.name for p in got.values())


def test_fetch_wheels_rejects_a_corrupt_cached_wheel(tmp_path):
    (tmp_path / "fake_photos-1.0-py3-none-any.whl").write_bytes(b"truncated")
    with pytest.raises(ValueError, match="not a zip file; delete it"):
        photos.fetch_wheels(tmp_path, [FAKE])


# ---------------------------------------------------------------------------------- crops

def test_plan_crops_stays_inside_the_image_and_in_range():
    size = (500, 340)
    specs = photos.plan_crops(size, 400, seed=3, key="k")
    for s in specs:
        left, top, right, bottom = s.box
        assert 0 <= left < right <= size[0] and 0 <= top < bottom <= size[1]
        w, h = right - left, bottom - top
        assert max(w, h) >= 96 * (3 / 4) ** 0.5 - 1
        if s.size == (w, h):
            assert 0.74 <= w / h <= 1.34 or w == size[0] or h == size[1]
        assert min(s.size) >= 32
        assert 60 <= s.quality <= 95
        assert s.subsampling == "gray" if s.gray else s.subsampling in ("4:2:0", "4:2:2", "4:4:4")
    # A longer plan extends a shorter one, and the stream depends on seed and key.
    assert photos.plan_crops(size, 50, seed=3, key="k") == specs[:50]
    assert photos.plan_crops(size, 50, seed=4, key="k") != specs[:50]
    assert photos.plan_crops(size, 50, seed=3, key="j") != specs[:50]


def test_plan_crops_rejects_bad_arguments():
    with pytest.raises(ValueError, match="count=-1"):
        photos.plan_crops((10, 10), -1)


def test_make_crops_is_deterministic_and_varied():
    image = fake_photo()
    first = list(photos.make_crops(image, 200, seed=5, key="sun"))
    again = list(photos.make_crops(image.copy(), 200, seed=5, key="sun"))
    assert first == again
    other = [data for _, data in photos.make_crops(image, 20, seed=6, key="sun")]
    assert other != [data for _, data in first[:20]]

    sizes, qtables, samplings, progressive, gray = set(), set(), set(), 0, 0
    for spec, data in first:
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "JPEG" and im.size == spec.size
            assert im.mode == ("L" if spec.gray else "RGB")
            sizes.add(im.size)
            qtables.add(tuple(tuple(t) for t in im.quantization.values()))
            if im.mode == "RGB":
                samplings.add(JpegImagePlugin.get_sampling(im))
            is_progressive = bool(im.info.get("progressive"))
            assert is_progressive == spec.progressive
            progressive += is_progressive
            gray += im.mode == "L"
    assert len(sizes) > 150 and len(qtables) > 20
    assert samplings == {0, 1, 2}        # 4:4:4, 4:2:2 and 4:2:0 all occur
    assert 3 <= progressive <= 40 and 2 <= gray <= 30


def test_render_crop_matches_a_pil_crop_of_the_source():
    image = fake_photo()
    specs = [s for s in photos.plan_crops(image.size, 60, seed=1, key="ref")
             if not s.gray and s.size == (s.box[2] - s.box[0], s.box[3] - s.box[1])]
    assert len(specs) > 10
    for spec in specs:
        decoded = Image.open(io.BytesIO(photos.render_crop(image, spec))).convert("RGB")
        if spec.flip:
            decoded = decoded.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        diff = ImageStat.Stat(ImageChops.difference(decoded, image.crop(spec.box))).mean
        assert max(diff) < 6, (spec, diff)


# ---------------------------------------------------------------------------------- folder

def build(out, cache, **kw):
    kw.setdefault("progress", False)
    return photos.build_photo_folder(out, cache_dir=cache, wheels=[FAKE], **kw)


def test_build_photo_folder_layout_summary_and_stamp(tmp_path, fake_cache):
    out = tmp_path / "out"
    summary = build(out, fake_cache, per_class=7, seed=2, workers=1)
    assert summary["classes"] == ["sun_set", "tall"]
    assert summary["count"] == 14 and summary["per_class"] == 7 and not summary["reused"]
    assert sorted(p.name for p in out.iterdir()) == [".photos.json", "sun_set", "tall"]
    for name in ("sun_set", "tall"):
        assert sorted(p.name for p in (out / name).iterdir()) == [f"{name}_{i:06d}.jpg" for i in range(7)]
    files = sorted(out.rglob("*.jpg"))
    assert summary["total_bytes"] == sum(p.stat().st_size for p in files)
    assert summary["bytes"]["min"] == min(p.stat().st_size for p in files)
    assert summary["bytes"]["max"] == max(p.stat().st_size for p in files)
    assert summary["skipped"] == {"fake-photos==1.0:fake_photos/data/tiny.png":
                                  "too small (64x64, need a side >= 256)"}
    stamp = json.loads((out / ".photos.json").read_text())
    assert stamp["params"]["per_class"] == 7 and stamp["params"]["seed"] == 2
    assert [r["path"] for r in stamp["files"]] == [p.relative_to(out).as_posix() for p in files]
    for rec in stamp["files"]:
        with Image.open(out / rec["path"]) as im:
            assert im.size == (rec["width"], rec["height"])


def test_build_is_deterministic_across_worker_counts(tmp_path, fake_cache):
    one = build(tmp_path / "one", fake_cache, per_class=12, seed=9, workers=1)
    two = build(tmp_path / "two", fake_cache, per_class=12, seed=9, workers=2)
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")
    assert {k: v for k, v in one.items() if k not in ("out_dir", "seconds")} == \
           {k: v for k, v in two.items() if k not in ("out_dir", "seconds")}
    build(tmp_path / "three", fake_cache, per_class=12, seed=10, workers=1)
    assert tree_digest(tmp_path / "three") != tree_digest(tmp_path / "one")


def test_second_build_reuses_a_complete_tree(tmp_path, fake_cache):
    out = tmp_path / "out"
    first = build(out, fake_cache, per_class=5, workers=1)
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.jpg")}
    for wheel in fake_cache.iterdir():     # reuse must not even need the wheels
        wheel.unlink()
    again = build(out, fake_cache, per_class=5, workers=1)
    assert again["reused"] and {p: p.stat().st_mtime_ns for p in out.rglob("*.jpg")} == mtimes
    assert {k: v for k, v in again.items() if k not in ("seconds", "reused")} == \
           {k: v for k, v in first.items() if k not in ("seconds", "reused")}


def test_changed_or_damaged_tree_is_rebuilt_and_stale_files_removed(tmp_path, fake_cache):
    out = tmp_path / "out"
    build(out, fake_cache, per_class=6, workers=1)
    before = tree_digest(out)
    victim = out / "tall" / "tall_000002.jpg"
    victim.write_bytes(victim.read_bytes()[:100])
    assert not build(out, fake_cache, per_class=6, workers=1)["reused"]
    assert tree_digest(out) == before

    smaller = build(out, fake_cache, per_class=3, workers=1)
    assert not smaller["reused"] and smaller["count"] == 6
    # Crops are a prefix-stable stream: the first three files are unchanged, the rest are gone.
    assert tree_digest(out) == {k: v for k, v in before.items() if int(k[-10:-4]) < 3}


def test_build_rejects_bad_arguments(tmp_path, fake_cache):
    with pytest.raises(ValueError, match="per_class=0"):
        build(tmp_path, fake_cache, per_class=0)
    with pytest.raises(ValueError, match="workers=-2"):
        build(tmp_path, fake_cache, workers=-2)


# ------------------------------------------------------------------------------------- CLI

def test_cli_builds_with_the_pinned_wheel_names(tmp_path, capsys):
    cache = tmp_path / "wheels"
    cache.mkdir()
    folders = {w.requirement: w for w in photos.WHEELS}
    make_wheel(cache / "scikit_image-0.26.0-cp311-cp311-manylinux_2_28_x86_64.whl",
               {folders["scikit-image==0.26.0"].folder + "astronaut.png": encode(fake_photo())})
    make_wheel(cache / "scikit_learn-1.9.1-cp312-cp312-win_amd64.whl",
               {folders["scikit-learn==1.9.1"].folder + "china.jpg": encode(fake_photo(), "JPEG")})
    make_wheel(cache / "matplotlib-3.11.2-py3-none-any.whl",
               {folders["matplotlib==3.11.2"].folder + "grace_hopper.jpg": encode(fake_photo(), "JPEG")})
    out = tmp_path / "out"
    rc = photos.main([str(out), "--per-class", "2", "--cache", str(cache), "--workers", "1", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["classes"] == ["astronaut", "china", "grace_hopper"] and summary["count"] == 6
    assert photos.main([str(out), "--per-class", "2", "--cache", str(cache)]) == 0
    assert "reused existing tree" in capsys.readouterr().out


def test_cli_reports_a_failed_download(tmp_path, capsys, monkeypatch):
    class Failed:
        returncode, stdout = 1, ""
        stderr = "ERROR: Could not find a version that satisfies the requirement scikit-image==0.26.0"
    monkeypatch.setattr(photos, "_run_pip", lambda args: Failed())
    assert photos.main([str(tmp_path / "out"), "--cache", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "scikit-image==0.26.0" in err and "--cache WHEELS" in err and "Could not find" in err


# ------------------------------------------------------------------------------ real wheels

def _real_wheels_cached() -> bool:
    cache = photos.DEFAULT_CACHE
    return cache.is_dir() and all(any(cache.glob(w.file_prefix + "*.whl")) for w in photos.WHEELS)


@pytest.mark.skipif(not _real_wheels_cached(), reason="pinned wheels not in bench/data/wheels; "
                    "run `python bench/photos.py OUT` once with network to fetch them")
def test_real_wheels_give_the_expected_photographs(tmp_path):
    summary = photos.build_photo_folder(tmp_path, per_class=2, workers=1, progress=False)
    assert summary["classes"] == [
        "astronaut", "chelsea", "china", "coffee", "flower", "grace_hopper", "hubble_deep_field",
        "ihc", "motorcycle_left", "motorcycle_right", "retina", "rocket"]
    assert summary["count"] == 24
    assert "camera.png" in " ".join(summary["skipped"])
