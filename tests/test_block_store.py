"""Capacity-true clients: a client's model holds only its plan's frozen blocks, read by name
from the node's layered checkpoint, and computes exactly what the whole model computes."""

import dataclasses

import pytest
import torch

from fedtune_app.config import ConfigError
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, trainable_parameters
from fedtune_app.model.backbones import ModelSpec, build_backbone
from fedtune_app.model.block_store import (
    build_on_demand,
    check_memory,
    checkpoint_path,
    frozen_bytes,
    hold_blocks,
    layered_checkpoint,
    resident_weight_bytes,
)

# 12 blocks of width 32 (MLP 128), 8x8 one-channel images in 2x2 patches, 10 classes
VIT12 = ModelSpec("vit_tiny_patch16_224", "random",
                  "img_size=8,patch_size=2,in_chans=1,embed_dim=32,depth=12,num_heads=2", 3, 10)
# per block: norm1 2*32 + qkv 32*96+96 + proj 32*32+32 + norm2 2*32 + fc1 32*128+128
#            + fc2 128*32+32 = 12,704 float32 parameters
BLOCK_BYTES = 4 * 12_704
# outside the blocks: cls token 32 + positions (16+1)*32 + patch conv 4*32+32 + final norm
#                     2*32 + head 32*10+10 = 1,130 float32 parameters
SHARED_BYTES = 4 * 1_130


def held_frozen(model) -> set[str]:
    """Names of the frozen backbone tensors the model has storage for."""
    return {n for n, t in list(model.named_parameters()) + list(model.named_buffers())
            if not t.is_meta and n not in trainable_parameters(model)}


def test_plan_2_7_holds_exactly_those_blocks_and_matches_the_whole_model(tmp_path):
    whole = build_backbone(VIT12)
    client = build_on_demand(VIT12, tmp_path, "cpu")
    assert resident_weight_bytes(client) == SHARED_BYTES
    assert resident_weight_bytes(whole) == SHARED_BYTES + 12 * BLOCK_BYTES
    hold_blocks(client, (2, 7))
    assert resident_weight_bytes(client) == SHARED_BYTES + 2 * BLOCK_BYTES
    assert {n.split(".")[1] for n in held_frozen(client) if n.startswith("blocks.")} == {"2", "7"}
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(client(x, plan=(2, 7)), whole(x, plan=(2, 7)))


def test_a_new_plan_loads_new_blocks_drops_the_others_and_reuses_the_kept_one(tmp_path):
    whole = build_backbone(VIT12)
    client = build_on_demand(VIT12, tmp_path, "cpu")
    hold_blocks(client, (2, 7))
    kept = client.blocks[7].mlp.fc2.weight
    hold_blocks(client, (0, 7, 11))  # FedRA's next round
    assert client.blocks[7].mlp.fc2.weight is kept
    assert client.blocks[2].mlp.fc2.weight.is_meta
    assert resident_weight_bytes(client) == SHARED_BYTES + 3 * BLOCK_BYTES
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(client(x, plan=(0, 7, 11)), whole(x, plan=(0, 7, 11)))


def test_adapters_on_held_blocks_train_as_on_the_whole_model(tmp_path):
    """LoRA attached to the skeleton (its base layers not held yet) works once the block is
    held: same outputs, same gradients as on the whole model with the same adapter values."""
    spec = AdapterSpec(dropout=0.0)
    whole = attach_adapters(build_backbone(VIT12), spec)
    client = attach_adapters(build_on_demand(VIT12, tmp_path, "cpu"), spec)
    hold_blocks(client, (3, 4))
    ours, theirs = trainable_parameters(client), trainable_parameters(whole)
    assert set(ours) == set(theirs)
    with torch.no_grad():
        for name, p in theirs.items():
            p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
            ours[name].copy_(p)
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    for model in (whole, client):
        model(x, plan=(3, 4)).square().sum().backward()
    for name in ("blocks.3.mlp.fc2.lora_A.weight", "blocks.4.mlp.fc2.lora_B.weight", "head.weight"):
        assert torch.equal(ours[name].grad, theirs[name].grad)


def test_seeded_random_init_is_the_same_whole_or_block_by_block_on_two_nodes(tmp_path):
    whole = build_backbone(VIT12).state_dict()
    nodes = [build_on_demand(VIT12, tmp_path / f"node{i}", "cpu") for i in range(2)]
    for j in range(12):
        for node in nodes:
            hold_blocks(node, (j,))  # one block at a time
            for name, tensor in node.blocks[j].state_dict().items():
                assert torch.equal(tensor, whole[f"blocks.{j}.{name}"])
    for name, tensor in nodes[0].stem.state_dict().items():
        assert torch.equal(tensor, whole[f"stem.{name}"])


def test_text_encoder_from_a_local_checkpoint_holds_only_planned_layers(tiny_bert_dir,
                                                                        tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(5)
    AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(tiny_bert_dir, num_labels=4)).save_pretrained(tmp_path / "hf")
    spec = ModelSpec("tiny-bert", str(tmp_path / "hf"), num_classes=4)
    whole = build_backbone(spec)
    client = build_on_demand(spec, tmp_path, "cpu")
    hold_blocks(client, (0, 2))
    assert {n.split(".")[1] for n in held_frozen(client) if n.startswith("blocks.")} == {"0", "2"}
    ids = torch.randint(0, 100, (3, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        assert torch.equal(client(inputs, plan=(0, 2)), whole(inputs, plan=(0, 2)))


def test_cache_is_written_once_and_keyed_by_the_spec(tmp_path):
    path = layered_checkpoint(VIT12, tmp_path)
    stamp = path.stat().st_mtime_ns
    assert layered_checkpoint(VIT12, tmp_path).stat().st_mtime_ns == stamp
    other = dataclasses.replace(VIT12, seed=4)
    assert checkpoint_path(other, tmp_path) != path


def test_truncated_checkpoint_names_the_file(tmp_path):
    path = layered_checkpoint(VIT12, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=str(path)):
        hold_blocks(build_on_demand(VIT12, tmp_path, "cpu"), (2, 7))


def test_checkpoint_gone_between_rounds_names_the_file(tmp_path):
    client = build_on_demand(VIT12, tmp_path, "cpu")
    hold_blocks(client, (2,))
    path = client.block_store.path
    path.unlink()
    with pytest.raises(ConfigError, match=f"{path}.*missing"):
        hold_blocks(client, (3,))


def test_missing_model_source_file_names_it(tmp_path):
    gone = tmp_path / "nowhere.safetensors"
    with pytest.raises(ConfigError, match=str(gone)):
        build_on_demand(dataclasses.replace(VIT12, source=str(gone)), tmp_path, "cpu")


def test_memory_knob_says_how_many_blocks_fit():
    shared, blocks = frozen_bytes(VIT12)
    assert (shared, blocks) == (SHARED_BYTES, [BLOCK_BYTES] * 12)
    # 1 MB = 1,048,576 bytes: 4,520 + 20 x 50,816 fit, 21 would not; 12 blocks need 614,312
    check_memory(VIT12, 12, 1)
    small = dataclasses.replace(VIT12, args=VIT12.args.replace("embed_dim=32", "embed_dim=128"))
    shared, blocks = frozen_bytes(small)
    fits = (2**20 - shared) // blocks[0]
    # 17,960 + 793,088 bytes (one width-128 block of 198,272 floats) fit in 1 MB; two do not
    assert fits == 1
    check_memory(small, 1, 1)
    with pytest.raises(ConfigError, match=r"memory-mb=1 cannot hold capacity=3 .* "
                                          r"declare capacity=1 or less"):
        check_memory(small, 3, 1)


def test_node_declaring_too_little_memory_fails_the_start_up_query(tmp_path):
    """Capacity 3 of a 12-block width-128 ViT needs 17,960 + 3 x 793,088 bytes (2.3 MB): a
    node declaring memory-mb=1 is refused at the start-up query, naming the knob."""
    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.server import run_federation
    from fedtune_app.methods import resolve_config
    from inprocess import InProcessGrid

    rc = {"preset": "smoke", "model": VIT12.name, "model-source": "random",
          "model-args": VIT12.args.replace("embed_dim=32", "embed_dim=128"),
          "capacities": "3,1", "num-server-rounds": 1, "results-dir": str(tmp_path),
          "checkpoint-dir": str(tmp_path / "cache")}
    nodes = [{"partition-id": 0, "num-partitions": 2, "capacity": 3, "memory-mb": 1},
             {"partition-id": 1, "num-partitions": 2, "capacity": 1, "memory-mb": 1}]
    with pytest.raises(RuntimeError, match=r"memory-mb=1 cannot hold capacity=3"):
        run_federation(InProcessGrid(client_app, nodes, rc), resolve_config(rc))


def test_a_decoder_family_plugs_in_unchanged(tmp_path):
    """A Llama-style decoder (rotary frequencies are a non-persistent buffer of its stem) holds
    only its planned layers and matches the whole model bit for bit."""
    from test_decoders import save_decoder

    spec = ModelSpec(save_decoder(tmp_path / "llama", layers=4), "random", "", 3, 2)
    whole = build_backbone(spec)
    client = build_on_demand(spec, tmp_path / "cache", "cpu")
    hold_blocks(client, (1, 3))
    assert {n.split(".")[1] for n in held_frozen(client) if n.startswith("blocks.")} == {"1", "3"}
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(4))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        assert torch.equal(client(inputs, plan=(1, 3)), whole(inputs, plan=(1, 3)))
