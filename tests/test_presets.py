"""Every conf/ preset validates; paper presets whose data is absent fail with a clear message;
the offline presets run one round end to end in-process (sizes overridden to keep it fast)."""

import json
import re
from pathlib import Path

import pytest
import torch

from fedtune_app.config import CONF_DIR, ConfigError
from fedtune_app.data.groups import node_model_group
from fedtune_app.data.scenarios import check_scenario, client_capacities, num_clients
from fedtune_app.data.splits import domain_list, run_splits
from fedtune_app.methods import resolve_config
from fedtune_app.model.backbones import ModelSpec, build_backbone
from fedtune_app.tools.pretrain import MODELS, pretrain
from inprocess import InProcessGrid, simulation_nodes

PRESETS = sorted(p.stem for p in CONF_DIR.glob("*.toml"))
OFFLINE = [p for p in PRESETS if p.startswith("offline-")]
PAPER = [p for p in PRESETS if p.split("-")[0] in ("fedra", "fedbrick", "heterotune")]


def test_there_is_a_preset_per_paper_experiment():
    for table in range(1, 7):
        assert any(p.startswith(f"fedra-t{table}-") for p in PAPER), table
    for prefix in ("fedbrick-t1-", "fedbrick-t2-", "heterotune-t1-", "heterotune-t5-"):
        assert any(p.startswith(prefix) for p in PAPER), prefix


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_validates(name):
    cfg = resolve_config({"preset": name})
    domains = domain_list(cfg.data)
    check_scenario(cfg, None if domains is None else len(domains))
    capacities = client_capacities(cfg)
    assert len(capacities) == num_clients(cfg) and min(capacities) >= 1


def test_paper_scenarios_have_the_papers_numbers():
    caps = {p: client_capacities(resolve_config({"preset": p})) for p in PAPER}
    assert caps["fedra-t1-domainnet"] == [12, 10, 8, 6, 4, 3]
    assert caps["fedra-t2-nico"] == [12] * 5 + [10] * 5 + [8] * 5 + [6] * 5 + [4] * 5 + [3] * 5
    assert caps["fedra-t3-nico-4"] == [4] * 6
    assert caps["fedra-t3-nico-mixed"] == [10, 10, 6, 6, 4, 4]
    assert caps["fedbrick-t1-nico"] == [12, 10, 8, 6, 5, 4]
    hetero = resolve_config({"preset": "heterotune-t1-cifar10"})  # ViT-T/S/B/L in 3:3:2:2
    groups = [node_model_group(hetero, pid, 100, 1) for pid in range(100)]
    assert len(caps["heterotune-t1-cifar10"]) == 100
    assert [groups.count(g) for g in range(4)] == [30, 30, 20, 20]
    assert resolve_config({"preset": "fedra-t4-nico-dynamic"}).federation.dynamic_capacities


def test_mpnet_presets_have_the_papers_shapes_at_their_depth():
    caps = {p: client_capacities(resolve_config({"preset": p}))
            for p in PRESETS if p.startswith("mpnet-")}
    assert caps["mpnet-fedra-t1-bbc"] == [12, 10, 8, 6, 4, 3]
    assert caps["mpnet-fedra-t3-bbc-4"] == caps["mpnet-fedbrick-t2-bbc-4"] == [4] * 6
    assert caps["mpnet-fedra-t3-bbc-6"] == caps["mpnet-fedbrick-t2-bbc-6"] == [6] * 6
    assert caps["mpnet-fedra-t3-bbc-mixed"] == [10, 10, 6, 6, 4, 4]
    dynamic = resolve_config({"preset": "mpnet-fedra-t4-bbc-dynamic"})
    assert caps["mpnet-fedra-t4-bbc-dynamic"] == [12] * 6 and dynamic.federation.dynamic_capacities
    groups = resolve_config({"preset": "mpnet-groups-bbc"})
    assert groups.model.model_groups == "all-MiniLM-L6-v2;all-mpnet-base-v2"
    for name in caps:
        cfg = resolve_config({"preset": name})
        assert (cfg.data.dataset, cfg.model.model) == ("bbc-news", "all-mpnet-base-v2")


@pytest.mark.parametrize("name", [p for p in PAPER if "domainnet" in p or "nico" in p][:2]
                         + [p for p in PAPER if "heterotune" in p][:1])
def test_paper_presets_without_their_data_fail_clearly(name):
    cfg = resolve_config({"preset": name})
    if cfg.data.dataset == "hf":
        message = "'hf-dataset' = 'uoft-cs/cifar10' could not be read"
    else:
        if Path(cfg.data.data_dir).expanduser().is_dir():
            pytest.skip(f"{cfg.data.data_dir} exists on this machine")
        message = re.escape(f"dataset '{cfg.data.dataset}': 'data-dir' = ") + ".* is not a folder"
    with pytest.raises(ConfigError, match=message):
        run_splits(cfg)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny real checkpoints of the offline backbones (one optimiser step on 64 digits)."""
    folder = tmp_path_factory.mktemp("ckpt")
    return {family: pretrain(family, folder / f"{family}.safetensors", dataset="digits",
                             train_size=64, epochs=1, progress=False, device="cpu",
                             probe=family == "vit")["path"]
            for family in MODELS}


def test_pretrained_checkpoint_records_how_it_was_made(checkpoints):
    from safetensors import safe_open

    with safe_open(checkpoints["vit"], "pt") as f:
        meta = f.metadata()
    assert meta["dataset"] == "digits" and meta["epochs"] == "1"
    assert meta["model-args"] == MODELS["vit"][1]
    # 1,797 digits, 20% held out per class, 64 of the rest kept
    assert meta["train-examples"] == "64"
    # the probe's accuracy is k / n for a whole k over the n six-style digits of its validation
    # part (written to 4 places; 1 / n > 0.0001 pins k down) and above chance (10 classes):
    # 287 of the 1,438 training digits of each style (test_validation_split), never the test set
    n = 6 * 287
    probe = meta["digit-styles-probe-accuracy"]
    assert [k for k in range(n + 1) if f"{k / n:.4f}" == probe], (probe, n)
    assert float(probe) > 1 / 10, probe


def test_pretrained_checkpoint_is_what_the_backbone_loads(checkpoints):
    from safetensors.torch import load_file

    saved = load_file(checkpoints["vit"])
    name, args = MODELS["vit"]
    model = build_backbone(ModelSpec(name, checkpoints["vit"], args, 0, 5))
    assert torch.equal(model.blocks[5].mlp.fc2.weight, saved["blocks.5.mlp.fc2.weight"])
    assert torch.equal(model.stem.patch_embed.proj.weight, saved["patch_embed.proj.weight"])
    assert model.head.weight.shape == (5, 32)  # a new head for the new task


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_preset_runs_one_round(name, checkpoints, tmp_path):
    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.server import run_federation

    preset = resolve_config({"preset": name})
    rc = {"preset": name, "results-dir": str(tmp_path), "num-server-rounds": 1,
          "test-subset": 60}
    if preset.data.dataset == "bbc-news":
        rc |= {"train-subset": 400, "min-partition-size": 2, "max-length": 24}
    if preset.data.dataset == "multi-domain-digits":
        family = "mixer" if "mixer" in preset.model.model else "vit"
        rc |= {"model-source": checkpoints[family], "train-subset": 180 if "label" not in name
               else 600, "min-partition-size": 3}
    cfg = resolve_config(rc)
    folder = run_federation(InProcessGrid(client_app, simulation_nodes(num_clients(cfg)), rc), cfg)
    record = json.loads((Path(folder) / "metrics.json").read_text())[0]
    clients = json.loads((Path(folder) / "config.json").read_text())["clients"]
    groups = record["accuracy-per-group"]
    if cfg.data.dataset == "multi-domain-digits":
        # 60 test images stratified by (domain, class): 10 per domain, so the overall accuracy
        # is the mean of the six per-domain accuracies
        assert list(groups) == list(domain_list(cfg.data))
        assert record["accuracy"] == pytest.approx(sum(groups.values()) / 6)
        assert {c["group"] for c in clients} == set(groups)
    else:
        assert set(groups) == {f"client-{c['partition_id']}" for c in clients}
    allocation = json.loads((Path(folder) / "allocation.json").read_text())[0]
    held = [sum(row) for row in allocation["matrix"]]
    declared = {c["partition_id"]: c["capacity"] for c in clients}
    for pid, count in zip(allocation["clients"], held):
        assert 1 <= count <= declared[pid]
        if not cfg.federation.dynamic_capacities:
            assert count == declared[pid]
    assert (Path(folder) / "partition.png").stat().st_size > 10_000


def test_twelve_block_stand_ins_load_with_their_widths(checkpoints):
    from safetensors import safe_open
    from safetensors.torch import load_file

    for family, width, depth in (("vit12", 64, 12), ("vit12-s", 32, 12), ("vit12-t", 16, 12),
                                 ("vit12-t8", 8, 12), ("vit24-l", 48, 24)):
        name, args = MODELS[family]
        model = build_backbone(ModelSpec(name, checkpoints[family], args, 0, 10))
        saved = load_file(checkpoints[family])
        last = f"blocks.{depth - 1}.mlp.fc2.weight"
        assert model.num_blocks == depth
        assert torch.equal(model.blocks[depth - 1].mlp.fc2.weight, saved[last])
        assert model.blocks[depth - 1].attn.qkv.weight.shape == (3 * width, width)
        assert model.head.weight.shape == (10, width)  # the pretraining head (10 digits) kept
        with safe_open(checkpoints[family], "pt") as f:
            meta = f.metadata()
        # the recipe's augmentation applies unless the call says otherwise; one epoch as asked
        assert meta["augment"] == "true" and meta["epochs"] == "1" and meta["seed"] == "0"
        assert meta["styles"] == "true"  # the mini recipe's renderings


def test_augmentation_is_seeded_and_fills_with_background():
    from fedtune_app.tools.pretrain import augment

    background = -torch.ones(4, 3, 16, 16)
    assert torch.allclose(augment(background, torch.Generator().manual_seed(1)), background,
                          atol=1e-6)  # an empty image stays empty wherever it moves
    x = torch.rand(4, 3, 16, 16) * 2 - 1
    a = augment(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, augment(x, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, augment(x, torch.Generator().manual_seed(2)))
    assert a.min() >= -1 - 1e-6 and a.max() <= 1 + 1e-6  # bilinear mixes of [-1, 1] values


def test_renderings_are_seeded_and_touch_the_expected_share_of_images():
    from fedtune_app.tools.pretrain import augment_styles

    x = torch.rand(4000, 3, 16, 16) * 2 - 1  # no image equals any of its renderings
    a = augment_styles(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, augment_styles(x, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, augment_styles(x, torch.Generator().manual_seed(2)))
    assert a.min() >= -1 and a.max() <= 1
    # five independent renderings at 1/4 each: 1 - (3/4)^5 = 0.763 of the images change;
    # binomial sd on 4000 images 0.0067, so 5 sd = 0.034
    changed = (a != x).flatten(1).any(1).float().mean().item()
    assert abs(changed - (1 - 0.75 ** 5)) < 0.034


def test_mixer_checkpoint_loads_through_the_class_fallback(checkpoints):
    from safetensors.torch import load_file

    saved = load_file(checkpoints["mixer"])
    name, args = MODELS["mixer"]
    model = build_backbone(ModelSpec(name, checkpoints["mixer"], args, 0, 4))
    assert torch.equal(model.blocks[4].mlp_channels.fc2.weight,
                       saved["blocks.4.mlp_channels.fc2.weight"])
    assert model.head.weight.shape == (4, 32)


@pytest.mark.parametrize("table, rounds", [("t1", 100), ("t2", 150)])
@pytest.mark.parametrize("data", ["nico", "domainnet"])
def test_official_code_presets_differ_from_the_paper_text_only_by_its_keys(table, rounds, data):
    paper = resolve_config({"preset": f"fedra-{table}-{data}"})
    official = resolve_config({"preset": f"fedra-{table}-{data}-official"})
    changed = {k for k in paper.flat if k != "preset" and paper.flat[k] != official.flat[k]}
    expected = {"fedra-repo-batch-cap", "fedra-repo-unweighted", "inclusivefl-aggregation",
                "screen-updates"} | ({"num-server-rounds"} if rounds != 100 else set())
    assert changed == expected
    assert (official.training.fedra_repo_batch_cap, official.federation.fedra_repo_unweighted,
            official.flat["inclusivefl-aggregation"], official.robust.screen_updates,
            official.federation.num_server_rounds, official.flat["depthfl-headline"]) == \
        (True, True, "mean", False, rounds, "last-exit")
    assert paper.federation.num_server_rounds == 100  # the paper's text: "100 rounds"
