"""Images reach each model normalised as its timm data config says."""

import torch

from fedtune_app.data import sources
from fedtune_app.data.splits import image_normalisation, run_splits
from fedtune_app.methods import resolve_config

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_deit_is_imagenet_normalised_and_vit_mixer_keep_half():
    deit = image_normalisation("deit_tiny_patch16_224")
    assert (deit.mean, deit.std, deit.interpolation) == (IMAGENET_MEAN, IMAGENET_STD, "bicubic")
    for name in ("vit_tiny_patch16_224", "mixer_s16_224"):
        norm = image_normalisation(name)
        assert norm.is_ours and (norm.mean, norm.std) == ((0.5,) * 3, (0.5,) * 3)


def test_prepare_images_applies_the_models_mean_and_std():
    # pixels 0, 0.5, 1 of every channel (our loaders give them as -1, 0, 1)
    x = torch.tensor([-1.0, 0.0, 1.0]).view(1, 1, 1, 3).expand(1, 3, 1, 3)
    out = sources.prepare_images(x, 0, 3, image_normalisation("deit_tiny_patch16_224"))
    for c, (m, s) in enumerate(zip(IMAGENET_MEAN, IMAGENET_STD)):
        expected = torch.tensor([(0 - m) / s, (0.5 - m) / s, (1 - m) / s])
        torch.testing.assert_close(out[0, c, 0], expected, rtol=0, atol=4 * 2 ** -23 / s)
    ours = sources.prepare_images(x, 0, 3, image_normalisation("vit_tiny_patch16_224"))
    assert torch.equal(ours, x)  # 0.5 / 0.5: exactly what the loaders give


def test_a_deit_run_gets_imagenet_normalised_digits():
    base = {"preset": "smoke", "image-channels": 3}
    vit = run_splits(resolve_config(base | {"model": "vit_tiny_patch16_224"})).train.inputs
    deit = run_splits(resolve_config(base | {"model": "deit_tiny_patch16_224"})).train.inputs
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(
        1, 3, 1, 1)
    torch.testing.assert_close(deit, ((vit + 1) / 2 - mean) / std, rtol=0, atol=1e-6)


def test_dataloader_workers_decode_the_same_batches_in_the_same_order(tmp_path):
    """Image files decoded by 2 DataLoader workers = decoded on this thread, batch by batch."""
    import numpy as np
    from PIL import Image

    from fedtune_app.data.splits import Examples

    rng = np.random.default_rng(0)
    paths = []
    for i in range(11):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    norm = image_normalisation("deit_tiny_patch16_224")

    def examples(workers):
        images = sources.LazyImages(paths, sources._open_image, 6, 3, norm, workers)
        return Examples(images, torch.arange(11))

    here = list(examples(0).batches(4, torch.Generator().manual_seed(5)))
    workers = list(examples(2).batches(4, torch.Generator().manual_seed(5)))
    assert [len(y) for _, y in workers] == [4, 4, 3]
    for (x0, y0), (x1, y1) in zip(here, workers, strict=True):
        assert torch.equal(y0, y1) and torch.equal(x0, x1)  # same code path per image
    assert sorted(torch.cat([y for _, y in workers]).tolist()) == list(range(11))
