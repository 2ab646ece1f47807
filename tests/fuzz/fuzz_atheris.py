"""atheris (libFuzzer) entry point for one target of targets.py; run.py starts it.

    python tests/fuzz/fuzz_atheris.py TARGET [CORPUS_DIR] [libFuzzer flags, e.g. -runs=100000]

fastload's Python modules are instrumented for coverage; torch, numpy and the native module are not.
Any exception other than fastload's own errors is a crash for libFuzzer, which saves the input.
"""

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # a fallback for a checkout; PYTHONPATH still wins

with atheris.instrument_imports(include=["fastload", "targets"]):
    import fastload  # noqa: F401
    import targets


def main() -> None:
    name = sys.argv.pop(1)
    target = targets.make(name)

    def one_input(data: bytes) -> None:
        try:
            target(data)
        except Exception as e:
            if not targets.allowed(e):
                raise

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
