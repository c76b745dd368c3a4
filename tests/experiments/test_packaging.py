"""kiln's configs ship inside the kiln-experiments wheel: an installed kiln runs from any
directory with no environment variable and no repository source on its path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["kiln-core", "kiln-models", "kiln-experiments"]


def _uv(*args: str) -> subprocess.CompletedProcess:
    uv = shutil.which("uv")
    assert uv, "uv builds and installs the wheels; put it on PATH"
    proc = subprocess.run([uv, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding kiln's three wheels (built by ``uv build``); torch, hydra and the
    other dependencies come from the project's site-packages through a ``.pth`` line, whose
    own ``.pth`` files (the editable installs of the repository's src/) are not processed."""
    base = tmp_path_factory.mktemp("wheel")
    for package in PACKAGES:
        _uv("build", "--package", package, "--wheel", "-o", str(base / "dist"))
    venv = base / "venv"
    _uv("venv", "-q", str(venv), "-p", sys.executable)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (site / "site-packages" / "kiln_deps.pth").write_text(sysconfig.get_paths()["purelib"])
    wheels = sorted(str(w) for w in (base / "dist").glob("*.whl"))
    _uv("pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-deps", *wheels)
    return venv


def _run(venv: Path, args: list[str], cwd: Path, env: dict[str, str] | None = None):
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KILN_CONFIG_DIR")}
    return subprocess.run(
        args, cwd=cwd, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=600
    )


def test_wheels_carry_one_version_and_the_license(wheel_venv):
    from kiln.core import __version__

    wheels = sorted((wheel_venv.parent / "dist").glob("*.whl"))
    names = [w.name.split("-")[0] for w in wheels]
    assert names == ["kiln_core", "kiln_experiments", "kiln_models"]
    license_text = (ROOT / "LICENSE").read_text()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
            fields = archive.read(meta).decode().split("\n\n", 1)[0].splitlines()
            licence = meta.replace("METADATA", "licenses/LICENSE")
            assert archive.read(licence).decode() == license_text, wheel.name
        assert f"Version: {__version__}" in fields, (wheel.name, fields)
        assert "License-Expression: MIT" in fields, (wheel.name, fields)


def test_the_workspace_version_is_the_packages_version():
    # uv needs a version for the (unpublished) workspace project; keep it the packages' one
    from kiln.core import __version__

    root = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert root["version"] == __version__
    for package in ("core", "models", "experiments"):
        project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
        assert project["project"]["dynamic"] == ["version"], package
        assert project["project"]["license"] == root["license"] == "MIT", package


def test_installed_wheel_runs_kiln_train_with_its_packaged_configs(wheel_venv, tmp_path):
    (wheel,) = (wheel_venv.parent / "dist").glob("kiln_experiments-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "kiln/experiments/configs/train.yaml" in names
    assert "kiln/experiments/configs/model/minilm-cls.yaml" in names
    probe = "import kiln.core as c, kiln.experiments as e, sys; print(c.__file__, e.__file__)"
    probe += "; print(*sys.path)"
    paths = _run(wheel_venv, [str(wheel_venv / "bin" / "python"), "-c", probe], tmp_path)
    assert paths.returncode == 0, paths.stderr
    assert str(ROOT / "packages") not in paths.stdout, paths.stdout
    assert paths.stdout.split()[1].startswith(str(wheel_venv)), paths.stdout
    kiln_train = str(wheel_venv / "bin" / "kiln-train")
    proc = _run(wheel_venv, [kiln_train, "--cfg", "job", "experiment=cnn_digits"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "name: resnet-digits" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_installed_wheel_takes_kiln_config_dir_and_a_user_folder(wheel_venv, tmp_path):
    # KILN_CONFIG_DIR replaces the packaged configs; hydra.searchpath adds a user's folder.
    mine = tmp_path / "my_configs"
    shutil.copytree(ROOT / "configs", mine, ignore=shutil.ignore_patterns("local"))
    train = (mine / "train.yaml").read_text()
    (mine / "train.yaml").write_text(train.replace("tags: []", "tags: [from-mine]"))
    user = tmp_path / "user"
    (user / "experiment").mkdir(parents=True)
    (user / "experiment" / "mine.yaml").write_text("# @package _global_\nname: user-exp\n")
    args = [str(wheel_venv / "bin" / "kiln-train"), "--cfg", "job", "experiment=mine"]
    args.append(f"hydra.searchpath=[file://{user}]")
    proc = _run(wheel_venv, args, tmp_path, env={"KILN_CONFIG_DIR": str(mine)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "- from-mine" in proc.stdout and "name: user-exp" in proc.stdout, proc.stdout
    bad = _run(wheel_venv, args[:3], tmp_path, env={"KILN_CONFIG_DIR": str(tmp_path / "none")})
    assert bad.returncode != 0 and "KILN_CONFIG_DIR" in bad.stderr, bad.stderr[-2000:]
