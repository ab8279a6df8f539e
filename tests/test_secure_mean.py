"""The masked mean (hetfed.secure_mean): the sum of the masked values decodes to the true mean, while
no masked value alone is near its client's value, and a missing client spoils the sum."""

from __future__ import annotations

import numpy as np
import pytest

from hetfed.secure_mean import (
    FRACTION_BITS,
    SecureMeanError,
    decode,
    encode,
    masked,
    new_key_pair,
    unmasked_mean,
)


def party(values: np.ndarray) -> list[np.ndarray]:
    """Every client's masked row of ``values`` (one row per client)."""
    keys = [new_key_pair() for _ in values]
    public = {j: pub for j, (_, pub) in enumerate(keys)}
    return [masked(v, j, keys[j][0], public) for j, v in enumerate(values)]


def test_the_masks_cancel_in_the_sum_and_hide_each_value() -> None:
    rng = np.random.default_rng(0)
    values = np.column_stack([rng.uniform(0.1, 300.0, 6), rng.uniform(1e-5, 1.0, 6)])  # lam0, lr0 scales
    ys = party(values)
    mean = unmasked_mean(ys)
    np.testing.assert_allclose(mean, values.mean(axis=0), rtol=0, atol=2.0**-FRACTION_BITS)
    for y, v in zip(ys, values, strict=True):
        assert y.dtype == np.uint64
        # Each decoded masked value is a uniform draw over +-2^(63-40): never near the client's own.
        assert np.all(np.abs(decode(y) - v) > 1.0)
    assert not np.allclose(unmasked_mean(ys[:-1]), values[:-1].mean(axis=0), atol=1.0)  # one missing


def test_pair_masks_agree_at_both_ends_and_differ_between_pairs() -> None:
    """Two clients only: y_0 + y_1 = q(v_0) + q(v_1) exactly (the ECDH secrets of both ends agree)."""
    values = np.array([[1.5, -2.25], [0.125, 4.0]])  # exact in fixed point
    ys = party(values)
    with np.errstate(over="ignore"):
        assert np.array_equal(ys[0] + ys[1], encode(values[0]) + encode(values[1]))
    assert np.array_equal(decode(encode(values[0])), values[0])


def test_values_that_cannot_be_masked_exactly_are_refused() -> None:
    private, public = new_key_pair()
    for bad in ([np.nan, 1.0], [np.inf, 0.0], [2.0 ** (63 - FRACTION_BITS), 0.0]):
        with pytest.raises(SecureMeanError, match="not finite or too large"):
            masked(bad, 0, private, {1: public})
    with pytest.raises(SecureMeanError, match="no masked values"):
        unmasked_mean([])
