"""How fastload is installed: its name on the package index, the install hints that name it, and PIL.

The import name and the CLI are ``fastload``; the distribution is ``torch-fastload`` (``fastload`` on the package
index is an unrelated project: an install command naming it, extras or not, installs a stranger's package). Every hint
that tells a user to install one of fastload's extras is built by :func:`pip_extra`; tests/test_install.py
checks :data:`DIST` against pyproject.toml and that no install command in the repository names another project.

PIL comes from whichever of Pillow or Pillow-SIMD the environment has (both install the module ``PIL``; a
dependency on either by name would replace the other: torchvision depends on ``pillow``). fastload declares
neither; the loader's fast path never touches PIL. What needs it imports it through :func:`pil`, which names
the ways to get one.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["DIST", "MissingDependency", "pil", "pip_extra"]

DIST = "torch-fastload"


class MissingDependency(ImportError):
    """A package that what was asked needs is not installed: the environment's problem, never one sample's (the
    packer stops on it rather than skip every sample that needs it as bad data)."""


def pip_extra(extra: str) -> str:
    """The command that installs fastload with one of its extras (``remote``, ``ray``, ``dali``, ...)."""
    return f"pip install '{DIST}[{extra}]'"


def pil(what: str) -> ModuleType:
    """``PIL.Image``, or ImportError saying that ``what`` needs PIL and how to install one without replacing
    another."""
    try:
        from PIL import Image
    except ImportError as e:
        raise MissingDependency(
            f"{what} needs PIL, from Pillow or Pillow-SIMD (fastload works with either and installs neither, so "
            f"that it never replaces the one an environment has): `pip install pillow` (or {pip_extra('pillow')}), "
            f"or `pip install pillow-simd` for faster resizing ({type(e).__name__}: {e})"
        ) from None
    return Image
