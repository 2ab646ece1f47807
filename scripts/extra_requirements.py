"""Print the requirements of one optional extra in pyproject.toml, one per line.

    pip install $(python scripts/extra_requirements.py lint)

The Makefile installs the tools of an extra (docs, lint) this way: `pip install -e ".[lint]"` would rebuild
the native core and re-resolve fastload's own dependencies (pillow-simd) for tools that need neither.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the copy pip carries
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: extra_requirements.py EXTRA", file=sys.stderr)
        return 2
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    if argv[0] not in extras:
        print(f"no extra {argv[0]!r} in pyproject.toml (extras: {', '.join(sorted(extras))})", file=sys.stderr)
        return 2
    print("\n".join(extras[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
