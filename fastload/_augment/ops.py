"""The pixel operations of the augmentation plan, complete: the one place that lists the modules defining them.

Each module in ``MODULES`` defines its operations when imported, one ``plan.define_op`` each (name, parameter
columns, a PIL kernel, a torch kernel); the native kernel is the one of the same name in the C++ core's list
(csrc/augment.h ``FASTLOAD_AUG_OPS``, exported as ``_C.AUGMENT_OPS``), which ``engine_native.py`` holds against
``OPS`` when it is imported. The engines read ``OPS`` from here, so the registry they see has every operation.
A new module of operations is one more name here (tests/augment/test_augment_ops.py fails for a module that
calls ``define_op`` and is not listed).
"""

from __future__ import annotations

from . import color, filters, pil_enhance, tone
from .plan import OPS, OpDef

__all__ = ["MODULES", "OPS", "OpDef"]

MODULES = (color, tone, filters, pil_enhance)
