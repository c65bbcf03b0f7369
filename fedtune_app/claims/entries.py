"""What the claims registry holds: a setting, an arm, a claim, a robustness check."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Setting:
    id: str
    shape: str  # the paper's scenario and how it was scaled
    tiers: dict  # tier -> {"preset": name (expanded), **keys}
    reference: str = "all-large"  # the gate: AllLarge - AllSmall must discriminate
    small: str = "all-small"
    # the paper's AllLarge and AllSmall in this setting (points; None where it reports none)
    # and where they come from: the effect-size ratio's denominator
    paper_large: float | None = None
    paper_small: float | None = None
    paper_gap: str = ""


@dataclass(frozen=True)
class Arm:
    label: str
    method: str
    keys: dict = field(default_factory=dict)
    tier_keys: dict = field(default_factory=dict)  # tier -> keys only that tier sets
    # the run-config keys the arm's chosen rate (tuned, or the papers' 0.01) sets: more than
    # 'lr' where the method's own paper or code trains a second phase at the clients' rate
    rate_keys: tuple = ("lr",)


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str  # "FedRA" (v2, ECCV 2024), "FedBRICK", "HeteroTune"
    table: str
    sentence: str  # what the paper says
    terms: tuple  # ((coefficient, setting id, arm label), ...): the per-seed paired statistic
    direction: str  # greater | within | similar (stats)
    margin: float  # accuracy points; 0 for 'greater'
    paper_numbers: str  # the paper's numbers this claim rests on, with their table row
    # the paper's own difference of the same statistic (points); None where no number of it could
    # be read (the report prints "not readable" and places no effect against ours)
    paper_difference: float | None
    seeds: int = 3  # seeds on tiers without a count of their own (TIER_SEEDS)
    priority: int = 9  # campaign order: lower runs first
    choices: str = ""  # open choices of the paper and how they were made here
    metric: str = "accuracy"  # the headline accuracy of every arm (see ``METRIC_NOTE``)
    margin_reason: str = ""  # why the margin of a 'within' / 'similar' claim is what it is
    same_as: str = ""  # a claim this one equals run for run (marked, kept out of Holm's family)
    same_reason: str = ""


@dataclass(frozen=True)
class Check:
    """A robustness check: the claims' arms run again with ``keys`` over the tier's, on seeds
    0..seeds-1, each arm at its tuned rate; the verdict rule as the tier's, Holm over the
    check's claims."""

    id: str
    what: str
    keys: dict
    claims: tuple  # in the order they run
    seeds: int = 5
    reason: str = ""


@dataclass(frozen=True)
class PaperSteps:
    """What a paper states about its training length: local epochs a round and rounds (None:
    not stated), and where it says so."""

    local_epochs: int | None
    rounds: int | None
    source: str
