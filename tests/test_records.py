"""The wire format of named arrays: one packed Flower Array per dtype, read back bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from hetfed.problems.models import load_record, make_mlp, model_record
from hetfed.records import PACKED_PREFIX, to_numpy, to_record
from hetfed.strategies.base import checked_arrays


def mixed_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(size=(5, 3)),
        "b": rng.normal(size=5),
        "scalar": np.array(2.5),
        "empty": np.zeros((0, 4)),
        "counts": rng.integers(0, 9, size=(2, 2)),
        "f32": rng.normal(size=7).astype(np.float32),
    }


def test_packing_round_trips_names_shapes_dtypes_and_bits() -> None:
    arrays = mixed_arrays()
    back = to_numpy(to_record(arrays))
    assert list(back) == list(arrays)  # order kept within a dtype; here every dtype keeps first-seen order
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        assert back[name].tobytes() == value.tobytes(), name


def test_one_array_per_dtype_crosses_the_wire() -> None:
    record = to_record(mixed_arrays())
    assert len(record) == 3  # float64, int64, float32
    assert all(key.startswith(PACKED_PREFIX) for key in record)
    layouts = sorted(json.loads(key[len(PACKED_PREFIX) :]) for key in record)
    assert [["f32", [7]]] in layouts and [["counts", [2, 2]]] in layouts


def test_a_packed_mlp_message_has_fewer_objects_than_one_array_per_parameter() -> None:
    """Each Flower Array is two transported objects (Array + ArrayChunk): 4 parameters -> 1 Array."""
    state = make_mlp(8, 64, 10, seed=0).state_dict()
    plain = ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})
    n_plain = len(get_all_nested_objects(RecordDict({"arrays": plain})))
    n_packed = len(get_all_nested_objects(RecordDict({"arrays": model_record(make_mlp(8, 64, 10, seed=0))})))
    # plain: 4 Arrays + 4 ArrayChunks + ArrayRecord + RecordDict; packed: 1 + 1 + 1 + 1
    assert n_plain == 10 and n_packed == 4


def test_a_model_survives_the_wire_unchanged() -> None:
    source, target = make_mlp(8, 16, 5, seed=1), make_mlp(8, 16, 5, seed=2)
    load_record(target, model_record(source))
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_plain_records_stay_readable() -> None:
    arrays = mixed_arrays(1)
    plain = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    back = to_numpy(plain)
    assert all(np.array_equal(back[k], v) for k, v in arrays.items())


def test_a_layout_that_does_not_match_its_values_is_an_error_not_a_silent_misread() -> None:
    smuggled = ArrayRecord({PACKED_PREFIX + '[["w",[2]]]': Array(np.arange(5.0))})  # 3 values too many
    with pytest.raises(ValueError, match="holds 5 values, its layout names 2"):
        to_numpy(smuggled)
    reference = {"w": np.zeros(2)}
    assert checked_arrays(smuggled, reference) == (
        None,
        "arrays cannot be read (packed array holds 5 values, its layout names 2)",
    )
    garbage = ArrayRecord({PACKED_PREFIX + "not json": Array(np.arange(2.0))})
    arrays, problem = checked_arrays(garbage, reference)
    assert arrays is None and "cannot be read" in str(problem)


def test_checked_arrays_returns_the_arrays_or_names_the_bad_one() -> None:
    reference = {"w": np.zeros((2, 2)), "b": np.zeros(2)}
    arrays, problem = checked_arrays(to_record({"w": np.ones((2, 2)), "b": np.arange(2.0)}), reference)
    assert problem is None and arrays is not None
    assert np.array_equal(arrays["w"], np.ones((2, 2))) and np.array_equal(arrays["b"], [0.0, 1.0])

    def problem_of(record: ArrayRecord) -> str | None:
        arrays, problem = checked_arrays(record, reference)
        assert arrays is None
        return problem

    assert "shape (3,), expected (2,)" in str(problem_of(to_record({"w": np.ones((2, 2)), "b": np.ones(3)})))
    assert "'w' contains NaN" in str(problem_of(to_record({"w": np.full((2, 2), np.nan), "b": np.ones(2)})))
    assert "missing ['b']" in str(problem_of(to_record({"w": np.ones((2, 2))})))
    assert "unexpected ['c']" in str(problem_of(to_record({**reference, "c": np.ones(1)})))
    assert checked_arrays(None, reference) == (None, "the reply carries no arrays")  # a reply of scalars only
