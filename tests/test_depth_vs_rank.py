"""examples/depth_vs_rank.py: its two arms spend the same LoRA budget, and its paired t interval
matches one worked by hand."""

import importlib.util
from pathlib import Path

import pytest

from fedtune_app.methods import resolve_config

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "depth_vs_rank.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("depth_vs_rank_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_arms_hold_the_same_rank_blocks_per_client(example):
    budgets = {}
    for arm, keys in example.ARMS.items():
        cfg = resolve_config({**example.COMMON, **keys})
        budgets[arm] = [c * r for c, r in zip(cfg.federation.capacity_list,
                                               cfg.federation.rank_list)]
    assert budgets == {"layers": [12, 12, 12], "rank": [12, 12, 12]}


def test_paired_t_interval_by_hand(example):
    # differences 0.47, 0.29, 0.29: mean 0.35, sd = sqrt((0.12^2 + 2 * 0.06^2) / 2) = sqrt(0.0108),
    # t_{0.975, 2} = 4.302653: half-width 4.302653 * sqrt(0.0108) / sqrt(3) = 0.258159
    mean, low, high = example.t_interval([0.47, 0.29, 0.29])
    assert mean == pytest.approx(0.35, abs=1e-12)
    assert (low, high) == pytest.approx((0.35 - 0.258159, 0.35 + 0.258159), abs=1e-6)
