"""``python -m peers check PEER`` | ``python -m peers run SPEC.json`` (run with PYTHONPATH=bench)."""

from __future__ import annotations

import importlib
import json
import sys

from . import PEERS


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("check", "run"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "check":
        module = importlib.import_module(f"peers.{PEERS[argv[1]][0]}")
        print(json.dumps(module.check()))
        return 0
    with open(argv[1]) as fh:
        spec = json.load(fh)
    module = importlib.import_module(f"peers.{PEERS[spec['peer']][0]}")
    result = module.run(spec)
    print("@@RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
