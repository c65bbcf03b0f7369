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
}
CACHE = Path("~/.cache/fedtune")


def default_checkpoint(family: str) -> Path:
    return CACHE / f"{family}-fmnist16.safetensors"


def linear_probe(model: nn.Module, device: torch.device, seed: int = 0) -> float:
    """Test accuracy of a logistic regression on the frozen pooled features of the six-style
    digits (the offline presets' task), with the same train/test split as the presets."""
    from sklearn.linear_model import LogisticRegression

    from fedtune_app.data.sources import DIGIT_STYLES, multi_domain_digits
    from fedtune_app.data.splits import SPLIT_SEED, TEST_FRACTION

    raw = multi_domain_digits(list(DIGIT_STYLES), 16, SPLIT_SEED, TEST_FRACTION)
    model.eval()
    with torch.inference_mode():
        x = raw.inputs.to(device)
        feats = torch.cat([model.forward_head(model.forward_features(x[i:i + 1024]),
                                              pre_logits=True) for i in range(0, len(x), 1024)])
    feats = feats.float().cpu().numpy()
    train, test = raw.split
    probe = LogisticRegression(max_iter=2000, random_state=seed).fit(feats[train],
                                                                      raw.labels[train])
    return float(probe.score(feats[test], raw.labels[test]))


def pretrain(family: str, out: Path, dataset: str = "fashion-mnist", train_size: int = 0,
             epochs: int = 10, batch_size: int = 128, lr: float = 3e-3, seed: int = 0,
             data_dir: str = "", progress: bool = True, device: str = "auto",
             probe: bool = True) -> dict:
    """Train, evaluate, save; returns {'accuracy', 'seconds', 'path', ...}."""
    import timm
    from safetensors.torch import save_file

    from fedtune_app.data.sources import digits, fashion_mnist, prepare_images
    from fedtune_app.data.splits import stratified_split
    from fedtune_app.model.backbones import _timm_class

    started = time.perf_counter()
    raw = fashion_mnist(data_dir) if dataset == "fashion-mnist" else digits()
    train_idx, test_idx = raw.split or stratified_split(raw.labels, 0.2, seed)
    rng = np.random.default_rng(seed)
    if train_size and train_size < len(train_idx):
        train_idx = np.sort(rng.choice(train_idx, size=train_size, replace=False))
    test_idx = test_idx[:2000]
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                       if device == "auto" else device)
    images = prepare_images(raw.inputs, 16, 3).to(dev)
    labels = torch.from_numpy(raw.labels).to(dev)
    name, args = MODELS[family]
    kwargs = {k: int(v) for k, v in (a.split("=") for a in args.split(","))}
    torch.manual_seed(seed)
    try:
        model = timm.create_model(name, pretrained=False, num_classes=len(raw.classes), **kwargs)
    except TypeError:  # the mixer entrypoint fixes patch_size: build from its class
        model = _timm_class(name)(num_classes=len(raw.classes), **kwargs)
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
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
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
    probe_accuracy = linear_probe(model, dev, seed) if probe else float("nan")
    model.cpu()
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out),
              metadata={"dataset": dataset, "model": name, "model-args": args,
                        "test-accuracy": f"{accuracy:.4f}",
                        "digit-styles-probe-accuracy": f"{probe_accuracy:.4f}",
                        "train-examples": str(len(train_idx)), "epochs": str(epochs)})
    return {"path": str(out), "model": name, "model-args": args, "dataset": dataset,
            "train-examples": len(train_idx), "test-accuracy": accuracy,
            "probe-accuracy": probe_accuracy, "device": str(dev),
            "seconds": time.perf_counter() - started}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(MODELS), default="vit")
    parser.add_argument("--out", default="", help="checkpoint file (default: "
                        "~/.cache/fedtune/<family>-fmnist16.safetensors)")
    parser.add_argument("--dataset", choices=("fashion-mnist", "digits"), default="fashion-mnist")
    parser.add_argument("--data-dir", default="", help="folder of the Fashion-MNIST IDX files")
    parser.add_argument("--train-size", type=int, default=0, help="0 = the whole training set")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda")
    parser.add_argument("--no-probe", action="store_true", help="skip the linear probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    result = pretrain(a.family, Path(a.out or default_checkpoint(a.family)), a.dataset,
                      a.train_size, a.epochs, a.batch_size, a.lr, a.seed, a.data_dir,
                      device=a.device, probe=not a.no_probe)
    print(f"{result['model']} ({result['model-args']}) pretrained on {result['dataset']} "
          f"({result['train-examples']} examples x {a.epochs} epochs on {result['device']}): test "
          f"accuracy {result['test-accuracy']:.4f}, linear probe on the six digit styles "
          f"{result['probe-accuracy']:.4f}, {result['seconds']:.0f} s")
    print(f"use it with: model=\"{result['model']}\" model-args=\"{result['model-args']}\" "
          f"model-source=\"{result['path']}\"")


if __name__ == "__main__":
    main()
