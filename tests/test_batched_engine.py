"""The batched client engine gives every client the update the sequential engine gives it.

Each test runs rounds 1-3 of a real in-process federation on the sequential engine, keeping
every train message, the node's state before and after it and its reply, then hands each
round's messages to the batched engine (``client.handle_train_cohort``) on node contexts holding
the state each node had before that round, and compares client by client: same tensor names and
shapes, same example counts, updates (and what a node keeps for its next round: FedSA-LoRA's own
B) equal within the float32 tolerance derived below. Rounds 2 and 3 are where a method's memory
shows: FLoRA's and FedEx-LoRA's merged ``lora_delta`` is no longer zero, FedSA-LoRA's B is the
node's own, FedDF's clients start from the server's distilled model. The clients differ in block
sets (FedRA's random subsets, prefixes), LoRA ranks ('ranks') and step counts (Dirichlet label
skew: unequal data, unequal last batches), and LoRA dropout is on, so the per-client dropout
generators are compared too.

Tolerance. Both engines do the same float32 operations on the same numbers; only the order of
the sums inside a matmul differs (one (clients, rows, in) x (clients, in, out) batched matmul,
or a frozen matmul over the concatenated rows, instead of one matmul per client; a mean over a
client's slice instead of over its batch). A sum of K float32 products reassociated differs by
at most about K * eps32 * sum|a_i b_i| (eps32 = 2^-24 per rounding, K roundings on a path); the
longest sums here are a weight gradient's, K = examples x rows per example of a step (at most 16
x 32 = 512). Relative to the gradient that is K * eps32 ~ 3e-5 per step; over S steps the
differences add (the trajectories stay close: lr times the loss's curvature is well below 1 at
these rates), so the trained tensor differs from the sequential one by at most S * K * eps32 of
the update's size: with S <= 12 steps (at most 121 examples at batch 16 here) 3.7e-4 of max
|update|; each step also rounds the new value once at the tensor's own magnitude, adding S *
eps32 * max |value|. On the CPU this was first written on the two engines agreed bit for bit
(each client's slice of a batched matmul computed like its own matmul); on an AMD EPYC they do
not, and the tolerance is what such a machine, whose kernels block the sums differently, may
differ by. A wrong mask, loss scale, clip or dropout draw moves an update by a sizeable fraction
of itself: thousands of tolerances (test_a_wrong_loss_scale_is_caught; the others were checked
by hand). The feedback of one step's difference into the next step's gradient is left out:
at these rates lr times the loss's curvature is well below 1, so it shrinks rather than grows.
AdamW divides by its second moment and needs a bound of its own (``AdamSteps.tolerance``).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from flwr.app import Context, MessageType, RecordDict

from fedtune_app.apps import client
from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.inprocess import InProcessGrid, run_inprocess, simulation_nodes
from fedtune_app.apps.server import run_federation
from fedtune_app.config import ConfigError
from fedtune_app.federated.records import from_record
from fedtune_app.federated.wire import TRAINED_BATCHED, TrainTask
from fedtune_app.methods import recipe_for, resolve_config
from fedtune_app.methods.fedsa_lora import LOCAL_B
from fedtune_app.methods.registry import METHODS
from fedtune_app.training import batched
from fedtune_app.training.batched import not_batchable

EPS32 = 2.0 ** -24
# the longest sum of a step: a weight gradient's, over the batch's 16 examples times the rows
# each example gives the Linear (the ViT's 17 tokens; the Mixer's token MLP: 32 channels)
MAX_ROWS_TOKENS = 16 * 32
MAX_STEPS = 12
RTOL = MAX_STEPS * MAX_ROWS_TOKENS * EPS32  # see the module docstring: ~3.7e-4

# the smoke preset (a 4-block MLP-Mixer on the UCI digits), three clients of capacities 4, 2, 1;
# Dirichlet label skew gives them unequal data, hence unequal step counts and last batches
TINY = {"preset": "smoke", "train-subset": 240, "test-subset": 50, "num-server-rounds": 1,
        "batch-size": 16, "dirichlet-self-balancing": False}
VIT = {"model": "vit_tiny_patch16_224", "model-source": "random",
       "model-args": "img_size=8,patch_size=2,in_chans=1,embed_dim=32,depth=4,num_heads=2"}
RANKS = {"ranks": "8,4,2"}
GROUPS = {"preset": "smoke-groups"}  # two model groups (ViTs of width 16 and 32)
SEEDS = (0, 1, 2)
ROUNDS = 3  # beyond the first round: what a method carries from round to round

# method -> extra run-config keys: every method whose client step is plain local training
# (``test_every_method_the_engine_takes_is_compared`` keeps this list whole)
COVERED = {
    "fedra": {},
    "fedra-cover-all": {"method": "fedra", "missing-layer-policy": "cover-all"},
    "fedra-clipped": {"method": "fedra", "grad-clip": 0.05},  # every step clips
    "all-large": {},
    "all-small": {},
    "inclusivefl": {},
    "fedit": RANKS,
    "flora": RANKS,
    "flexlora": RANKS,
    "fedex-lora": RANKS,
    "ffa-lora": RANKS,
    "fedsa-lora": RANKS,
    # over model groups: each group's clients are a cohort of their own
    "flexifed": GROUPS,
    "homo": GROUPS,
    "feddf": GROUPS | {"feddf-steps": 2},  # plain local steps; the distillation is the server's
}


def run_rounds(tmp_path, keys: dict, rounds: int = ROUNDS):
    """Rounds 1..``rounds`` on the sequential engine: the run config, and per train message
    (message, node config, node state before it, its reply, node state after it)."""
    rc = TINY | {"results-dir": str(tmp_path), "num-server-rounds": rounds} | keys
    cfg = resolve_config(rc)
    nodes = simulation_nodes(len(cfg.federation.capacity_list))
    seen = []

    def keep(msg, context):
        if msg.metadata.message_type != MessageType.TRAIN:
            return client_app(msg, context)
        before = copy.deepcopy(context.state)
        reply = client_app(msg, context)
        seen.append((msg, dict(context.node_config), before, reply,
                     copy.deepcopy(context.state)))
        return reply

    run_federation(InProcessGrid(keep, nodes, rc), cfg)
    return rc, seen


def round_of(msg) -> int:
    return TrainTask.from_content(msg.content).server_round


def node_context(rc: dict, msg, node_config: dict, state: RecordDict) -> Context:
    """The node's context as it was before the message's round (a copy of its node state)."""
    return Context(run_id=7, node_id=msg.metadata.dst_node_id, node_config=dict(node_config),
                   state=copy.deepcopy(state), run_config=dict(rc))


def relative_difference(sent: dict, ours: dict, theirs: dict, rtol: float = RTOL) -> float:
    """max over tensors of max |ours - theirs| / tolerance, the tolerance of a tensor being
    rtol x max |update| (the reassociated sums, module docstring) plus MAX_STEPS x eps32 x
    max |value| (each step rounds the new value once at the tensor's own magnitude); <= 1 is
    equal. A tensor's update counts at least its module's largest (a bias next to its weight):
    a gradient whose sum cancels to about zero (the bias of an adapter's up-projection inside
    the Mixer's token MLP: 5e-10 after a round) is nothing but the rounding of terms as large
    as the module's other gradient terms, and so differs by K x eps32 of those, not of itself."""
    moved = {}
    for name, value in theirs.items():
        start = sent.get(name)
        moved[name] = float(np.abs(value - start).max() if start is not None
                            and start.shape == value.shape else np.abs(value).max())
    module_moved = {}
    for name, size in moved.items():
        module = name.rsplit(".", 1)[0]
        module_moved[module] = max(module_moved.get(module, 0.0), size)
    worst = 0.0
    for name, value in theirs.items():
        scale = module_moved[name.rsplit(".", 1)[0]]
        tol = rtol * scale + MAX_STEPS * EPS32 * float(np.abs(value).max()) + 1e-30
        worst = max(worst, float(np.abs(ours[name] - value).max()) / tol)
    return worst


def compare_rounds(tmp_path, keys: dict, rounds: int = ROUNDS, rtol: float = RTOL,
                   adam=None) -> float:
    """The worst difference, in tolerances, over every client of rounds 1..``rounds``: each
    round's messages trained by the batched engine from the node states the sequential run
    had before that round. ``adam``: an ``AdamSteps`` recording the sequential run, whose
    per-element tolerance then replaces ``relative_difference``'s."""
    rc, items = run_rounds(tmp_path, keys, rounds)
    if adam is not None:
        adam.recording = False
    assert items and not any(r.has_error() for _, _, _, r, _ in items)
    assert sorted({round_of(m) for m, *_ in items}) == list(range(1, rounds + 1))
    worst = 0.0
    for server_round in range(1, rounds + 1):
        positions = [k for k, (m, *_) in enumerate(items) if round_of(m) == server_round]
        contexts = [node_context(rc, items[k][0], items[k][1], items[k][2]) for k in positions]
        replies = client.handle_train_cohort([(items[k][0], c)
                                              for k, c in zip(positions, contexts)])
        assert sorted(replies) == list(range(len(positions))), "every client trained in the cohort"
        for j, k in enumerate(positions):
            msg, _, before, theirs, after = items[k]
            ours = replies[j]
            assert not ours.has_error(), ours.error
            assert ours.metadata.reply_to_message_id == msg.metadata.message_id
            a, b = from_record(ours.content["arrays"]), from_record(theirs.content["arrays"])
            assert {n: v.shape for n, v in a.items()} == {n: v.shape for n, v in b.items()}
            ma, mb = ours.content["metrics"], theirs.content["metrics"]
            assert (ma[TRAINED_BATCHED], mb[TRAINED_BATCHED]) == (1, 0)
            assert ma["num-examples"] == mb["num-examples"]
            if adam is None:
                worst = max(worst, abs(ma["train-loss"] - mb["train-loss"])
                            / (rtol * mb["train-loss"]))
                worst = max(worst, relative_difference(from_record(msg.content["arrays"]), a, b,
                                                       rtol))
            else:
                worst = max(worst, adam.worst(k, a, b))
            # what the node keeps for its next round (FedSA-LoRA's own B): kept alike
            kept = contexts[j].state
            assert sorted(kept) == sorted(after)
            for key in after:
                worst = max(worst, relative_difference(
                    from_record(before[key]) if key in before else {},
                    from_record(kept[key]), from_record(after[key]), rtol))
    return worst


def methods_the_engine_takes() -> set[str]:
    """Every registered method whose clients ``not_batchable`` lets into a cohort (on the smoke
    preset; over model groups for the methods that only run there)."""
    takes = set()
    for name, method in METHODS.items():
        groups = method.strategy is None
        cfg = resolve_config(TINY | {"method": name} | (GROUPS if groups else {}))
        if not_batchable(cfg, recipe_for(cfg, 0 if groups else None)) is None:
            takes.add(name)
    return takes


def test_every_method_the_engine_takes_is_compared():
    """The engine's own word decides which methods are compared: a method it comes to take
    without a comparison here fails this test. FedDF is one: its client step is plain local
    training (its ensemble distillation runs on the server)."""
    compared = {keys.get("method", name) for name, keys in COVERED.items()}
    assert methods_the_engine_takes() == compared
    assert {"feddf", "flora", "fedex-lora", "fedsa-lora"} <= compared


@pytest.mark.parametrize("name", sorted(COVERED))
def test_each_client_gets_its_sequential_update(tmp_path, name):
    keys = {"method": name, "seed": 1} | COVERED[name]
    worst = compare_rounds(tmp_path, keys)
    assert worst <= 1.0, (name, worst)  # 1.0 = the derived tolerance


def test_later_rounds_carry_what_the_methods_remember(tmp_path):
    """The comparison above reaches each method's memory: in rounds 2 and 3 FLoRA and FedEx-LoRA
    send a non-zero merged ``lora_delta`` (zero in round 1; FedEx-LoRA's stays zero on a block
    one client held, the mean of one product being its own), and a FedSA-LoRA node holds its
    own non-zero B before it trains (the batched engine's B is compared and kept like that)."""
    for method in ("flora", "fedex-lora"):
        _, items = run_rounds(tmp_path / method, {"method": method, "seed": 1} | RANKS)
        largest = dict.fromkeys(range(1, ROUNDS + 1), 0.0)  # round -> its largest |delta|
        for msg, *_ in items:
            for name, value in from_record(msg.content["arrays"]).items():
                if name.endswith(".lora_delta"):
                    largest[round_of(msg)] = max(largest[round_of(msg)],
                                                 float(np.abs(value).max()))
        assert largest[1] == 0 and largest[2] > 0 and largest[3] > 0, (method, largest)
    _, items = run_rounds(tmp_path / "fedsa", {"method": "fedsa-lora", "seed": 1} | RANKS)
    for msg, _, before, _, after in items:
        assert LOCAL_B in after
        if round_of(msg) > 1:
            own = from_record(before[LOCAL_B])
            assert max(float(np.abs(v).max()) for v in own.values()) > 0


VARIANTS = {  # what else shapes a client's step, on FedRA
    "bottleneck-adapters": {"adapter": "bottleneck"},
    "lora-on-attention-only": {"adapter-modules": "last-fc-attn", "lora-alpha": 16.0},
    "two-local-epochs": {"local-epochs": 2},
    "fedra-repo-batch-cap": {"fedra-repo-batch-cap": True},
    "two-clients-sampled": {"clients-per-round": 2},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_of_the_local_step(tmp_path, name):
    assert compare_rounds(tmp_path, {"method": "fedra", "seed": 1} | VARIANTS[name],
                          rounds=2) <= 1.0


class AdamSteps:
    """Records every AdamW step of the sequential run (one optimizer per client-round, in the
    order of the train messages): per step and tensor its rate, Adam's divisor sqrt(v_hat) + eps
    and the largest |gradient|; from them, each element's tolerance (``tolerance``).

    Derivation. An element's step is -lr u, u = m_hat / (s + eps), s = sqrt(v_hat), where m_hat
    and v_hat are weighted means of the gradients g_k and g_k^2 (weights w1_k, w2_k summing to
    1). Let the engines' gradients differ by dg_k (|dg_k| <= D_t for k <= t). To first order
    du = dm_hat / (s + eps) - m_hat ds / (s + eps)^2, with |dm_hat| <= D_t (a weighted mean),
    |dv_hat| = |sum w2_k 2 g_k dg_k| <= 2 D_t s (Cauchy-Schwarz), so |ds| <= D_t; and
    |m_hat| <= sqrt(sum w1_k g_k^2) <= c_t s, c_t^2 = max_k w1_k / w2_k
    = (1 - b1)(1 - b2^t) / ((1 - b2)(1 - b1^t)) (at k = t, as b1 < b2). Hence
        |du_t| <= (1 + c_t) D_t / (s_t + eps),
    and over the client's steps the element moves apart by at most sum_t lr (1 + c_t) D_t /
    (s_t + eps), plus one rounding of the value per step (S eps32 |value|). D_t is the
    reassociated sums' difference of the module docstring, K eps32 times the module's largest
    |gradient| so far (a sum's terms are of the size of its module's gradients, K = the
    longest sum). Where v_hat is small (a gradient that is nothing but cancellation) the bound
    grows as 1 / (s + eps): there Adam turns rounding into a step of order lr, in either
    engine, and no tighter tolerance holds; where the gradient is well above rounding the bound
    is of order S K eps32 lr, far below the update."""

    def __init__(self, monkeypatch):
        self.steps: list[list] = []  # per client-round: per step [(lr, c_t, divisor, |g| max)]
        self.recording = True
        original, spy = torch.optim.AdamW.step, self

        def step(optimizer, *args, **kwargs):
            out = original(optimizer, *args, **kwargs)
            if spy.recording:
                spy.record(optimizer)
            return out

        monkeypatch.setattr(torch.optim.AdamW, "step", step)

    def record(self, optimizer) -> None:
        if not getattr(optimizer, "recorded", False):
            optimizer.recorded = True
            self.steps.append([])
        [group] = optimizer.param_groups
        (b1, b2), eps, lr = group["betas"], group["eps"], group["lr"]
        tensors = []
        for p in group["params"]:
            state = optimizer.state[p]
            t = int(state["step"])
            c = ((1 - b1) * (1 - b2 ** t) / ((1 - b2) * (1 - b1 ** t))) ** 0.5
            divisor = (state["exp_avg_sq"] / (1 - b2 ** t)).sqrt() + eps
            tensors.append((lr, c, divisor.detach().clone().numpy(),
                            float(p.grad.abs().max())))
        self.steps[-1].append(tensors)

    def tolerance(self, k: int, names: list[str], values: dict) -> dict[str, np.ndarray]:
        """Client-round ``k``'s tolerance of each element of each tensor (``names``: the
        tensors in the optimizer's order, that of the reply)."""
        modules = [n.rsplit(".", 1)[0] for n in names]
        steps = self.steps[k]
        tol = {n: len(steps) * EPS32 * np.abs(values[n]) for n in names}
        largest = dict.fromkeys(modules, 0.0)  # each module's largest |gradient| so far
        for tensors in steps:
            assert len(tensors) == len(names)
            for module, (_, _, _, g) in zip(modules, tensors):
                largest[module] = max(largest[module], g)
            for n, module, (lr, c, divisor, _) in zip(names, modules, tensors):
                assert divisor.shape == values[n].shape, n
                tol[n] = tol[n] + lr * (1 + c) * MAX_ROWS_TOKENS * EPS32 * largest[module] \
                    / divisor
        return tol

    def worst(self, k: int, ours: dict, theirs: dict) -> float:
        tol = self.tolerance(k, list(theirs), theirs)
        return max(float((np.abs(ours[n] - v) / tol[n]).max()) for n, v in theirs.items())


@pytest.mark.parametrize("seed", SEEDS)
def test_vit_clients_with_different_blocks_and_adamw(tmp_path, monkeypatch, seed):
    """The ViT family (the claims' backbone), FedRA's random block subsets, AdamW with its state
    per client, at the tier's largest rate 0.1, each element within ``AdamSteps``' bound. The
    bound is no blanket: for most elements it is under a hundredth of the element's own
    update (an error of a percent of an update would show)."""
    keys = VIT | {"method": "fedra", "seed": seed, "optimizer": "adamw", "lr": 0.1,
                  "capacities": "4,3,2,1"}
    adam = AdamSteps(monkeypatch)
    assert compare_rounds(tmp_path, keys, adam=adam) <= 1.0
    _, items = run_rounds(tmp_path / "again", keys, rounds=1)
    msg, reply = items[0][0], items[0][3]
    sent, trained = from_record(msg.content["arrays"]), from_record(reply.content["arrays"])
    tol = adam.tolerance(0, list(trained), trained)
    ratios = np.concatenate([(tol[n] / np.maximum(np.abs(trained[n] - sent[n]), 1e-30)).ravel()
                             for n in trained])
    assert np.median(ratios) < 0.01, np.median(ratios)


def test_the_methods_with_their_own_step_fall_back(tmp_path):
    """Not batched, said by ``not_batchable``: their messages are left to ``handle_train``."""
    for method in ("depthfl", "fedbrick", "hetlora"):
        cfg = resolve_config(TINY | {"method": method})
        assert not_batchable(cfg, recipe_for(cfg)) is not None, method
    cfg = resolve_config(TINY | {"method": "fedra", "local-objective": "fedprox"})
    assert "fedprox" in not_batchable(cfg, recipe_for(cfg))
    rc, items = run_rounds(tmp_path, {"method": "depthfl"}, rounds=1)
    assert client.handle_train_cohort([(m, node_context(rc, m, nc, state))
                                       for m, nc, state, _, _ in items]) == {}


def test_a_whole_run_either_way_ends_at_the_same_state_and_records(tmp_path):
    """Two rounds through ``run_inprocess`` (the runner the claims campaigns use), key
    'client-engine': the same final global state within the tolerance, compounded over two
    rounds, and the same evaluations (what a claims record keeps): the loss within it, the
    accuracy within one test example (a prediction at a tie may flip under rounding)."""

    from safetensors.numpy import load_file

    states, evaluations = {}, {}
    for engine in batched.ENGINES:
        folder = run_inprocess(TINY | {"method": "fedra", "num-server-rounds": 2, "seed": 3,
                                       "eval-every": 1, "client-engine": engine,
                                       "results-dir": str(tmp_path / engine)})
        states[engine] = load_file(f"{folder}/state.safetensors")
        evaluations[engine] = json.loads(open(f"{folder}/metrics.json").read())
    seq, bat = states["sequential"], states["batched"]
    assert sorted(seq) == sorted(bat)
    for name in seq:
        scale = max(float(np.abs(seq[name]).max()), 1e-12)
        assert float(np.abs(seq[name] - bat[name]).max()) <= 2 * RTOL * scale, name
    n = TINY["test-subset"]
    for a, b in zip(evaluations["sequential"], evaluations["batched"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=2 * RTOL)
        assert abs(a["accuracy"] - b["accuracy"]) <= 1 / n + 1e-12


def test_a_wrong_loss_scale_is_caught(tmp_path, monkeypatch):
    """The comparison can fail: one client's loss counted twice (a wrong per-client scaling)
    moves its update far beyond the tolerance."""
    original = batched.Cohort._forward

    def doubled_first_client(self, inputs, active, sizes):
        logits = original(self, inputs, active, sizes)
        return logits * torch_scale(sizes, logits)

    def torch_scale(sizes, logits):
        import torch

        scale = torch.ones(len(logits), 1)
        scale[:sizes[0]] = 2.0  # the first client's logits, hence its loss, distorted
        return scale

    monkeypatch.setattr(batched.Cohort, "_forward", doubled_first_client)
    assert compare_rounds(tmp_path, {"method": "fedra", "seed": 0}, rounds=1) > 1000.0


def test_unknown_engine_names_the_allowed_ones():
    with pytest.raises(ConfigError, match="client-engine.*sequential, batched"):
        resolve_config(TINY | {"client-engine": "parallel"})


class NotSynchronous(InProcessGrid):
    """The in-process Grid seen as Flower's real one (push, then pull): the ServerApp wraps it
    in the ``CohortGrid`` that bundles each round's train messages, as under `flwr run`."""

    synchronous = False
    pull_interval = 0.0


BUNDLED = {"fedra": {}, "fedsa-lora": RANKS, "flexifed": {"preset": "smoke-groups"}}


@pytest.mark.parametrize("method", sorted(BUNDLED))
def test_a_bundled_round_under_the_simulation_grid_matches_the_sequential_run(tmp_path, method):
    """Through ``CohortGrid``: one train message a round (to the node of partition 0), the
    same final state as the sequential engine's (FedSA-LoRA: each partition's local B kept by
    the cohort node between the two rounds; FlexiFed: two groups' cohorts in one bundle)."""
    from safetensors.numpy import load_file

    keys = TINY | {"method": method, "num-server-rounds": 2, "seed": 4} | BUNDLED[method]
    states, grids = {}, {}
    for engine in batched.ENGINES:
        client._MODELS.clear()  # a fresh node: its model's adapters are built in round 1
        rc = keys | {"client-engine": engine, "results-dir": str(tmp_path / engine)}
        cfg = resolve_config(rc)
        grid = NotSynchronous(client_app, simulation_nodes(len(cfg.federation.capacity_list)),
                              rc)
        folder = run_federation(grid, cfg)
        states[engine], grids[engine] = load_file(f"{folder}/state.safetensors"), grid
    train = [m for m in grids["batched"].sent if m.metadata.message_type == MessageType.TRAIN]
    assert [m.metadata.dst_node_id for m in train] == [grids["batched"].node_ids[0]] * 2
    seq, bat = states["sequential"], states["batched"]
    assert sorted(seq) == sorted(bat)
    for name in seq:
        scale = max(float(np.abs(seq[name]).max()), 1e-12)
        assert float(np.abs(seq[name] - bat[name]).max()) <= 2 * RTOL * scale, name


def test_a_bundle_whose_node_fails_is_every_carried_clients_error(tmp_path):
    """The cohort node answers the bundle with an error: each client of the bundle gets that
    error as its own reply, from its own node, and the round goes on without them."""

    from flwr.app import Error, Message

    from fedtune_app.federated.flower_private import ErrorCode

    def crash(msg, reply):
        if msg.metadata.message_type != MessageType.TRAIN:
            return reply
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="out of memory"),
                       reply_to=msg)

    rc = TINY | {"method": "fedra", "client-engine": "batched", "results-dir": str(tmp_path)}
    cfg = resolve_config(rc)
    grid = NotSynchronous(client_app, simulation_nodes(len(cfg.federation.capacity_list)), rc,
                          {0: crash})
    folder = run_federation(grid, cfg)
    [record] = json.loads(open(f"{folder}/metrics.json").read())
    assert sorted(record["rejected"]) == ["0", "1", "2"]
    assert all("out of memory" in why for why in record["rejected"].values())
    assert record["state-updated"] is False


@pytest.mark.parametrize("grid", ["in-process", "bundled"])
def test_an_engine_failure_is_each_clients_error_never_a_sequential_retry(tmp_path, monkeypatch,
                                                                          grid):
    """The cohort's training raises: every client of the cohort answers with that error (the
    in-process runner's engine, and a bundle's cohort node under ``CohortGrid``), the round
    counts them as errors and rejected replies, and no client trains on the sequential path
    in its place."""
    from fedtune_app.training.recipes import ClientRecipe

    def broken(self):
        raise RuntimeError("stacks out of memory")

    sequential = []
    fit = ClientRecipe.fit
    monkeypatch.setattr(batched.Cohort, "train", broken)
    monkeypatch.setattr(ClientRecipe, "fit", lambda *a, **k: sequential.append(1) or fit(*a, **k))
    rc = TINY | {"method": "fedra", "client-engine": "batched", "results-dir": str(tmp_path)}
    cfg = resolve_config(rc)
    nodes = simulation_nodes(len(cfg.federation.capacity_list))
    if grid == "in-process":
        folder = run_inprocess(rc)
    else:
        folder = run_federation(NotSynchronous(client_app, nodes, rc), cfg)
    [record] = json.loads(open(f"{folder}/metrics.json").read())
    assert sequential == []
    assert sorted(record["rejected"]) == sorted(record["errors"]) == ["0", "1", "2"]
    assert all("client-engine batched failed: RuntimeError: stacks out of memory"
               in e["reason"] for e in record["errors"].values())
    assert record["client-engines"] == {"sequential": 0, "batched": 0}
    assert record["state-updated"] is False


def test_a_run_records_which_engine_trained_each_client(tmp_path):
    """config.json names the engine asked for; metrics.json, per round, how many clients each
    engine trained and, per client, ``trained-batched``. A method the engine does not take
    (DepthFL) under 'client-engine = batched' is recorded as trained sequentially."""
    for method, engine, expected in [("fedra", "batched", {"sequential": 0, "batched": 3}),
                                     ("fedra", "sequential", {"sequential": 3, "batched": 0}),
                                     ("depthfl", "batched", {"sequential": 3, "batched": 0})]:
        folder = run_inprocess(TINY | {"method": method, "client-engine": engine,
                                       "results-dir": str(tmp_path / method / engine)})
        config = json.loads(open(f"{folder}/config.json").read())
        assert config["run-config"]["client-engine"] == engine
        [record] = json.loads(open(f"{folder}/metrics.json").read())
        assert record["client-engines"] == expected, (method, engine)
        assert sorted(m[TRAINED_BATCHED] for m in record["client-metrics"].values()) \
            == [int(expected["batched"] > 0)] * 3
