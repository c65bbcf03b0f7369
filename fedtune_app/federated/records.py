"""Tensors on the wire: Flower's ``ArrayRecord`` <-> a dict of numpy arrays (name -> array)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord


def to_record(tensors: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.ascontiguousarray(v)) for name, v in tensors.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}
