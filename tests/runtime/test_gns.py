"""Gradient noise scale estimator: recovers |G|^2 and tr(S) from the two norms."""

from __future__ import annotations

import pytest

from hpcorch.runtime.gns import NoiseScale


def test_recovers_noise_scale_from_exact_expectations() -> None:
    g2, tr = 4.0, 1000.0  # B_noise = 250
    est = NoiseScale(decay=0.5)
    assert est.value is None
    for b_small, b_big in [(16, 64), (32, 128), (8, 64)]:
        est.update(g2 + tr / b_small, g2 + tr / b_big, b_small, b_big)
    assert est.value == pytest.approx(250.0)


def test_single_rank_gives_no_estimate_and_state_round_trips() -> None:
    est = NoiseScale()
    est.update(1.0, 1.0, 64, 64)
    assert est.value is None and est.updates == 0
    est.update(5.0, 2.0, 8, 16)
    copy = NoiseScale()
    copy.load_state_dict(est.state_dict())
    assert copy.value == est.value and copy.updates == 1
