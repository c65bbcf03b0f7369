"""The validation set (validation-fraction, evaluation-split) and per-seed training subsets
(train-subset-draw), with sizes worked out by hand from the UCI digits' class counts."""

import hashlib

import numpy as np
import pytest
import torch

from fedtune_app.config import ConfigError
from fedtune_app.data.splits import run_splits, validation_split
from fedtune_app.methods import resolve_config

# the six styles of the UCI digits; a tiny random ViT (images do not depend on the model)
BASE = {"dataset": "multi-domain-digits", "image-size": 16, "partitioner": "domain",
        "capacities": "2*6", "model": "vit_tiny_patch16_224", "model-source": "random",
        "model-args": "img_size=16,patch_size=4,in_chans=3,embed_dim=16,depth=2,num_heads=1",
        "train-subset": 0, "test-subset": 0}
# UCI digits per class: 178 182 177 183 181 182 181 179 174 180 (sklearn's load_digits). The
# fixed test split takes round(0.2 n) of each class, which leaves 142 146 142 146 145 146 145
# 143 139 144 = 1,438 training digits per style; the validation part takes round(0.2 n) of
# those: 28 29 28 29 29 29 29 29 28 29 = 287 per style.
TRAIN_PER_STYLE, TEST_PER_STYLE, VALIDATION_PER_STYLE = 1438, 359, 287


def splits(**keys):
    return run_splits(resolve_config(BASE | keys))


def rows(examples) -> list[str]:
    """One fingerprint per image (no two images of the six styled digit sets are equal)."""
    return [hashlib.sha1(x.numpy().tobytes()).hexdigest() for x in examples.inputs]


def test_validation_split_takes_the_rounded_fraction_of_every_stratum():
    # a pool at positions 100..121 of its data set, strata of 10, 5 and 7 examples; at 0.2:
    # round(2.0) + round(1.0) + round(1.4) = 2 + 1 + 1 validation examples
    strata = np.concatenate([np.zeros(100, int), np.repeat([0, 1, 2], [10, 5, 7])])
    index = np.arange(100, 122)
    rest, validation = validation_split(index, strata, 0.2)
    assert len(validation) == 4 and len(rest) == 18
    assert set(rest) | set(validation) == set(index) and not set(rest) & set(validation)
    assert [int((strata[validation] == s).sum()) for s in (0, 1, 2)] == [2, 1, 1]
    again = validation_split(index, strata, 0.2)
    assert np.array_equal(again[1], validation) and np.array_equal(again[0], rest)


def test_validation_set_sizes_and_the_test_set_untouched():
    plain = splits()
    held = splits(**{"validation-fraction": 0.2})
    on_validation = splits(**{"validation-fraction": 0.2, "evaluation-split": "validation"})
    assert len(plain.train) == 6 * TRAIN_PER_STYLE and len(plain.test) == 6 * TEST_PER_STYLE
    assert len(held.train) == 6 * (TRAIN_PER_STYLE - VALIDATION_PER_STYLE)
    # evaluation-split = test: the same test set as without a validation set
    assert torch.equal(held.test.inputs, plain.test.inputs)
    assert torch.equal(held.test.labels, plain.test.labels)
    # evaluation-split = validation: 287 per style, every style, out of the training pool only
    val = on_validation.test
    assert len(val) == 6 * VALIDATION_PER_STYLE
    assert torch.bincount(val.domains).tolist() == [VALIDATION_PER_STYLE] * 6
    train, test = set(rows(on_validation.train)), set(rows(plain.test))
    pool = set(rows(plain.train))
    val_rows = set(rows(val))
    assert not val_rows & train and not val_rows & test
    assert val_rows | train == pool  # the pool, split in two


def test_validation_set_is_the_same_for_every_seed_and_method():
    a = splits(**{"validation-fraction": 0.2, "evaluation-split": "validation", "seed": 1})
    b = splits(**{"validation-fraction": 0.2, "evaluation-split": "validation", "seed": 7,
                  "method": "inclusivefl"})
    assert torch.equal(a.test.inputs, b.test.inputs) and torch.equal(a.test.labels, b.test.labels)


def test_per_seed_training_subsets_differ_by_seed_and_repeat_for_a_seed():
    keys = {"train-subset": 600, "validation-fraction": 0.2}
    per_seed = {s: rows(splits(**keys, **{"train-subset-draw": "per-seed", "seed": s}).train)
                for s in (1, 2)}
    fixed = {s: rows(splits(**keys, seed=s).train) for s in (1, 2)}
    assert fixed[1] == fixed[2]  # the old behaviour: one subset for every seed
    assert set(per_seed[1]) != set(per_seed[2])
    assert per_seed[1] == rows(splits(**keys, **{"train-subset-draw": "per-seed",
                                                 "seed": 1}).train)
    # the same stratified sizes (one draw per (style, class), same rounding), never a
    # validation example
    assert len(per_seed[1]) == len(per_seed[2]) == len(fixed[1])
    val = set(rows(splits(**keys, **{"evaluation-split": "validation"}).test))
    assert not val & set(per_seed[1]) and not val & set(per_seed[2])


def test_evaluating_on_validation_needs_a_validation_set():
    with pytest.raises(ConfigError, match="'evaluation-split' = 'validation' needs"):
        resolve_config(BASE | {"evaluation-split": "validation"})
    with pytest.raises(ConfigError, match="'train-subset-draw'"):
        resolve_config(BASE | {"train-subset-draw": "random"})
