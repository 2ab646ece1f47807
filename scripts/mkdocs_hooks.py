"""mkdocs hooks (mkdocs.yml ``hooks:``): the benchmark figures come from bench/results, where the suite writes
them, rather than from a copy under docs/ that could drift from the committed results."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

FIGURES = ("suite_photos.png",)  # bench/results/<name> -> assets/<name> in the site


def on_files(files, config):
    results = Path(config["config_file_path"]).parent / "bench" / "results"
    for name in FIGURES:
        files.append(File.generated(config, f"assets/{name}", abs_src_path=str(results / name)))
    return files
