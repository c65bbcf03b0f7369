"""A node that has to build the whole backbone once (to write its layered checkpoint) says so
before it does, with the peak and the publish command that avoids it; a node whose config says
``build-whole-model=false`` refuses at the start-up query instead. In process, with deployment
node configs (each node declares its capacity)."""

import logging
import shlex

import pytest

from fedtune_app.apps.client import publish_command
from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.server import run_federation
from fedtune_app.config import ConfigError
from fedtune_app.data.splits import run_num_classes
from fedtune_app.federated.flower_private import parse_config_args
from fedtune_app.methods import resolve_config
from fedtune_app.model.backbones import ModelSpec
from fedtune_app.model.block_store import allows_whole_model, checkpoint_path
from inprocess import InProcessGrid

# a 12-block ViT of width 128 (MLP 512) on 8x8 one-channel images in 2x2 patches, 10 classes:
# per block norm1 256 + qkv 128*384+384 + proj 128*128+128 + norm2 256 + fc1 128*512+512
#           + fc2 512*128+128 = 198,272 float32 parameters = 793,088 bytes (774.5 KB);
# outside: cls 128 + positions 17*128 + patch conv 4*128+128 + norm 256 + head 128*10+10
#          = 4,490 parameters = 17,960 bytes (17.5 KB); whole: 17,960 + 12 x 793,088
#          = 9,535,016 bytes (9.1 MB)
ARGS = "img_size=8,patch_size=2,in_chans=1,embed_dim=128,depth=12,num_heads=2"


def keys(tmp_path):
    return {"preset": "smoke", "model": "vit_tiny_patch16_224", "model-source": "random",
            "model-args": ARGS, "capacities": "3,1", "num-server-rounds": 1,
            "results-dir": str(tmp_path / "results"), "checkpoint-dir": str(tmp_path / "cache")}


def nodes(**extra):
    return [{"partition-id": 0, "num-partitions": 2, "capacity": 3, **extra},
            {"partition-id": 1, "num-partitions": 2, "capacity": 1, **extra}]


def layered_file(rc):
    cfg = resolve_config(rc)
    return checkpoint_path(ModelSpec.from_config(cfg.model, run_num_classes(cfg)),
                           cfg.model.checkpoint_dir)


class Said(logging.Handler):
    """fedtune's log records, each with whether the layered checkpoint existed then."""

    def __init__(self, path):
        super().__init__(logging.INFO)
        self.path, self.records = path, []

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage(), self.path.is_file()))


@pytest.fixture
def said(tmp_path):
    logger = logging.getLogger("fedtune")
    handler = Said(layered_file(keys(tmp_path)))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_node_says_before_it_builds_the_whole_model_what_it_needs_and_how_to_avoid_it(
        tmp_path, said):
    rc = keys(tmp_path)
    run_federation(InProcessGrid(client_app, nodes(), rc), resolve_config(rc))
    warnings = [(m, existed) for level, m, existed in said.records if level == logging.WARNING]
    assert len(warnings) == 1  # the first node builds; the second reads the same file
    message, existed = warnings[0]
    assert not existed  # said BEFORE the file was written
    assert said.path.is_file()
    assert "building the WHOLE backbone 'vit_tiny_patch16_224' once" in message
    assert "at least 9.1 MB of frozen weights" in message
    assert "needs only 17.5 KB + up to 774.5 KB per held block" in message
    assert publish_command(resolve_config(rc)) in message
    assert "build-whole-model=false" in message


def test_a_node_that_may_not_build_it_refuses_at_the_start_up_query(tmp_path, said):
    rc = keys(tmp_path)
    grid = InProcessGrid(client_app, nodes(**{"build-whole-model": False}), rc)
    with pytest.raises(RuntimeError, match=r"node config build-whole-model=false: this node has "
                                           r"no layered checkpoint of 'vit_tiny_patch16_224' .* "
                                           r"\(9\.1 MB of frozen weights\).*fedtune "
                                           r"publish-layered --run-config"):
        run_federation(grid, resolve_config(rc))
    assert not said.path.exists()  # nothing built
    assert {m.metadata.message_type for m in grid.sent} == {"query"}  # no training asked
    assert not [r for r in said.records if r[0] == logging.WARNING]


def test_a_node_that_may_not_build_it_trains_from_a_layered_checkpoint_it_already_has(
        tmp_path, said):
    rc = keys(tmp_path)
    run_federation(InProcessGrid(client_app, nodes(), rc), resolve_config(rc))  # writes it
    said.records.clear()
    rc["results-dir"] = str(tmp_path / "second")
    folder = run_federation(InProcessGrid(client_app, nodes(**{"build-whole-model": "false"}),
                                          rc), resolve_config(rc))
    assert (tmp_path / "second").is_dir() and folder
    assert not [r for r in said.records if r[0] == logging.WARNING]


def test_the_suggested_publish_command_names_the_runs_backbone(tmp_path):
    cfg = resolve_config(keys(tmp_path) | {"model-seed": 3})
    words = shlex.split(publish_command(cfg))
    assert words[:3] == ["fedtune", "publish-layered", "--run-config"]
    published = resolve_config(parse_config_args([words[3]]))
    assert ModelSpec.from_config(published.model, run_num_classes(published)) == \
        ModelSpec.from_config(cfg.model, run_num_classes(cfg))


@pytest.mark.parametrize("value, allowed", [(True, True), (False, False), ("false", False),
                                            ("True", True)])
def test_the_node_config_key_takes_booleans(value, allowed):
    assert allows_whole_model({"build-whole-model": value}) is allowed
    assert allows_whole_model({}) is True


@pytest.mark.parametrize("value", ["no", 0, "1"])
def test_the_node_config_key_refuses_other_values(value):
    with pytest.raises(ConfigError, match=r"node config build-whole-model=.* is not a boolean; "
                                          r"allowed: true, false"):
        allows_whole_model({"build-whole-model": value})
