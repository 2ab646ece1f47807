"""The ``fastload`` command: ``pack``, ``inspect``, ``verify``, ``bench``, ``doctor``."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import click

from ._errors import FastloadError
from ._install import pip_extra
from ._version import __version__
from .formats.registry import DEFAULT_FORMAT, FORMATS
from .formats.remote import is_url


class DatasetArg(click.ParamType):
    """What ``fastload.open`` takes: a URL (s3://, gs://, az://, https://, any fsspec URL; credentials and endpoint
    from the backend's usual environment, e.g. AWS_ENDPOINT_URL) or a local path, which must exist."""

    name = "dataset"

    def convert(self, value, param, ctx):
        if is_url(value):
            return value
        return click.Path(exists=True, path_type=Path).convert(value, param, ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="fastload")  # not by distribution name: torch-fastload
def main() -> None:
    """fastload: pack datasets into shards or LMDB, check them, and measure loading speed."""


# --storage-option, the command-line form of fastload.open's (and fastload.pack's) storage_options= (pack, merge,
# verify, inspect and bench).
storage_option = click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=lambda c, p, v: _storage_options(v),
    help="For a URL: an option of its fsspec backend, as fastload.open's storage_options= (e.g. anon=true, "
    "endpoint_url=...); repeat for more.",
)


@main.command()
@click.argument("src", callback=lambda c, p, v: _source(c, p, v))
@click.argument("dst")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(FORMATS)),
    default=DEFAULT_FORMAT,
    show_default=True,
    help="Output format.",
)
@click.option(
    "--image-mode",
    type=click.Choice(["auto", "passthrough", "jpeg", "raw"]),
    default="auto",
    show_default=True,
    help="auto: JPEGs untouched, other images raw if small else JPEG; passthrough: JPEG bytes only; "
    "jpeg: re-encode all; raw: store uint8 pixels.",
)
@click.option("--max-side", type=click.IntRange(min=1), default=None, help="Shrink images whose longer side exceeds N.")
@click.option(
    "--quality", type=click.IntRange(1, 100), default=90, show_default=True, help="JPEG quality for re-encoding."
)
@click.option(
    "--check",
    type=click.Choice(["decode", "header"]),
    default="decode",
    show_default=True,
    help="How stored JPEGs are validated: a full (1/8-scale) decode, or header + end marker only "
    "(faster; corrupt data then shows at load time).",
)
@click.option(
    "--shard-size",
    default="256MB",
    show_default=True,
    callback=lambda c, p, v: _checked(_size, v),
    help="Target shard size (K/M/G units).",
)
@click.option("--workers", type=click.IntRange(min=0), default=None, help="Worker processes [default: all cores].")
@click.option("--overwrite", is_flag=True, help="Replace an existing dataset at DST.")
@click.option("--skip-bad", is_flag=True, help="Skip unreadable source samples and list them in the manifest.")
@click.option(
    "--max-skipped",
    type=click.FloatRange(0, 1),
    default=0.1,
    show_default=True,
    help="With --skip-bad: fail when more than this share of the samples would be skipped (or all).",
)
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="For CSV/JSONL manifests: the directory paths are relative to [default: the manifest's].",
)
@click.option("--path-column", default="path", show_default=True, help="For CSV/JSONL manifests: the path column.")
@click.option(
    "--missing",
    "missing",
    multiple=True,
    metavar="COLUMN=VALUE",
    callback=lambda c, p, v: _missing(v),
    help="For CSV/JSONL manifests: what a blank (or null) cell of COLUMN stands for; repeat for more "
    "columns. Without it a blank cell stops the pack.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option(
    "--block",
    type=click.IntRange(min=1),
    default=65536,
    show_default=True,
    help="Shards never straddle a multiple of this many samples; a part is whole blocks.",
)
@click.option(
    "--part",
    default=None,
    metavar="I/N",
    callback=lambda c, p, v: _checked(_part, v),
    help="Pack only part I of N (from 0) into DST/parts/I; then `fastload merge DST`.",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    is_flag=False,
    flag_value="auto",
    metavar="[ADDRESS]",
    help="Pack the parts as Ray tasks on the cluster at ADDRESS (default: a running one, else local), "
    f"then merge. Needs `{pip_extra('ray')}`.",
)
@click.option(
    "--parts",
    type=click.IntRange(min=1),
    default=None,
    help="With --ray: the number of parts [default: the cluster's CPUs].",
)
@click.option(
    "--staging",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="For a URL DST: a new or empty local folder to stage the pack in (only what the pack writes "
    "there is removed after the upload) [default: under ~/.cache/fastload/staging].",
)
@storage_option
def pack(
    src,
    dst,
    fmt,
    image_mode,
    max_side,
    quality,
    check,
    shard_size,
    workers,
    overwrite,
    skip_bad,
    max_skipped,
    root,
    path_column,
    missing,
    quiet,
    block,
    part,
    ray_address,
    parts,
    staging,
    storage_options,
) -> None:
    """Pack SRC (an ImageFolder directory, .npy/.npz, a CSV/JSONL manifest, Parquet files or WebDataset tar
    shards) into a dataset at DST.

    Parquet and tar shards may be a file, a folder, a glob ('data/train-*.parquet') or a brace pattern
    ('shards/train-{000..009}.tar'), local or at a URL (s3://..., read through fsspec).

    DST may be a URL (s3://bucket/ds, any fsspec URL): shards are uploaded as they are finished, the
    manifest last. --storage-option goes to the backend of a URL SRC and DST alike. Interrupted packs resume when
    the same command is run again.
    """
    from .pack import pack as do_pack

    if storage_options and not (is_url(str(src)) or is_url(dst)):
        _url_only(str(src), storage_options)
    if parts is not None and ray_address is None:
        raise click.UsageError("--parts goes with --ray (for one part at a time, use --part I/N)")
    engine = "ray" if ray_address is not None else "local"
    address = None if ray_address in (None, "auto") else ray_address
    with _resume_hint():
        summary = _run(
            lambda: do_pack(
                src,
                dst,
                format=fmt,
                image_mode=image_mode,
                max_side=max_side,
                quality=quality,
                check=check,
                shard_size=shard_size,
                workers=workers,
                overwrite=overwrite,
                skip_bad=skip_bad,
                max_skipped=max_skipped,
                root=root,
                path_column=path_column,
                missing=missing,
                progress=not quiet,
                block=block,
                part=part,
                engine=engine,
                parts=parts,
                ray_address=address,
                staging=staging,
                storage_options=storage_options,
            )
        )
    click.echo(str(summary))
    if part is not None:
        click.echo(f"part {part} done: when every part is, run `fastload merge {dst}`")


@main.command()
@click.argument("dst")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def merge(dst, quiet, storage_options) -> None:
    """Join the parts in DST/parts/ (from `fastload pack --part I/N`) into one dataset at DST.

    Shard files are moved, not copied; the result is what one `fastload pack` would have written.
    """
    from .pack import merge as do_merge

    if "://" not in dst and not Path(dst).is_dir():
        raise click.BadParameter(
            f"folder {dst!r} does not exist" if not Path(dst).exists() else f"{dst!r} is not a folder",
            param_hint="'DST'",
        )
    _url_only(dst, storage_options)
    m = _run(lambda: do_merge(dst if "://" in dst else Path(dst), storage_options=storage_options, progress=not quiet))
    click.echo(f"merged {dst}: {m.num_samples:,} samples in {len(m.shards)} shard(s)")


@main.command()
@click.argument("dst", type=DatasetArg())
@storage_option
def inspect(dst, storage_options) -> None:
    """Show the schema, sample counts and sizes of the dataset at DST (a folder or a URL)."""
    from .fields import codec_of
    from .formats.reader import describe_storage, read_manifest

    _url_only(dst, storage_options)
    m = _run(lambda: _remote(dst, storage_options).manifest if is_url(dst) else read_manifest(dst))
    click.echo(f"dataset   {dst}")
    click.echo(f"format    {m.layout} (version {m.version}, {m.created_by or 'unknown writer'})")
    click.echo(f"samples   {m.num_samples:,}")
    if m.image_mode:
        click.echo(f"images    {m.image_mode}")
    click.echo("schema")
    for f in m.schema:
        click.echo(f"  {f.name:<16} {f.kind}{codec_of(f).describe(f)}")
    for line in describe_storage(dst, m):
        click.echo(line)
    classes = m.metadata.get("classes")
    if classes:
        shown = ", ".join(classes[:10]) + (f", ... ({len(classes)} in all)" if len(classes) > 10 else "")
        click.echo(f"classes   {shown}")
    if m.skipped:
        click.echo(f"skipped   {len(m.skipped)} source sample(s) at pack time")


@main.command()
@click.argument("dst", type=DatasetArg())
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def verify(dst, quiet, storage_options) -> None:
    """Check every shard's size, checksum and structure; exit 1 naming each bad shard.

    DST may be a URL: every shard is then downloaded (to a scratch folder, removed after) and checked.
    """
    from .formats.reader import read_manifest, verified_what
    from .formats.reader import verify as verify_dataset

    _url_only(dst, storage_options)
    remote = _run(lambda: _remote(dst, storage_options)) if is_url(dst) else None
    m = remote.manifest if remote is not None else _run(lambda: read_manifest(dst))
    with _bar(m.num_samples, f"verify {dst}", "sample", quiet) as bar:
        told = bar.update if bar is not None else None
        problems = remote.verify(told) if remote is not None else verify_dataset(dst, m, told)
    if problems:
        for p in problems:
            click.echo(f"BAD {p}", err=True)
        click.echo(f"{dst}: {len(problems)} problem(s) found", err=True)
        sys.exit(1)
    click.echo(f"{dst}: OK ({verified_what(m)})")


@main.command()
@click.argument("dst", type=DatasetArg())
@storage_option
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--transforms",
    "preset",
    type=click.Choice(["train", "val", "none"]),
    default="train",
    show_default=True,
    help="train: RandomResizedCrop+flip; val: Resize+CenterCrop; none: no image transforms.",
)
@click.option("--size", type=click.IntRange(min=1), default=224, show_default=True, help="Output image side.")
@click.option(
    "--max-workers", type=click.IntRange(min=0), default=None, help="Largest thread count tried [default: cores]."
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Measuring time per thread count.",
)
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="Write a PNG (needs matplotlib)."
)
def bench(dst, storage_options, batch_size, preset, size, max_workers, seconds, plot_path) -> None:
    """Measure the dataset at DST (a folder or a URL): samples/s per thread count (the fastest, and
    num_workers='auto''s pick), where time goes. A URL's shards are downloaded into the shard cache first, as
    fastload.open reads them."""
    from ._tools.benchcmd import plot, plot_ready, report, run

    if plot_path:  # before the measuring, not after it
        if Path(plot_path).suffix.lower() != ".png":
            raise click.BadParameter(f"{plot_path!r}: the plot is a PNG; name a .png file", param_hint="'--plot'")
        _run(plot_ready)
    _url_only(dst, storage_options)
    result = _run(lambda: run(dst, batch_size, preset, size, max_workers, seconds, storage_options))
    click.echo(report(result))
    if plot_path:
        _run(lambda: plot(result, plot_path))
        click.echo(f"plot written to {plot_path}")


def _remote(url: str, storage_options: dict | None):
    """The remote dataset at ``url``, opened as ``fastload.open`` opens it (the same errors: no bucket, no
    manifest, an unfinished pack, a layout other than shards)."""
    from .formats.remote import Remote

    return Remote(url, storage_options=storage_options)


def _url_only(dst, storage_options: dict | None) -> None:
    if storage_options and not is_url(dst):
        raise click.BadParameter(
            f"storage options go with a URL, and {dst} is a local path", param_hint="'--storage-option'"
        )


def _storage_options(pairs: tuple[str, ...]) -> dict | None:
    """--storage-option anon=true --storage-option endpoint_url=http://... -> {"anon": True, ...}: a value is
    read as JSON (true, 3, "x") when it parses, else kept as text."""
    import json

    def json_or_text(value: str) -> object:
        try:
            return json.loads(value)
        except ValueError:
            return value

    return _key_values(pairs, "--storage-option", "KEY", "anon=true", json_or_text)


def _checked(check, value):
    """A click callback: ``check(value)`` raising ValueError becomes click's "Invalid value for '--opt'"."""
    if value is None:
        return None
    try:
        check(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def _source(ctx, param, value: str):
    """SRC: a URL, a glob or a brace pattern as given (the source adapter expands it), else an existing path."""
    if "://" in value or any(c in value for c in "*?[{"):
        return value
    return click.Path(exists=True, path_type=Path).convert(value, param, ctx)


def _missing(pairs: tuple[str, ...]) -> dict | None:
    """--missing label=-1 --missing note=... -> {"label": "-1", ...} (parsed as the column's cells are)."""
    return _key_values(pairs, "--missing", "COLUMN", "label=-1", str)


def _key_values(pairs: tuple[str, ...], option: str, key_name: str, example: str, value) -> dict | None:
    """A repeated ``option KEY=VALUE`` as a dict (None when not given), each value through ``value``."""
    out = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{pair!r} should be {key_name}=VALUE, e.g. {example}", param_hint=f"'{option}'")
        out[key] = value(text)
    return out or None


def _size(value: str) -> None:
    from .pack import parse_size

    parse_size(value)


def _part(value: str) -> None:
    from .pack import parse_part

    parse_part(value)


@contextmanager
def _resume_hint():
    """Ctrl-C during a pack: say what is kept and the exact command that resumes it (not just "Aborted!")."""
    try:
        yield
    except KeyboardInterrupt:
        ctx = click.get_current_context()
        click.echo(
            f"\ninterrupted: the shards finished so far are kept. To resume where the pack stopped, run:\n"
            f"  {_command_line(ctx, leave_out=('overwrite',))}",
            err=True,
        )
        sys.exit(130)


def _command_line(ctx: click.Context, leave_out: tuple[str, ...] = ()) -> str:
    """The command as a shell line: its arguments, then every option not at its default (``leave_out``:
    options that would not resume, such as --overwrite, which starts over)."""
    import shlex

    words = ["fastload", ctx.info_name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(param, click.Argument):
            words.append(str(value))
        elif param.name not in leave_out and value not in (None, False) and value != param.default:
            opt = max(param.opts, key=len)
            if value is True:
                words.append(opt)
            elif isinstance(value, dict):  # --missing, --storage-option: KEY=VALUE pairs, as they were parsed
                words += [w for k, v in value.items() for w in (opt, f"{k}={_as_given(param.name, v)}")]
            else:
                words += [opt, str(value)]
    return shlex.join(words)


def _as_given(option: str, value: object) -> str:
    """A parsed KEY=VALUE's value as text that parses back to it: --storage-option's values are read as JSON."""
    import json

    if option != "storage_options":
        return str(value)
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value  # text that is not JSON is kept as text
    return json.dumps(value)


@contextmanager
def _bar(total: int, desc: str, unit: str, quiet: bool):
    """A tqdm bar on stderr (as pack's), or None when quiet."""
    if quiet:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=unit, smoothing=0.1) as bar:
        yield bar


def _run(fn):
    """Run fn, turning fastload's own errors into a clean message and exit status 2."""
    try:
        return fn()
    except (FastloadError, ValueError, ImportError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--steps",
    type=click.IntRange(min=2),
    default=30,
    show_default=True,
    help="Batches to run before stopping the script (the first is start-up and not counted).",
)
@click.option("--no-measure-workers", is_flag=True, help="Skip timing fastload loaders at each num_workers.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def doctor(steps, no_measure_workers, script, script_args) -> None:
    """Run SCRIPT (with its arguments) for a few batches and report what slows its training loop.

    Every DataLoader the script iterates is timed; the report gives the measured numbers, the line or
    setting, and the fix for each finding. GPU checks run only where CUDA is available.
    """
    from ._tools.doctor import run_script

    report = run_script(str(script), list(script_args), steps, measure_workers=not no_measure_workers)
    click.echo(str(report))


if __name__ == "__main__":
    main()
