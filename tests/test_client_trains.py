"""Key 'client-trains': adapters (default) or full fine-tuning of the model a client holds."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from client_app import app as client_app
from fedtune_app.apps.evaluation import build_global
from fedtune_app.apps.server import run_federation
from fedtune_app.config import ConfigError, app_defaults
from fedtune_app.data.splits import client_examples, run_splits
from fedtune_app.federated.aggregation import ClientUpdate, masked_weighted_mean
from fedtune_app.methods import recipe_for, resolve_config
from fedtune_app.model.backbones import ModelSpec, build_backbone
from fedtune_app.training.local import train_local
from inprocess import InProcessGrid, simulation_nodes

# the smoke preset's Mixer: embed_dim 32, 16 patches (8x8 image, patch 2), token MLP 16 -> 16,
# channel MLP 32 -> 128 -> 32. One block's parameters: 2 LayerNorms 2 * (32 + 32), token fc1
# and fc2 2 * (16*16 + 16), channel fc1 32*128 + 128, fc2 128*32 + 32
BLOCK = 2 * 64 + 2 * (256 + 16) + (4096 + 128) + (4096 + 32)
HEAD = 32 * 10 + 10
# outside the blocks: the patch embedding (a 2x2 conv from 1 channel to 32) and the final norm
STEM_NECK = (32 * 1 * 2 * 2 + 32) + (32 + 32)


def smoke(**keys):
    return resolve_config({**app_defaults(), "preset": "smoke", **keys})


def full_model(cfg):
    recipe = recipe_for(cfg)
    return recipe.build(ModelSpec.from_config(cfg.model, 10)), recipe


def test_full_trains_every_parameter_of_the_model_a_client_holds():
    assert BLOCK == 9024
    cfg = smoke(method="all-large", **{"client-trains": "full"})
    model, recipe = full_model(cfg)
    params = recipe.trainables(model, (0, 2))
    assert sum(p.numel() for p in params.values()) == 2 * BLOCK + HEAD + STEM_NECK
    assert {n.split(".")[1] for n in params if n.startswith("blocks.")} == {"0", "2"}
    assert not any(".lora_" in n for n in params) and all(p.requires_grad
                                                          for p in params.values())
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen, no adapter


def test_full_initial_state_is_the_pretrained_model_and_a_seeded_head():
    cfg = smoke(method="all-large", **{"client-trains": "full"})
    model, recipe = full_model(cfg)
    state = recipe.initial_state(model, cfg.seed)
    plain = build_backbone(ModelSpec.from_config(cfg.model, 10)).state_dict()  # the seeded init
    backbone = [n for n in state if not n.startswith("head.")]
    assert len(backbone) == 4 * 12 + 4  # 12 tensors per Mixer block, 2 in the stem, 2 after
    for name in backbone:
        assert np.array_equal(state[name], plain[name].numpy())
    # block weights draw no random numbers: the head weight is the generator's first draw
    head = torch.zeros(10, 32).normal_(0.0, 0.02, generator=torch.Generator().manual_seed(
        cfg.seed))
    assert np.array_equal(state["head.weight"], head.numpy())
    assert not state["head.bias"].any()


def test_one_local_step_changes_a_block_weight():
    cfg = smoke(method="all-large", **{"client-trains": "full", "local-epochs": 1})
    model, recipe = full_model(cfg)
    params = recipe.trainables(model, (0, 1, 2, 3))
    before = params["blocks.1.mlp_channels.fc1.weight"].detach().clone()
    examples = client_examples(cfg, run_splits(cfg), 0, 3)
    train_local(model.subnetwork((0, 1, 2, 3)), list(params.values()), examples, cfg.training,
                seed=0, device=torch.device("cpu"))
    assert not torch.equal(before, params["blocks.1.mlp_channels.fc1.weight"])


def test_a_full_block_weight_averages_over_its_holders_only():
    name = "blocks.1.norm1.weight"
    state = {name: np.zeros(2, np.float32), "head.bias": np.zeros(1, np.float32)}
    updates = [ClientUpdate("0", {name: np.array([1.0, 2.0], np.float32)}, 30),
               ClientUpdate("1", {name: np.array([4.0, 8.0], np.float32)}, 10),
               ClientUpdate("2", {"head.bias": np.ones(1, np.float32)}, 60)]  # no block 1
    new = masked_weighted_mean(state, updates)
    # (30 * 1 + 10 * 4) / 40 = 1.75, (30 * 2 + 10 * 8) / 40 = 3.5: exact in float32
    assert new[name].tolist() == [1.75, 3.5]


@pytest.mark.parametrize("method", ["fedra", "fedbrick", "depthfl"])
def test_methods_defined_on_adapters_refuse_full(method):
    with pytest.raises(ConfigError, match=f"'client-trains' = 'full' with method '{method}'"):
        smoke(method=method, **{"client-trains": "full"})


@pytest.mark.parametrize("method, expected", [("heterotune", "adapters"),
                                              ("pfedlora", "adapters"), ("homo", "full"),
                                              ("feddf", "full"), ("flexifed", "full"),
                                              ("all-large", "full")])
def test_the_heterotune_reading_per_method(method, expected):
    cfg = resolve_config({**app_defaults(), "preset": "heterotune-t1-cifar10", "method": method})
    assert cfg.adapter.client_trains == expected
    with pytest.raises(ConfigError, match="'client-trains' = 'full'") if expected == "adapters" \
            else _no_error():
        resolve_config({**app_defaults(), "preset": "heterotune-t1-cifar10", "method": method,
                        "client-trains": "full"})


class _no_error:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_full_fine_tuning_in_process_federation(tmp_path):
    rc = {**app_defaults(), "preset": "smoke", "results-dir": str(tmp_path),
          "method": "all-large", "client-trains": "full"}
    cfg = resolve_config(rc)
    grid = InProcessGrid(client_app, simulation_nodes(3), rc)
    folder = Path(run_federation(grid, cfg))
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2] and all(m["rejected"] == {} for m in metrics)
    for msg in (m for m in grid.sent if m.metadata.message_type == "train"):
        n_floats = sum(a.numpy().size for a in msg.content["arrays"].values())
        assert n_floats == 4 * BLOCK + HEAD + STEM_NECK  # all-large: the whole model
    model, recipe = full_model(cfg)
    start = recipe.initial_state(model, cfg.seed)
    final = load_file(str(folder / "state.safetensors"))
    changed = {n for n in start if not np.array_equal(start[n], final[n])}
    assert {f"blocks.{j}.mlp_channels.fc1.weight" for j in range(4)} <= changed
    assert {"stem.stem.proj.weight", "neck.weight"} <= changed


def test_table2_counts_of_a_fully_fine_tuned_group_run_are_the_whole_models():
    from fedtune_app.tools.config_info import parameter_table
    from test_heterotune import TWO_GROUPS

    rows = parameter_table(resolve_config({**TWO_GROUPS, "method": "homo",
                                           "client-trains": "full"}))
    # group 0, ViT d=16, 2 blocks (test_heterotune's Table 2 count): patch conv 4*16+16, cls
    # 16, pos (16+1)*16, per block 2 norms 2*32, qkv 16*48+48, proj 16*16+16, fc1 16*64+64,
    # fc2 64*16+16; final norm 32; head 170
    block = 64 + 816 + 272 + 1088 + 1040
    whole = 80 + 16 + 272 + 2 * block + 32 + 170
    assert rows[0]["model-params"] == rows[0]["trainable-params"] == whole
    assert all(r["received-params"] == r["trainable-params"] == r["model-params"] for r in rows)
    assert [r["reduction-%"] for r in rows] == [0.0, 0.0]


def test_flexifed_full_shares_the_common_blocks_whole_weights_across_groups(tmp_path):
    """Two groups of one width, depths 2 and 3: the whole weights of blocks 0-1 are one class,
    their value the example-weighted mean over all 4 clients; a fully trained block moves."""
    from floats import assert_rounded_mean
    from test_comparators import SAME_WIDTH, results, run_recording

    folder, _, replies, cfg = run_recording({**SAME_WIDTH, "method": "flexifed",
                                             "client-trains": "full"}, tmp_path)
    metrics, state = results(folder)
    assert [m["round"] for m in metrics] == [1, 2] and not any(m["rejected"] for m in metrics)
    name = "groups.0.blocks.1.attn.qkv.weight"
    twin = name.replace("groups.0.", "groups.1.", 1)
    np.testing.assert_array_equal(state[name], state[twin])
    sent = [(t[n], k) for t, k in replies[2] for n in (name, twin) if n in t]
    assert len(sent) == 4
    assert_rounded_mean(state[name], *zip(*sent))
    # the deeper group's block 2 is its own, and trained away from its initial weights
    model, recipe = build_global(cfg)
    start = recipe.initial_state(model, cfg.seed)
    assert not np.array_equal(start["groups.1.blocks.2.attn.qkv.weight"],
                              state["groups.1.blocks.2.attn.qkv.weight"])


def test_feddf_full_distils_into_the_whole_weights(tmp_path):
    from test_comparators import TWO_GROUPS, results, run_recording

    folder, _, replies, _ = run_recording({**TWO_GROUPS, "method": "feddf", "feddf-steps": 7,
                                           "client-trains": "full", "feddf-val-fraction": 0},
                                          tmp_path)
    metrics, state = results(folder)
    assert [m["round"] for m in metrics] == [1, 2] and not any(m["rejected"] for m in metrics)
    # the state is the distilled one, not the plain group mean of the last replies
    name = "groups.0.blocks.0.mlp.fc1.weight"
    sent = [(t[name], k) for t, k in replies[2] if name in t]
    mean = sum(v.astype(np.float64) * k for v, k in sent) / sum(k for _, k in sent)
    assert len(sent) == 2 and not np.allclose(state[name], mean)


def test_export_refuses_a_fully_fine_tuned_run(tmp_path):
    from fedtune_app.tools.export import export_group

    cfg = smoke(method="all-large", **{"client-trains": "full"})
    with pytest.raises(ConfigError, match="'client-trains' = 'full'"):
        export_group(cfg, {}, tmp_path, False, [str(c) for c in range(10)])
