"""Any map-style ``torch.utils.data.Dataset`` whose samples are tuples or dicts of storable values
(tensors, arrays, numbers, bytes, str, PIL images). The schema is inferred from the first samples
and can be overridden field by field."""

from __future__ import annotations

from typing import Any, Mapping

from .._errors import SchemaError, SourceError
from .._schema import Field, infer_schema
from ._base import Source

INFER_SAMPLES = 8


class DatasetSource(Source):
    def __init__(self, dataset: Any, schema: Mapping[str, Field] | None = None, infer_samples: int = INFER_SAMPLES):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise SourceError(f"{type(dataset).__name__} is not a map-style dataset (it needs __len__ and "
                              f"__getitem__); iterable datasets cannot be packed")
        self.dataset = dataset
        n = len(dataset)
        if n == 0:
            raise SourceError(f"the source {type(dataset).__name__} has no samples (its len() is 0): nothing to pack")
        first = [dataset[i] for i in range(min(n, infer_samples))]
        try:
            self.schema, self.as_dict = infer_schema(first, schema)
        except SchemaError as e:
            raise SourceError(f"cannot infer a schema from {type(dataset).__name__}: {e}") from None
        self.metadata = {"source": "dataset", "dataset": type(dataset).__name__}
        classes = getattr(dataset, "classes", None)
        if isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes):
            self.metadata["classes"] = list(classes)

    def __len__(self) -> int:
        return len(self.dataset)

    def load(self, i: int) -> list:
        sample = self.dataset[i]
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
        return f"{type(self.dataset).__name__}[{i}]"
