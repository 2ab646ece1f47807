"""Shared fixtures: every test builds its data at test time, in a temporary directory."""

from __future__ import annotations

import contextlib
import io
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

# A shell without job control starts background commands (`make test &`) with SIGINT ignored, and Python
# then keeps it ignored. The Ctrl-C tests need the usual KeyboardInterrupt, here and in the processes
# they start (an ignored signal stays ignored across exec; a handled one does not).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Signals whose handler a test must leave as it found it (Lightning's signal connector, accelerate and
# job-scheduler code install handlers for these): a handler left in the pytest process changes every later
# test, and every process they fork (a pack's encode workers inherited a SIGTERM handler and slept through
# terminate()). SIGALRM is pytest-timeout's.
WATCHED_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGCHLD, signal.SIGPIPE]
# torch's DataLoader installs its SIGCHLD handler (it reports a dead worker) at its first multi-process iterator
# and keeps it for the life of the process, on purpose: installed here, it is every test's starting point, not a
# change made by whichever test first starts torch's workers.
torch.utils.data._utils.signal_handling._set_SIGCHLD_handler()


def signal_handlers() -> dict[str, object]:
    return {s.name: signal.getsignal(s) for s in WATCHED_SIGNALS}


def put_back_signal_handlers(before: dict[str, object]) -> dict[str, tuple]:
    """Puts back the handlers of ``before`` (a ``signal_handlers()``) that have changed since; returns those
    (name: (before, after))."""
    after = signal_handlers()
    changed = {name: (before[name], after[name]) for name in before if after[name] != before[name]}
    for name, (old, _) in changed.items():
        if old is not None:  # None: a handler not installed from Python, which Python cannot put back
            signal.signal(signal.Signals[name], old)
    return changed


@contextlib.contextmanager
def signal_handlers_kept():
    """Puts the watched signal handlers back as they were once the block ends: around code that installs
    handlers for good (``ray.init()`` installs a SIGTERM handler that ``ray.shutdown()`` leaves in place)."""
    before = signal_handlers()
    try:
        yield
    finally:
        put_back_signal_handlers(before)


def _left_changed(who: str, changed: dict[str, tuple]) -> str:
    return (f"{who} left signal handlers changed (before -> after): {changed}; put back what it changes "
            "(conftest.signal_handlers_kept does)")


@pytest.fixture(autouse=True)
def _signal_handlers_restored(request):
    """Fails a test that leaves a signal handler other than it found it (and puts the old one back, so that one
    offender does not fail every test after it). A module- or class-scoped fixture is checked when the last test of
    its module has been torn down (pytest_runtest_teardown below)."""
    before = signal_handlers()
    yield
    changed = put_back_signal_handlers(before)
    if changed:
        pytest.fail(_left_changed(request.node.nodeid, changed), pytrace=False)


_module_handlers: dict[str, dict[str, object]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    module = item.getparent(pytest.Module)
    if module is not None:  # the handlers before the module's fixtures
        _module_handlers.setdefault(module.nodeid, signal_handlers())
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    module = item.getparent(pytest.Module)
    if module is not None and (nextitem is None or nextitem.getparent(pytest.Module) is not module):
        changed = put_back_signal_handlers(_module_handlers.pop(module.nodeid))
        if changed:  # its fixtures are torn down: what a module- or class-scoped fixture changed is still there
            pytest.fail(_left_changed(f"{module.nodeid} (a module- or class-scoped fixture)", changed),
                        pytrace=False)
    return result


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster (2 CPUs) for the tests of one module; skips without ray. ``ray.init()`` installs a
    SIGTERM handler that ``ray.shutdown()`` leaves in place: put back, so that the rest of the suite (and every
    process it forks) does not run under it."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    with signal_handlers_kept():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()


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


class Samples(list):
    """A map-style dataset of dict samples (a list already has ``__getitem__`` and ``__len__``)."""


def every_kind_samples(n: int) -> Samples:
    """Every field kind: JPEGs of different sizes, int, float, a fixed and a variable array (``i % 6`` long:
    empty to 5), str and bytes (empty for every fourth). Pack with ``schema=EVERY_KIND_SCHEMA``."""
    rng = np.random.default_rng(0)
    return Samples({
        "image": jpeg_bytes(int(rng.integers(30, 90)), int(rng.integers(30, 90)), seed=i),
        "label": i * 7 - 20,
        "score": i / 8,
        "emb": rng.standard_normal(3).astype("<f4"),
        "tokens": np.arange(i % 6, dtype=np.int32) + i,
        "name": f"sample {i} é",
        "raw": bytes([i]) * (i % 4),
    } for i in range(n))


def every_kind_schema() -> dict:
    """What ``every_kind_samples`` cannot infer: the JPEG bytes are an image, the tokens of any length."""
    from fastload import Field

    return {"image": Field.image("image"), "tokens": Field.ndarray("tokens", "<i4", (None,))}


class Numbered(torch.utils.data.Dataset):
    """``n`` samples ``{"image": a small picture of varying size, "label": i % 4, "id": i}``, a map-style
    dataset: the id tells which sample a rank, a process or a resumed run saw (distributed, Lightning and
    accelerate runs)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        from PIL import Image

        return {"image": Image.open(io.BytesIO(jpeg_bytes(20 + i % 6, 26 + i % 4, seed=i))), "label": i % 4, "id": i}


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


@pytest.fixture
def image_shards(packed_images_by_format: Path) -> Path:
    """``packed_images``' pictures in shards only, for tests about something other than the format."""
    return packed_images_by_format / "shards"


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


@pytest.fixture
def small_images(pack_once) -> Path:
    """12 pictures (2 classes of 6) in 4KB shards (several), packed once per session: for tests that need a
    packed image dataset and nothing particular about it. Tests must not change these files."""
    return pack_once("small_images", lambda: make_image_folder(Path(pack_once.root) / "small_images", classes=2,
                                                               per_class=6), workers=0, shard_size=4096)


def pack_every_kind(pack_once, fmt: str) -> Path:
    return pack_once(f"every_kind_{fmt}", lambda: every_kind_samples(13), schema=every_kind_schema(), workers=0,
                     format=fmt, shard_size="4K")


@pytest.fixture
def every_kind(pack_once) -> Path:
    """``every_kind_samples(13)`` in 4KB shards, packed once per session. Tests must not change these files."""
    return pack_every_kind(pack_once, "shards")


@pytest.fixture(params=FORMATS)
def every_kind_each_format(pack_once, request) -> Path:
    """The same samples in one format: a test that takes this runs once for shards and once for LMDB."""
    return pack_every_kind(pack_once, request.param)


@pytest.fixture(scope="session")
def numbered(pack_once):
    """``numbered(n)``: the path of ``Numbered(n)``, packed once per session per ``n``."""
    return lambda n: pack_once(f"numbered_{n}", lambda: Numbered(n), workers=0)


def open_train(path, **kw):
    """A packed image dataset with the training crop (RandomResizedCrop 32 + flip): the loader tests' usual one."""
    import fastload
    from fastload import transforms as T

    return fastload.open(path, transforms={"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]}, **kw)


def resumed_and_reference(make, workers_after, done=4):
    """Resume mid-epoch: the images of an uninterrupted epoch of ``make(1)`` after its first ``done`` batches,
    and those of a loader ``make(workers_after)`` restored from the state saved after ``done`` batches."""
    ref = [b[0].clone() for b in make(1)]
    restored = restore_after(make(1), done, lambda: make(workers_after))
    return [b[0].clone() for b in restored], ref[done:]


def restore_after(loader, done, make):
    """A new loader ``make()`` restored from ``loader``'s state after the first ``done`` batches of an epoch (the
    iterator dropped before ``make`` runs, as when a job is stopped)."""
    it = iter(loader)
    for _ in range(done):
        next(it)
    state = loader.state_dict()
    del it
    restored = make()
    restored.load_state_dict(state)
    return restored
