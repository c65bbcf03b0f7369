"""Pretrain a small timm ViT or MLP-Mixer centrally and save a checkpoint for offline runs.

No pretrained vision transformer can be downloaded here, so the offline vision presets load a
checkpoint made by this command instead of ImageNet weights: an honest stand-in that gives the
frozen backbone real, transferable features (Fashion-MNIST clothing -> digit styles), so the
federated methods can be compared offline. It is NOT ImageNet pretraining; results on it are not
comparable with the papers' numbers.

    python -m fedtune_app.tools.pretrain --family vit    # ~/.cache/fedtune/vit-fmnist16.safetensors
    python -m fedtune_app.tools.pretrain --family vit64  # wider (dim 64) ViT for model-size groups
    python -m fedtune_app.tools.pretrain --family mixer  # .../mixer-fmnist16.safetensors

It trains the whole model on Fashion-MNIST (Debian dataset-fashion-mnist; the UCI digits when
it is absent, say so with --dataset digits) resized to 16x16 and repeated to 3 channels, prints
test accuracy and a linear probe of the frozen features on the six digit styles (how well the
stand-in transfers to the offline federated task), and writes a safetensors state dict that timm
loads with ``pretrained_cfg_overlay=dict(file=...)`` (our ``model-source=<file>``).

The ``mini`` claims tier's backbones are 12-block ViTs, the papers' depth in miniature, and are a
STAND-IN FOR IMAGENET WEIGHTS, nothing more:

    python -m fedtune_app.tools.pretrain --family vit12     # ViT-B in miniature: width 64
    python -m fedtune_app.tools.pretrain --family vit12-s   # ViT-S in miniature: width 32
    python -m fedtune_app.tools.pretrain --family vit12-t   # ViT-T in miniature: width 16

(ViT-T/S/B's widths 192/384/768 divided by 12, head width 16 as theirs is 64 / 4; 16x16 RGB
inputs in 4x4 patches: 16 tokens and a class token). Their recipe (``RECIPES``, the defaults of
these families): Fashion-MNIST's 60,000 training images together with the 4,000 training
images of MNIST-5k (labels 10-19: 20 classes, as ImageNet holds the classes of NICO++ and
DomainNet; the federated task is a different digit set, the UCI digits, in six styles), random
affine augmentation (rotation, scale, shift) and random renderings of the kinds the six styles
use (``augment_styles``: quarter turns, inversion, noise, blockiness, colours; ImageNet weights
have likewise seen photographs in many renderings), 10 epochs at batch 256, AdamW (lr 3e-3,
one-cycle schedule), seed 0. On one CPU core: about 16 minutes (vit12), 6 (vit12-s), 3
(vit12-t). The linear probe on the styles' validation digits after 3 / 6 / 12 blocks: vit12
0.42 / 0.60 / 0.76, vit12-s 0.35 / 0.47 / 0.64, vit12-t 0.26 / 0.34 / 0.47 (affine only:
0.51 / 0.56 / 0.58 for vit12). The
command is deterministic for a seed on one machine, not across CPUs; the file goes to
``~/.cache/fedtune``. The files the claims' confirmatory records load are committed in
docs/claims/backbones/ (a few MB) and restored into the cache when a run finds its file missing,
so a campaign resumed on another machine fine-tunes the same backbone. ``--probe-depths``
reports the linear probe of the features after the first k blocks (what a client holding k
blocks starts from), on a validation part of the six styles' training digits: never their test
set.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

# the offline presets' backbones: 6 blocks (half of ViT-B/Mixer-B), tiny width, 16x16 inputs
MODELS = {
    "vit": ("vit_tiny_patch16_224",
            "img_size=16,patch_size=4,in_chans=3,embed_dim=32,depth=6,num_heads=2"),
    "vit64": ("vit_tiny_patch16_224",
              "img_size=16,patch_size=4,in_chans=3,embed_dim=64,depth=6,num_heads=4"),
    "mixer": ("mixer_s16_224", "img_size=16,patch_size=4,in_chans=3,embed_dim=32,num_blocks=6"),
    # the mini tier: 12 blocks (the papers' depth), widths of ViT-B/S/T over 12
    "vit12": ("vit_tiny_patch16_224",
              "img_size=16,patch_size=4,in_chans=3,embed_dim=64,depth=12,num_heads=4"),
    "vit12-s": ("vit_tiny_patch16_224",
                "img_size=16,patch_size=4,in_chans=3,embed_dim=32,depth=12,num_heads=2"),
    "vit12-t": ("vit_tiny_patch16_224",
                "img_size=16,patch_size=4,in_chans=3,embed_dim=16,depth=12,num_heads=1"),
    # HeteroTune's four sizes in miniature, first calibration (ViT-T/S/B/L's widths
    # 192/384/768/1024 over 24, L rounded up to whole heads of 16; L keeps its 24 blocks):
    # widths 8, 16 (vit12-t), 32 (vit12-s) and 48; recalibrated: 16, 24, 32 and 48
    "vit12-t8": ("vit_tiny_patch16_224",
                 "img_size=16,patch_size=4,in_chans=3,embed_dim=8,depth=12,num_heads=1"),
    "vit24-l": ("vit_tiny_patch16_224",
                "img_size=16,patch_size=4,in_chans=3,embed_dim=48,depth=24,num_heads=3"),
    # the pooled setting's recalibrated ViT-S (docs/claims/calibration-mini.md): width 24, two
    # heads of 12, between ViT-T's 16 and ViT-B's 32
    "vit12-t24": ("vit_tiny_patch16_224",
                  "img_size=16,patch_size=4,in_chans=3,embed_dim=24,depth=12,num_heads=2"),
}
# a family's defaults where they differ from the command's (the mini tier's recipe)
MINI_RECIPE = {"dataset": "fashion-mnist+mnist-5k", "epochs": 10, "augment": True,
               "styles": True, "batch_size": 256}
RECIPES = {family: MINI_RECIPE for family in ("vit12", "vit12-s", "vit12-t", "vit12-t8", "vit24-l",
                                              "vit12-t24")}
DATASETS = ("fashion-mnist", "digits", "fashion-mnist+mnist-5k")
CACHE = Path("~/.cache/fedtune")
# the stand-ins the claims' records load, committed: pretraining is deterministic on one machine
# but not across CPUs (each rebuild elsewhere gave other files and runs up to 1.6 points apart),
# so a campaign that resumes on another machine restores these instead of pretraining again
COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "claims" / "backbones"


def default_checkpoint(family: str) -> Path:
    source = "fmnist-mnist" if RECIPES.get(family, {}).get("dataset") == DATASETS[2] else "fmnist"
    return CACHE / f"{family}-{source}16.safetensors"


def checkpoint_files(cfg) -> dict[str, Path]:
    """The local checkpoint files a run of ``cfg`` (a resolved ``RunConfig``) loads its
    backbones from, by 'model-source' (its model groups' own sources included); a checkpoint
    the run fetches ('checkpoint-url') is not local."""
    from fedtune_app.config import parse_groups

    if cfg.model.checkpoint_url:  # fetched into 'model-source' by every node
        cfg = cfg.replace(**{"model-source": "pretrained"})
    sources = [g["model-source"] for g in parse_groups(cfg.model)] or [cfg.model.model_source]
    return {s: Path(s).expanduser() for s in dict.fromkeys(sources)
            if s not in ("pretrained", "random")}


def checkpoint_digests(cfg) -> dict[str, str]:
    """{file name: the first 16 hex digits of its sha256} of the checkpoints a run of ``cfg``
    loads: a stand-in pretrained on another machine is not bit for bit the same file."""
    from fedtune_app.model.frozen_weights import sha256_of

    return {path.name: sha256_of(path)[:16]
            for path in checkpoint_files(cfg).values() if path.is_file()}


def missing_checkpoints(cfg) -> list[str]:
    """The local checkpoint files a run of ``cfg`` (a resolved ``RunConfig``) would stop on
    before its first round, each with the command that makes it where it is a family's file of
    this tool (the offline presets' stand-ins). 'model-source' is not one when the run fetches
    it ('checkpoint-url'); model groups' own 'model-group-sources' still are."""
    made_here = {default_checkpoint(f).expanduser(): f for f in MODELS}
    missing = []
    for source, path in checkpoint_files(cfg).items():
        if path.exists() or path in made_here and restore_committed(path):
            continue
        family = made_here.get(path)
        missing.append(f"{source}: no such checkpoint" + (
            f" (make it with `python -m fedtune_app.tools.pretrain --family {family} "
            "--no-probe --threads 1`)" if family else ""))
    return missing


def restore_committed(path: Path) -> bool:
    """Copy the committed stand-in of this name into ``path`` (the cache) if there is one."""
    import shutil

    committed = COMMITTED / path.name
    if not committed.is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(committed, path)
    print(f"{path}: restored from {committed} (the stand-in the claims' records load)")
    return True


def probe_features(model: nn.Module, x: torch.Tensor, depth: int | None = None) -> torch.Tensor:
    """Pooled features after the first ``depth`` blocks (all when None) and the final norm: what
    the head of a client holding those blocks sees before any fine-tuning."""
    blocks = model.blocks if depth is None else model.blocks[:depth]
    out = []
    for i in range(0, len(x), 1024):
        h = model.norm(blocks(_embed(model, x[i:i + 1024])))
        out.append(model.forward_head(h, pre_logits=True))
    return torch.cat(out)


def _embed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm ViT's embedding: patches, class token, positions (``forward_features`` less the
    blocks and the norm)."""
    x = model.patch_embed(x)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    return model.norm_pre(x)


def linear_probe(model: nn.Module, device: torch.device, seed: int = 0,
                 depths: tuple[int, ...] = ()) -> dict:
    """Accuracy of a logistic regression on the frozen pooled features of the six-style digits
    (the offline presets' and the mini tier's task): fitted on their training digits less a
    validation part (20% of every (style, class), ``validation_split``), scored on that part,
    never on the test digits. Keys: 'all' (every block) and each of ``depths`` (ViT only)."""
    from sklearn.linear_model import LogisticRegression

    from fedtune_app.data.sources import DIGIT_STYLES, multi_domain_digits
    from fedtune_app.data.splits import TEST_FRACTION, train_test_split, validation_split

    raw = multi_domain_digits(list(DIGIT_STYLES), 16)
    pool, _ = train_test_split(raw, TEST_FRACTION)
    fit, score = validation_split(pool, raw.domains * len(raw.classes) + raw.labels, 0.2)
    model.eval()
    out = {}
    with torch.inference_mode():
        x = raw.inputs.to(device)
        for depth in (None, *depths):
            if depth is None:
                feats = torch.cat([model.forward_head(model.forward_features(x[i:i + 1024]),
                                                      pre_logits=True)
                                   for i in range(0, len(x), 1024)])
            else:
                feats = probe_features(model, x, depth)
            feats = feats.float().cpu().numpy()
            probe = LogisticRegression(max_iter=2000, random_state=seed).fit(
                feats[fit], raw.labels[fit])
            out["all" if depth is None else depth] = float(probe.score(feats[score],
                                                                       raw.labels[score]))
    return out


def source_data(dataset: str, data_dir: str = ""):
    """(images (N, 1, 28|8, 28|8) in [-1, 1], labels, class names, train indices, test
    indices) of a pretraining source. fashion-mnist+mnist-5k: Fashion-MNIST's official split
    and MNIST-5k's digits split 80/20 per class (fixed seed), digits as classes 10-19."""
    from fedtune_app.data.sources import digits, fashion_mnist, mnist_5k
    from fedtune_app.data.splits import SPLIT_SEED, stratified_split

    if dataset == "digits":
        raw = digits()
        train, test = stratified_split(raw.labels, 0.2, SPLIT_SEED)
        return raw.inputs, raw.labels, raw.classes, train, test
    fashion = fashion_mnist(data_dir)
    train, test = fashion.split
    if dataset == "fashion-mnist":
        return fashion.inputs, fashion.labels, fashion.classes, train, test
    digits5k = mnist_5k()
    n = len(fashion.labels)
    d_train, d_test = stratified_split(digits5k.labels, 0.2, SPLIT_SEED)
    return (torch.cat([fashion.inputs, digits5k.inputs]),
            np.concatenate([fashion.labels, digits5k.labels + 10]),
            fashion.classes + [f"digit {c}" for c in digits5k.classes],
            np.concatenate([train, n + d_train]), np.concatenate([test, n + d_test]))


def augment(images: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random affine view of each image: rotation +-10 degrees, scale 0.9-1.1, shift up to 2
    of 16 pixels each way; the background (-1) fills in. Drawn from ``gen`` (seeded)."""
    n = len(images)
    angle = (torch.rand(n, generator=gen) * 2 - 1) * (10 * np.pi / 180)
    scale = 0.9 + 0.2 * torch.rand(n, generator=gen)
    shift = (torch.rand(n, 2, generator=gen) * 2 - 1) * 0.25  # 2 px of 16 = 0.25 of [-1, 1]
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1).to(images)
    grid = nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    out = nn.functional.grid_sample(images + 1, grid, align_corners=False)  # zeros outside
    return out - 1


def augment_styles(images: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random image transforms of the kinds the mini tier's domains apply, drawn per image and
    independently (each with probability 0.25): a quarter turn, inversion, Gaussian noise (sd
    0.5), 4x4 blockiness, random stroke and background colours. The source images are other
    images (Fashion-MNIST, MNIST), never the UCI digits: a stand-in for ImageNet weights, which
    have seen photographs in many renderings before meeting NICO++'s or DomainNet's domains."""
    n = len(images)
    pick = torch.rand(n, 5, generator=gen) < 0.25
    out = images.clone()
    turn = pick[:, 0]
    out[turn] = torch.rot90(out[turn], int(torch.randint(1, 4, (1,), generator=gen)), (2, 3))
    out[pick[:, 1]] = -out[pick[:, 1]]
    noise = pick[:, 2]
    out[noise] = (out[noise] + 0.5 * torch.randn(out[noise].shape, generator=gen)).clamp(-1, 1)
    block = pick[:, 3]
    out[block] = nn.functional.interpolate(nn.functional.adaptive_avg_pool2d(out[block], 4),
                                           size=out.shape[-2:], mode="nearest")
    colour = pick[:, 4]
    ink = (out[colour].mean(1, keepdim=True) + 1) / 2
    fg = torch.rand((int(colour.sum()), 3, 1, 1), generator=gen) * 2 - 1
    bg = torch.rand((int(colour.sum()), 3, 1, 1), generator=gen) * 2 - 1
    out[colour] = ink * fg + (1 - ink) * bg
    return out


def pretrain(family: str, out: Path, dataset: str | None = None, train_size: int = 0,
             epochs: int | None = None, batch_size: int | None = None, lr: float = 3e-3,
             seed: int = 0,
             data_dir: str = "", progress: bool = True, device: str = "auto",
             probe: bool = True, augment_images: bool | None = None,
             probe_depths: tuple[int, ...] = (), styles: bool | None = None) -> dict:
    """Train, evaluate, save; returns {'accuracy', 'seconds', 'path', ...}. ``dataset``,
    ``epochs``, ``batch_size`` and ``augment_images`` default to the family's recipe
    (``RECIPES``), else fashion-mnist, 10 epochs, batch 128, no augmentation."""
    import timm
    from safetensors.torch import save_file

    from fedtune_app.data.sources import prepare_images
    from fedtune_app.model.backbones import _timm_class

    recipe = RECIPES.get(family, {})
    dataset = dataset or recipe.get("dataset", "fashion-mnist")
    epochs = epochs or recipe.get("epochs", 10)
    batch_size = batch_size or recipe.get("batch_size", 128)
    augment_images = recipe.get("augment", False) if augment_images is None else augment_images
    augment_styles_too = recipe.get("styles", False) if styles is None else styles
    if dataset not in DATASETS:
        raise ValueError(f"pretraining data set {dataset!r}; allowed: {', '.join(DATASETS)}")
    started = time.perf_counter()
    inputs, raw_labels, classes, train_idx, test_idx = source_data(dataset, data_dir)
    rng = np.random.default_rng(seed)
    if train_size and train_size < len(train_idx):
        train_idx = np.sort(rng.choice(train_idx, size=train_size, replace=False))
    test_idx = test_idx[:2000] if dataset != DATASETS[2] else test_idx
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                       if device == "auto" else device)
    images = prepare_images(inputs, 16, 3).to(dev)
    labels = torch.from_numpy(raw_labels).to(dev)
    name, args = MODELS[family]
    kwargs = {k: int(v) for k, v in (a.split("=") for a in args.split(","))}
    torch.manual_seed(seed)
    try:
        model = timm.create_model(name, pretrained=False, num_classes=len(classes), **kwargs)
    except TypeError:  # the mixer entrypoint fixes patch_size: build from its class
        model = _timm_class(name)(num_classes=len(classes), **kwargs)
    model.to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    steps = epochs * int(np.ceil(len(train_idx) / batch_size))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps)
    gen = torch.Generator().manual_seed(seed)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, desc=f"pretrain {family} on {dataset}", unit="step")
    model.train()
    for _ in range(epochs):
        order = torch.from_numpy(train_idx)[torch.randperm(len(train_idx), generator=gen)].to(dev)
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            x = augment(images[batch], gen) if augment_images else images[batch]
            if augment_styles_too:
                x = augment_styles(x, gen)
            loss = nn.functional.cross_entropy(model(x), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            if bar is not None:
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}")
    if bar is not None:
        bar.close()
    model.eval()
    with torch.inference_mode():
        test = torch.from_numpy(test_idx).to(dev)
        preds = torch.cat([model(images[test[i:i + 512]]).argmax(-1)
                           for i in range(0, len(test), 512)])
    accuracy = float((preds == labels[test]).float().mean())
    probes = linear_probe(model, dev, seed, probe_depths) if probe else {"all": float("nan")}
    model.cpu()
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"dataset": dataset, "model": name, "model-args": args,
            "test-accuracy": f"{accuracy:.4f}",
            "digit-styles-probe-accuracy": f"{probes['all']:.4f}",
            "train-examples": str(len(train_idx)), "epochs": str(epochs),
            "augment": str(bool(augment_images)).lower(),
            "styles": str(bool(augment_styles_too)).lower(), "seed": str(seed), "lr": str(lr),
            "batch-size": str(batch_size)}
    meta |= {f"digit-styles-probe-accuracy-depth-{d}": f"{probes[d]:.4f}" for d in probe_depths
             if d in probes}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out),
              metadata=meta)
    return {"path": str(out), "model": name, "model-args": args, "dataset": dataset,
            "train-examples": len(train_idx), "test-accuracy": accuracy,
            "probe-accuracy": probes["all"], "probe-depths": {d: probes[d] for d in probe_depths
                                                              if d in probes},
            "device": str(dev), "epochs": epochs, "seconds": time.perf_counter() - started}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(MODELS), default="vit")
    parser.add_argument("--out", default="", help="checkpoint file (default: "
                        "~/.cache/fedtune/<family>-<source>16.safetensors)")
    parser.add_argument("--dataset", choices=DATASETS, default=None,
                        help="default: the family's recipe, else fashion-mnist")
    parser.add_argument("--data-dir", default="", help="folder of the Fashion-MNIST IDX files")
    parser.add_argument("--train-size", type=int, default=0, help="0 = the whole training set")
    parser.add_argument("--epochs", type=int, default=None,
                        help="default: the family's recipe, else 10")
    parser.add_argument("--augment", default=None, action=argparse.BooleanOptionalAction,
                        help="random affine augmentation (default: the family's recipe)")
    parser.add_argument("--styles", default=None, action=argparse.BooleanOptionalAction,
                        help="random quarter turns, inversion, noise, blockiness and colours "
                             "(default: the family's recipe)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: the family's recipe, else 128")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda")
    parser.add_argument("--no-probe", action="store_true", help="skip the linear probe")
    parser.add_argument("--probe-depths", default="",
                        help="also probe the features after these first blocks, e.g. 3,6")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    depths = tuple(int(d) for d in a.probe_depths.split(",") if d.strip())
    result = pretrain(a.family, Path(a.out or default_checkpoint(a.family)), a.dataset,
                      a.train_size, a.epochs, a.batch_size, a.lr, a.seed, a.data_dir,
                      device=a.device, probe=not a.no_probe, augment_images=a.augment,
                      probe_depths=depths, styles=a.styles)
    by_depth = "".join(f", after {d} blocks {v:.4f}" for d, v in result["probe-depths"].items())
    print(f"{result['model']} ({result['model-args']}) pretrained on {result['dataset']} "
          f"({result['train-examples']} examples x {result['epochs']} epochs on "
          f"{result['device']}): test accuracy {result['test-accuracy']:.4f}, linear probe on "
          f"the six digit styles (validation part) {result['probe-accuracy']:.4f}{by_depth}, "
          f"{result['seconds']:.0f} s")
    print(f"use it with: model=\"{result['model']}\" model-args=\"{result['model-args']}\" "
          f"model-source=\"{result['path']}\"")


if __name__ == "__main__":
    main()
