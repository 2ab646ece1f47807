"""fastload/decoders/__init__.py: the registry lists each decoder once, by the name ``decoder=`` takes; looking one
up loads only its module, and a name it does not list is refused with the choices."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastload import decoders
from fastload._fill.images import ImageDecoding
from fastload.decoders._base import DecoderKind


def test_the_registry_lists_each_decoder_once():
    assert decoders.names() == ("native", "exact", "dali", "nvjpeg", "auto")
    for name in decoders.names():
        k = decoders.kind(name)
        assert isinstance(k, DecoderKind) and k.name == name
    with pytest.raises(ValueError, match="decoder='pillow' should be one of 'native', 'exact', 'dali', 'nvjpeg', 'auto'"):
        ImageDecoding("pillow", None, 4, 0)


def test_looking_up_native_loads_no_gpu_decoder():
    code = ("import sys, fastload.decoders as d; k = d.kind('native'); "
            "assert k.make is not None and 'fastload.decoders.dali' not in sys.modules "
            "and 'fastload.decoders.nvjpeg' not in sys.modules, sorted(m for m in sys.modules if 'decoders' in m)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_what_each_decoder_kind_runs_of_an_augmented_pipeline():
    """native runs everything; nvjpeg and DALI run the augmentations (the batched torch engine on their rows) and
    padded RandomCrop windows; a kind that does not augment names all of it. Fails with the GPU kinds' augments
    taken out, or the padded crop refused again."""
    from fastload.decoders._base import PADDED_CROP

    augmented = ("TrivialAugmentWide", "RandomErasing")
    assert decoders.kind("native").refusal(augmented + (PADDED_CROP,)) is None
    for name in ("nvjpeg", "dali"):
        k = decoders.kind(name)
        assert k.refusal(()) is None and k.refusal(augmented) is None
        assert k.refusal(augmented + (PADDED_CROP,)) is None  # padded windows: engine_torch.assemble_rows
    crop_only = DecoderKind("croponly", make=lambda ctx: None)
    assert crop_only.refusal(augmented) == ("executes crop, resize and horizontal flip only, and the image pipeline "
                                            "also has TrivialAugmentWide, RandomErasing")
