"""torchvision transform objects converted to fastload's by their public attributes (issue 21 item 4).

CI has no torchvision, so most tests use stand-ins: classes whose module, name and attributes are exactly
torchvision 0.29's (taken from its source, ``torchvision/transforms/transforms.py`` for v1 and
``torchvision/transforms/v2/_geometry.py``, ``_color.py``, ``_augment.py``, ``_auto_augment.py``,
``_container.py``, ``_misc.py``, ``_type_conversion.py`` for v2: what each ``__init__`` stores, e.g. v1's
ColorJitter keeps ``brightness=0.4`` as ``[0.6, 1.4]``, v2 keeps a ``fill`` and a per-type ``_fill``). The last
tests build real torchvision objects and run when torchvision is importable (skipped otherwise).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import fastload
import fastload.transforms as T
from fastload._augment.fallback import UserTransform
from fastload._augment.torchvision_convert import convert

V1 = "torchvision.transforms.transforms"
V1_AUTO = "torchvision.transforms.autoaugment"
V2 = {"geometry": "torchvision.transforms.v2._geometry", "color": "torchvision.transforms.v2._color",
      "augment": "torchvision.transforms.v2._augment", "auto": "torchvision.transforms.v2._auto_augment",
      "container": "torchvision.transforms.v2._container", "misc": "torchvision.transforms.v2._misc",
      "types": "torchvision.transforms.v2._type_conversion"}


class Mode:
    """torchvision.transforms.InterpolationMode / AutoAugmentPolicy: an Enum whose ``value`` is the name."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"<Mode.{self.value.upper()}: {self.value!r}>"


BILINEAR, NEAREST, BICUBIC = Mode("bilinear"), Mode("nearest"), Mode("bicubic")


def tv(module: str, name: str, **attrs):
    """An instance of a stand-in class ``module.name`` with ``attrs``; calling it returns the image unchanged."""
    cls = type(name, (), {"__module__": module, "__call__": lambda self, img: img,
                          "__repr__": lambda self: f"{name}()"})
    obj = cls()
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


def same(got, expected) -> bool:
    """Lists of transforms equal by type and parameters (their reprs: ToDtype/Normalize define no ``==``)."""
    return [(type(t), repr(t)) for t in got] == [(type(t), repr(t)) for t in expected]


def rrc(module=V1, size=(224, 224), interpolation=BILINEAR):
    return tv(module, "RandomResizedCrop", size=size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
              interpolation=interpolation, antialias=True)


def color_jitter_v1():  # ColorJitter(0.4, 0.4, 0.4, 0.1): v1's _check_input stores [center - v, center + v]
    return tv(V1, "ColorJitter", brightness=[0.6, 1.4], contrast=[0.6, 1.4], saturation=[0.6, 1.4], hue=[-0.1, 0.1])


CASES = {
    "v1 RandomResizedCrop": (rrc(), [T.RandomResizedCrop(224)]),
    "v2 RandomResizedCrop": (rrc(V2["geometry"], (176, 176)), [T.RandomResizedCrop(176)]),
    "v1 RandomResizedCrop bicubic": (rrc(interpolation=BICUBIC), [T.RandomResizedCrop(224, interpolation="bicubic")]),
    "v1 Resize": (tv(V1, "Resize", size=256, interpolation=BILINEAR, max_size=None, antialias=True), [T.Resize(256)]),
    "v2 Resize": (tv(V2["geometry"], "Resize", size=[256], interpolation=BILINEAR, max_size=None, antialias=True),
                  [T.Resize([256])]),
    "v1 CenterCrop": (tv(V1, "CenterCrop", size=(224, 224)), [T.CenterCrop(224)]),
    "v2 RandomHorizontalFlip": (tv(V2["geometry"], "RandomHorizontalFlip", p=0.5), [T.RandomHorizontalFlip()]),
    "v1 RandomVerticalFlip": (tv(V1, "RandomVerticalFlip", p=0.3), [T.RandomVerticalFlip(0.3)]),
    "v1 RandomCrop padded": (tv(V1, "RandomCrop", size=(32, 32), padding=4, pad_if_needed=False, fill=0,
                                padding_mode="constant"), [T.RandomCrop(32, padding=4)]),
    "v2 RandomCrop": (tv(V2["geometry"], "RandomCrop", size=(32, 32), padding=[4, 4, 4, 4], pad_if_needed=True,
                         fill=255, _fill={"Image": 255}, padding_mode="reflect"),
                      [T.RandomCrop(32, padding=[4, 4, 4, 4], pad_if_needed=True, fill={"image": 255, "mask": 255},
                                    padding_mode="reflect")]),  # v2: a plain fill fills masks too
    "v1 RandomRotation": (tv(V1, "RandomRotation", degrees=[-15.0, 15.0], interpolation=NEAREST, expand=False,
                             center=None, fill=0), [T.RandomRotation(15)]),
    "v2 RandomAffine": (tv(V2["geometry"], "RandomAffine", degrees=[-10.0, 10.0], translate=(0.1, 0.1),
                           scale=(0.9, 1.1), shear=[-5.0, 5.0], interpolation=BILINEAR, fill=0, _fill={"Image": 0},
                           center=None),
                        [T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5, interpolation="bilinear",
                                        fill={"image": 0, "mask": 0})]),
    "v1 ColorJitter": (color_jitter_v1(), [T.ColorJitter(0.4, 0.4, 0.4, 0.1)]),
    "v2 ColorJitter brightness only": (tv(V2["color"], "ColorJitter", brightness=(0.7, 1.3), contrast=None,
                                          saturation=None, hue=None), [T.ColorJitter(brightness=0.3)]),
    "v1 Grayscale": (tv(V1, "Grayscale", num_output_channels=3), [T.Grayscale(3)]),
    "v2 RandomGrayscale": (tv(V2["color"], "RandomGrayscale", p=0.2), [T.RandomGrayscale(0.2)]),
    "v1 GaussianBlur": (tv(V1, "GaussianBlur", kernel_size=(5, 5), sigma=(0.1, 2.0)), [T.GaussianBlur(5)]),
    "v2 RandomSolarize": (tv(V2["color"], "RandomSolarize", threshold=128, p=0.2), [T.RandomSolarize(128, 0.2)]),
    "v1 RandomPosterize": (tv(V1, "RandomPosterize", bits=4, p=0.5), [T.RandomPosterize(4)]),
    "v2 RandomEqualize": (tv(V2["color"], "RandomEqualize", p=0.5), [T.RandomEqualize()]),
    "v1 RandomAutocontrast": (tv(V1, "RandomAutocontrast", p=0.5), [T.RandomAutocontrast()]),
    "v2 RandomAdjustSharpness": (tv(V2["color"], "RandomAdjustSharpness", sharpness_factor=2.0, p=0.5),
                                 [T.RandomAdjustSharpness(2.0)]),
    "v1 RandomInvert": (tv(V1, "RandomInvert", p=0.5), [T.RandomInvert()]),
    "v1 RandomErasing": (tv(V1, "RandomErasing", p=0.25, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0,
                            inplace=False), [T.RandomErasing(0.25)]),
    "v2 RandomErasing random": (tv(V2["augment"], "RandomErasing", p=0.1, scale=(0.02, 0.33), ratio=(0.3, 3.3),
                                   value="random", inplace=False), [T.RandomErasing(0.1, value="random")]),
    "v1 RandomApply": (tv(V1, "RandomApply", transforms=[color_jitter_v1()], p=0.8),
                       [T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8)]),
    "v2 RandomChoice": (tv(V2["container"], "RandomChoice", transforms=[tv(V1, "RandomInvert", p=1.0),
                                                                      tv(V1, "RandomEqualize", p=1.0)], p=[0.5, 0.5]),
                        [T.RandomChoice([T.RandomInvert(1.0), T.RandomEqualize(1.0)], p=[0.5, 0.5])]),
    "v2 RandomOrder": (tv(V2["container"], "RandomOrder", transforms=[tv(V1, "RandomInvert", p=0.5)]),
                       [T.RandomOrder([T.RandomInvert()])]),
    "v2 RandAugment": (tv(V2["auto"], "RandAugment", num_ops=2, magnitude=9, num_magnitude_bins=31,
                          interpolation=NEAREST, fill=None, _fill={"Image": None}), [T.RandAugment()]),
    "v1 TrivialAugmentWide": (tv(V1_AUTO, "TrivialAugmentWide", num_magnitude_bins=31, interpolation=BILINEAR,
                                 fill=None), [T.TrivialAugmentWide(interpolation="bilinear")]),
    "v1 AutoAugment ImageNet": (tv(V1_AUTO, "AutoAugment", policy=Mode("imagenet"), interpolation=NEAREST, fill=None),
                                [T.AutoAugment()]),
    "v1 Normalize": (tv(V1, "Normalize", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], inplace=False),
                     [T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]),
    "v2 ToDtype": (tv(V2["misc"], "ToDtype", dtype=torch.float32, scale=True), [T.ToDtype(torch.float32, scale=True)]),
    "v1 ConvertImageDtype": (tv(V1, "ConvertImageDtype", dtype=torch.float16), [T.ToDtype(torch.float16, scale=True)]),
    "v1 ToTensor": (tv(V1, "ToTensor"), [T.ToDtype(torch.float32, scale=True)]),
    "v1 PILToTensor": (tv(V1, "PILToTensor"), []),
    "v2 ToImage": (tv(V2["types"], "ToImage"), []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_torchvision_transform_with_an_equivalent_converts_with_its_parameters(case):
    given, expected = CASES[case]
    got = convert(given, T)
    assert same(got, expected), (case, got)
    assert not any(isinstance(t, UserTransform) for t in got)


def test_not_torchvision_is_not_converted():
    assert convert(lambda img: img, T) is None
    assert convert(tv("albumentations.core.composition", "Compose", transforms=[]), T) is None
    assert convert(tv("mylib.torchvision.transforms", "RandomInvert", p=1.0), T) is None


@pytest.mark.parametrize("given, words", [
    (tv(V2["geometry"], "ElasticTransform", alpha=[50.0, 50.0], sigma=[5.0, 5.0]),
     ["torchvision's ElasticTransform has no fastload equivalent"]),
    (tv(V1_AUTO, "AutoAugment", policy=Mode("cifar10"), interpolation=NEAREST, fill=None),
     ["not converted", "AutoAugment: policy=", "only the ImageNet policy"]),
    (rrc(interpolation=NEAREST), ["not converted", "interpolation=", "bilinear or bicubic"]),
    (tv(V1, "RandomApply", transforms=[tv(V2["geometry"], "ElasticTransform")], p=0.5),
     ["ElasticTransform", "has no fastload equivalent, so the whole RandomApply runs per sample"]),
], ids=["no equivalent", "AutoAugment CIFAR10", "nearest RandomResizedCrop", "RandomApply of an unknown"])
def test_without_an_equivalent_it_runs_per_sample_saying_why(given, words):
    (got,) = convert(given, T)
    assert isinstance(got, UserTransform) and got.fn is given
    for w in words:
        assert w in got.reason, (w, got.reason)


def test_a_torchvision_compose_becomes_fastloads_pipeline():
    compose = tv(V1, "Compose", transforms=[
        rrc(), tv(V1, "RandomHorizontalFlip", p=0.5),
        tv(V1_AUTO, "TrivialAugmentWide", num_magnitude_bins=31, interpolation=NEAREST, fill=None),
        tv(V1, "PILToTensor"), tv(V1, "ConvertImageDtype", dtype=torch.float32),
        tv(V1, "Normalize", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], inplace=False)])
    ours = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
            T.ToDtype(torch.float32, scale=True), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    p = T.ImagePipeline(compose)
    assert p == T.ImagePipeline(ours) and same(p.tensor.transforms, ours[3:]) and not p.fallback
    assert T.ImagePipeline([compose]) == p and same(T.ImagePipeline([compose]).tensor.transforms, ours[3:])


def test_the_loader_runs_a_converted_pipeline_natively_and_one_it_cannot_per_sample(image_shards):
    given = [rrc(size=(24, 24)), tv(V2["geometry"], "RandomHorizontalFlip", p=0.5),
             tv(V2["color"], "RandomInvert", p=1.0)]
    ours = [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.RandomInvert(1.0)]
    batches = {}
    for name, spec in (("tv", given), ("fastload", ours), ("cifar", given + [tv(V1_AUTO, "AutoAugment",
                                                                               policy=Mode("cifar10"),
                                                                               interpolation=NEAREST, fill=None)])):
        ds = fastload.open(image_shards, transforms={"image": spec})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches[name] = [b[0].clone() for b in fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=2)]
        batches[name + " warnings"] = [str(w.message) for w in caught if issubclass(w.category, fastload.FastPathWarning)]
    assert all(torch.equal(a, b) for a, b in zip(batches["tv"], batches["fastload"]))
    assert batches["tv warnings"] == []
    (msg,) = batches["cifar warnings"]  # the stand-in returns its input: same images, and the reason said
    assert "AutoAugment()" in msg and "only the ImageNet policy" in msg and "ms per image" in msg
    assert all(torch.equal(a, b) for a, b in zip(batches["cifar"], batches["fastload"]))


# -- real torchvision, when importable ---------------------------------------------------------------------

def _real_cases(tvt, v2):
    """(torchvision object, fastload equivalent) pairs built from the real classes (v1 and v2)."""
    IM = tvt.InterpolationMode
    return [
        (tvt.RandomResizedCrop(224), T.RandomResizedCrop(224)),
        (tvt.RandomResizedCrop(224, interpolation=tvt.InterpolationMode.BICUBIC), T.RandomResizedCrop(224, interpolation="bicubic")),
        (v2.RandomResizedCrop(176, antialias=True), T.RandomResizedCrop(176)),
        (tvt.Resize(256), T.Resize(256)),
        (v2.Resize(256), T.Resize([256])),
        (tvt.CenterCrop(224), T.CenterCrop(224)),
        (v2.RandomCrop(32, padding=4, padding_mode="reflect"),
         T.RandomCrop(32, padding=4, padding_mode="reflect", fill={"image": 0, "mask": 0})),
        (tvt.RandomCrop(32, padding=4, fill=128), T.RandomCrop(32, padding=4, fill=128)),
        (v2.RandomHorizontalFlip(), T.RandomHorizontalFlip()),
        (tvt.RandomVerticalFlip(0.3), T.RandomVerticalFlip(0.3)),
        (tvt.RandomRotation(15), T.RandomRotation(15)),
        (v2.RandomRotation(15, interpolation=IM.BILINEAR, fill=3),
         T.RandomRotation(15, "bilinear", fill={"image": 3, "mask": 3})),
        (v2.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5),
         T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5, fill={"image": 0, "mask": 0})),
        (tvt.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ColorJitter(0.4, 0.4, 0.4, 0.1)),
        (v2.ColorJitter(brightness=0.3), T.ColorJitter(brightness=0.3)),
        (tvt.Grayscale(3), T.Grayscale(3)),
        (v2.RandomGrayscale(0.2), T.RandomGrayscale(0.2)),
        (tvt.GaussianBlur(5), T.GaussianBlur(5)),
        (v2.GaussianBlur(5, sigma=(0.5, 1.0)), T.GaussianBlur(5, sigma=(0.5, 1.0))),
        (v2.RandomSolarize(128, 0.2), T.RandomSolarize(128, 0.2)),
        (tvt.RandomPosterize(4), T.RandomPosterize(4)),
        (v2.RandomEqualize(), T.RandomEqualize()),
        (tvt.RandomAutocontrast(), T.RandomAutocontrast()),
        (v2.RandomAdjustSharpness(2.0), T.RandomAdjustSharpness(2.0)),
        (tvt.RandomInvert(), T.RandomInvert()),
        (tvt.RandomErasing(0.25), T.RandomErasing(0.25)),
        (v2.RandomErasing(0.1, value=0), T.RandomErasing(0.1)),
        (tvt.RandomApply([tvt.ColorJitter(0.4)], p=0.8), T.RandomApply([T.ColorJitter(0.4)], p=0.8)),
        (v2.RandomChoice([v2.RandomInvert(1.0), v2.RandomEqualize(1.0)]),
         T.RandomChoice([T.RandomInvert(1.0), T.RandomEqualize(1.0)])),
        (v2.RandomOrder([v2.RandomInvert()]), T.RandomOrder([T.RandomInvert()])),
        (tvt.RandAugment(), T.RandAugment()),
        (v2.RandAugment(num_ops=3, magnitude=7), T.RandAugment(num_ops=3, magnitude=7)),
        (tvt.TrivialAugmentWide(interpolation=IM.BILINEAR), T.TrivialAugmentWide(interpolation="bilinear")),
        (v2.TrivialAugmentWide(), T.TrivialAugmentWide()),
        (tvt.AutoAugment(), T.AutoAugment()),
        (v2.AutoAugment(), T.AutoAugment()),
        (tvt.Normalize([0.5] * 3, [0.2] * 3), T.Normalize([0.5] * 3, [0.2] * 3)),
        (v2.Normalize([0.5] * 3, [0.2] * 3), T.Normalize([0.5] * 3, [0.2] * 3)),
        (v2.ToDtype(torch.float32, scale=True), T.ToDtype(torch.float32, scale=True)),
        (tvt.ConvertImageDtype(torch.float32), T.ToDtype(torch.float32, scale=True)),
        (tvt.ToTensor(), T.ToDtype(torch.float32, scale=True)),
    ]


def test_real_torchvision_objects_convert():
    tvt = pytest.importorskip("torchvision.transforms")
    v2 = pytest.importorskip("torchvision.transforms.v2")
    for given, expected in _real_cases(tvt, v2):
        assert same(convert(given, T), [expected]), (given, convert(given, T))
    for noop in (tvt.PILToTensor(), v2.PILToTensor(), v2.ToImage(), v2.ToPureTensor()):
        assert convert(noop, T) == [], noop
    for unconvertible, why in ((tvt.AutoAugment(tvt.AutoAugmentPolicy.CIFAR10), "ImageNet"),
                               (v2.ElasticTransform(), "no fastload equivalent"),
                               (tvt.RandomResizedCrop(224, interpolation=tvt.InterpolationMode.NEAREST), "bicubic"),
                               (tvt.RandomApply([v2.ElasticTransform()]), "whole RandomApply")):
        (got,) = convert(unconvertible, T)
        assert isinstance(got, UserTransform) and why in got.reason, (unconvertible, got.reason)
    pipe = T.ImagePipeline(tvt.Compose([tvt.RandomResizedCrop(224), tvt.RandomHorizontalFlip(), tvt.ToTensor(),
                                        tvt.Normalize([0.5] * 3, [0.2] * 3)]))
    ours = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
            T.Normalize([0.5] * 3, [0.2] * 3)]
    assert pipe == T.ImagePipeline(ours) and same(pipe.tensor.transforms, ours[2:])


def test_real_torchvision_transforms_run_per_sample(image_shards):
    """One without an equivalent (v2.ElasticTransform) runs per sample on uint8 CHW tensors, as torchvision
    would call it, and the result has the native pipeline's shape."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    ds = fastload.open(image_shards, transforms={"image": [T.RandomResizedCrop(24), v2.ElasticTransform(alpha=5.0)]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        (batch, _) = next(iter(fastload.DataLoader(ds, batch_size=4, num_workers=2)))
    assert batch.shape == (4, 3, 24, 24) and batch.dtype == torch.uint8


# -- RandomErasing after Normalize (torchvision's recipes) -------------------------------------------------

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def test_erasing_after_normalize_is_planned_before_it_with_its_value_in_pixels():
    """torchvision's classification recipe erases the normalized tensor with 0: the mean colour in pixels,
    (0.485, 0.456, 0.406) * 255 rounded = (124, 116, 104), which normalizes to within half a level of 0."""
    recipe = tv(V2["container"], "Compose", transforms=[
        tv(V2["types"], "ToImage"), rrc(V2["geometry"], (176, 176)), tv(V2["geometry"], "RandomHorizontalFlip", p=0.5),
        tv(V2["auto"], "TrivialAugmentWide", num_magnitude_bins=31, interpolation=BILINEAR, fill=None,
           _fill={"Image": None}),
        tv(V2["misc"], "ToDtype", dtype=torch.float32, scale=True), tv(V2["misc"], "Normalize", mean=MEAN, std=STD,
                                                                     inplace=False),
        tv(V2["augment"], "RandomErasing", p=0.1, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=[0.0], inplace=False),
        tv(V2["types"], "ToPureTensor")])
    p = T.ImagePipeline(recipe)
    assert same(p.augment, [T.TrivialAugmentWide(interpolation="bilinear"), T.RandomErasing(0.1, value=(124, 116, 104))])
    assert same(p.tensor.transforms, [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)])
    assert not p.fallback
    normalized = (torch.tensor([124, 116, 104]) / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert normalized.abs().max() < 0.5 / 255 / min(STD)
    # without scaling, values are in pixel units already: v * std + mean
    p = T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32), T.Normalize([100.0] * 3, [2.0] * 3),
                         T.RandomErasing(1.0, value=(1, 2, 3))])
    assert same(p.augment, [T.RandomErasing(1.0, value=(102, 104, 106))])


def test_erasing_with_noise_after_normalize_erases_the_normalized_floats():
    """It was refused (noise in normalized units cannot be drawn on the uint8 tile); now the fill stage erases the
    normalized rows with N(0, 1) per pixel and channel (tests/augment/test_noise_erasing.py)."""
    p = T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
                         T.RandomErasing(value="random")])
    assert [e.mode for e in p.erase] == ["pixel"] and not p.augment and not p.after
    with pytest.raises(ValueError, match="ToDtype/Normalize must come after"):  # other augmentations still are
        T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), T.RandomInvert()])
