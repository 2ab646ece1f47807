"""Any map-style ``torch.utils.data.Dataset`` whose samples are tuples or dicts of storable values
(tensors, arrays, numbers, bytes, str, PIL images). The schema is inferred from the first samples
and can be overridden field by field.

A Hugging Face ``datasets.Dataset`` is read through its features: each ``Image`` column is read with
``Image(decode=False)``, so the packer gets the images' own encoded bytes (or files) and stores JPEGs byte
for byte, as it does an image folder's, instead of re-encoding decoded pixels; a ``ClassLabel`` column's
names become the dataset's ``classes``. (A dataset with a transform, ``set_transform``/``with_transform``, is
read as the transform returns its samples: the pixels it makes are what is packed.)
"""

from __future__ import annotations

from typing import Any, Mapping

from .._errors import SchemaError, SourceError
from .._schema import Field, infer_schema
from ..fields.image import encoded_image
from ._base import Source, class_metadata

INFER_SAMPLES = 8


class DatasetSource(Source):
    def __init__(self, dataset: Any, schema: Mapping[str, Field] | None = None, infer_samples: int = INFER_SAMPLES):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise SourceError(
                f"{type(dataset).__name__} is not a map-style dataset (it needs __len__ and "
                f"__getitem__); iterable datasets cannot be packed"
            )
        self.name = type(dataset).__name__
        if self.name.endswith("DatasetDict") and type(dataset).__module__.split(".")[0] == "datasets":
            raise SourceError(
                f"a Hugging Face {self.name} holds splits ({', '.join(map(str, dataset))}), not samples: "
                f"pack one split, e.g. fastload.pack(ds['{next(iter(dataset), 'train')}'], ...)"
            )
        n = len(dataset)
        if n == 0:
            raise SourceError(f"the source {self.name} has no samples (its len() is 0): nothing to pack")
        self.metadata = {"source": "dataset", "dataset": self.name}
        features = _hf_features(dataset)
        self.encoded: tuple[str, ...] = ()  # fields read as encoded images (Hugging Face Image columns)
        overrides = dict(schema or {})
        if features is not None:
            dataset, self.encoded = _encoded_view(dataset, features)
            for name in self.encoded:
                overrides.setdefault(name, Field.image(name))
            self.metadata.update(_class_names(features))
        self.dataset = dataset
        first = [self._sample(i) for i in range(min(n, infer_samples))]
        try:
            self.schema, self.as_dict = infer_schema(first, overrides)
        except SchemaError as e:
            raise SourceError(f"cannot infer a schema from {self.name}: {e}") from None
        classes = getattr(dataset, "classes", None)
        if isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes):
            self.metadata["classes"] = list(classes)

    def _sample(self, i: int) -> Any:
        sample = self.dataset[i]
        if self.encoded and isinstance(sample, Mapping):
            sample = {k: encoded_image(v) if k in self.encoded else v for k, v in sample.items()}
        return sample

    def __len__(self) -> int:
        return len(self.dataset)

    def load(self, i: int) -> list:
        sample = self._sample(i)
        if self.as_dict:
            if not isinstance(sample, Mapping):
                raise SchemaError(f"expected a dict sample like sample 0, got {type(sample).__name__}")
            missing = [n for n in self.schema.names if n not in sample]
            extra = [k for k in sample if k not in self.schema.names]
            if missing or extra:
                raise SchemaError(f"sample keys differ from the schema: missing {missing}, unexpected {extra}")
            return [sample[n] for n in self.schema.names]
        if not isinstance(sample, (tuple, list)):
            raise SchemaError(f"expected a tuple sample like sample 0, got {type(sample).__name__}")
        return list(sample)

    def describe(self, i: int) -> str:
        return f"{self.name}[{i}]"


# -- Hugging Face datasets (duck-typed: fastload does not import ``datasets``) --------------------------------


def _hf_features(dataset: Any) -> Mapping | None:
    """The ``features`` of a Hugging Face ``datasets.Dataset``, else None."""
    features = getattr(dataset, "features", None)
    if type(dataset).__module__.split(".")[0] != "datasets" or not isinstance(features, Mapping):
        return None
    return features


def _feature(f: Any, name: str) -> bool:
    return type(f).__name__ == name and type(f).__module__.split(".")[0] == "datasets"


def _encoded_view(dataset: Any, features: Mapping) -> tuple[Any, tuple[str, ...]]:
    """``dataset`` with its top-level ``Image`` columns read as ``{"bytes", "path"}`` records (cheap: only the
    column's feature changes, not its data), and the names of those columns. A dataset with a custom transform is
    returned as it is: the transform decides what a sample's pixels are."""
    fmt = getattr(dataset, "format", None) or {}
    if fmt.get("type") == "custom":
        return dataset, ()
    shown = fmt.get("columns") or list(features)
    images = tuple(k for k, f in features.items() if _feature(f, "Image") and k in shown)
    for name in images:
        raw = type(features[name])(decode=False)  # the dataset's own Image class: no import of ``datasets`` here
        dataset = dataset.cast_column(name, raw)
    return dataset, images


def _class_names(features: Mapping) -> dict:
    """The ``ClassLabel`` columns of a ``datasets.Dataset``'s features, as ``_base.class_metadata`` names them."""
    labels = {k: list(f.names) for k, f in features.items() if _feature(f, "ClassLabel") and getattr(f, "names", None)}
    return class_metadata(labels)
