"""A pack's parts as Ray tasks, one CPU each, then the merge (``fastload pack --ray``)."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

from .._install import pip_extra
from ..formats.remote import is_url
from ._local import PackSummary
from ._parts import PARTS_DIR, merge
from ._sinks import clear_pack
from ._target import pack_to


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError(f"engine='ray' (fastload pack --ray) needs Ray: {pip_extra('ray')}") from None
    return ray


def _pack_part(source: Any, dest: str, i: int, n: int, kwargs: dict) -> dict:
    kw = dict(kwargs)  # the router checked them on the driver
    s = pack_to(
        source,
        dest,
        part=(i, n),
        on_shard=None,
        staging=None,
        storage_options=kw.pop("storage_options", None),
        overwrite=kw.pop("overwrite"),
        schema=kw.pop("schema"),
        root=kw.pop("root"),
        path_column=kw.pop("path_column"),
        missing=kw.pop("missing"),
        progress=False,
        **kw,
    )
    return {"part": i, "samples": s.samples, "seconds": s.seconds, "skipped": len(s.skipped), "bytes": s.bytes}


def _parts_with_samples(source: Any, parts: int, kwargs: dict, asked: bool) -> int:
    """``parts``, or fewer where the source does not fill that many: a part packs whole units (``block`` samples,
    or a shard's rows of fixed-size arrays) so that its shards are the ones a one-machine pack writes, and a part
    past the last unit would pack nothing. Said once, with the fix, when the caller ``asked`` for that many (not
    for the default, one part per CPU of the cluster)."""
    from ..sources import as_source
    from ._local import parse_size, part_unit

    src = as_source(
        source,
        schema=kwargs.get("schema"),
        root=kwargs.get("root"),  # its errors before any task
        path_column=kwargs.get("path_column", "path"),
        missing=kwargs.get("missing"),
        storage_options=kwargs.get("storage_options"),
    )
    unit = part_unit(src, kwargs["format"], parse_size(kwargs["shard_size"]), kwargs["block"])
    filled = max(1, -(-len(src) // unit))
    if filled >= parts or not asked:
        return min(parts, filled)
    if unit == kwargs["block"]:
        why = f"a part packs whole blocks of block={unit} samples"
        fix = f"pass a smaller block (fastload pack --block N; {-(-len(src) // parts)} gives {parts} parts)"
    else:
        why = f"a part of fixed-size arrays packs whole shards, here of {unit} rows"
        fix = "pass a smaller shard_size (fastload pack --shard-size)"
    warnings.warn(
        f"fastload pack on ray: the source's {len(src)} samples fill {filled} of the {parts} parts asked for "
        f"({why}, so that its shards are the ones a one-machine pack writes; the other parts would be "
        f"empty): it is packed as {filled} part(s); {fix} to spread it over more tasks",
        UserWarning,
        stacklevel=3,
    )
    return filled


def pack_on_ray(
    source: Any, dest: str | os.PathLike, *, parts: int | None, address: str | None, progress: bool, **kwargs: Any
):
    """Pack ``source`` as ``parts`` Ray tasks (one CPU each; ``workers`` processes inside each, default 1),
    then merge. ``source`` and ``dest`` must be paths every Ray node sees (a shared filesystem)."""
    ray = _ray()
    remote = is_url(str(dest))
    dest = str(dest).rstrip("/") if remote else Path(dest).absolute()
    if isinstance(source, (str, os.PathLike)) and not is_url(os.fspath(source)):
        source = str(Path(source).absolute())
    started_here = False
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
        started_here = True
    t0 = time.perf_counter()
    try:
        asked = parts is not None
        if parts is None:
            parts = max(1, int(ray.cluster_resources().get("CPU", 1)))
        if parts < 1:
            raise ValueError(f"parts={parts} should be >= 1")
        parts = _parts_with_samples(source, parts, kwargs, asked)
        kwargs = dict(kwargs)
        if kwargs.get("workers") is None:
            kwargs["workers"] = 1  # a task per CPU already
        if not remote and kwargs.get("overwrite") and dest.exists():
            clear_pack(dest, keep=PARTS_DIR)  # a pack's own files only; each part clears its own folder
        task = ray.remote(num_cpus=1)(_pack_part)
        pending = [task.remote(source, str(dest), i, parts, kwargs) for i in range(parts)]
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=parts, unit="part", desc=f"pack {dest} on ray")
        results = []
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                results.extend(ray.get(done))
                if bar is not None:
                    r = results[-1]
                    bar.set_postfix_str(f"part {r['part']}: {r['samples']} samples in {r['seconds']:.1f} s")
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
    finally:
        if started_here:
            ray.shutdown()
    m = merge(dest, storage_options=kwargs.get("storage_options"))
    return PackSummary(
        str(dest),
        m.layout,
        m.num_samples,
        m.skipped,
        sum(e.bytes for e in m.shards),
        len(m.shards),
        time.perf_counter() - t0,
        0,
    )
