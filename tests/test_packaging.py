"""adapters/ and datasets/ must be importable only as fedvlr_plus.adapters / fedvlr_plus.datasets.

Top-level `adapters` and `datasets` belong to AdapterHub and Hugging Face: shadowing them would break a
user's environment. Checked for the current (editable) install and for a freshly built wheel.
"""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import importlib.util, json, sys
import fedvlr_plus, fedvlr_plus.adapters, fedvlr_plus.datasets
from fedvlr_plus.datasets import InteractionData
out = {"pkg": fedvlr_plus.__file__, "adapters": fedvlr_plus.adapters.__file__,
       "datasets": fedvlr_plus.datasets.__file__}
for name in ("adapters", "datasets"):
    spec = importlib.util.find_spec(name)
    out["top_" + name] = None if spec is None else spec.origin
print(json.dumps(out))
"""


def _probe(python: str, cwd: Path) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([python, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _not_ours(origin):
    return origin is None or not str(origin).startswith(str(ROOT))


def test_current_install_maps_folders_into_the_package(tmp_path):
    out = _probe(sys.executable, tmp_path)  # run outside the checkout: no accidental sys.path entry
    assert Path(out["adapters"]).parent.name == "adapters"
    assert Path(out["datasets"]).parent.name == "datasets"
    assert _not_ours(out["top_adapters"]), out
    assert _not_ours(out["top_datasets"]), out


def _see_dependencies_of_this_interpreter(py: str) -> None:
    """Let the wheel's venv import torch & co. from the interpreter running the tests, whatever it is.

    ``system_site_packages`` would expose the *base* interpreter's packages, which in a user's venv lack torch.
    A ``.pth`` line only appends the folder to ``sys.path``: the wheel's own copy in the new venv comes first,
    and ``.pth`` files inside the appended folder (such as an editable install's finder) are not run.
    """
    import sysconfig

    theirs = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(theirs, "_tested_interpreter.pth").write_text("\n".join(sorted(ours)) + "\n")


@pytest.mark.slow
def test_built_wheel_maps_folders_into_the_package(tmp_path):
    pytest.importorskip("build")
    pytest.importorskip("setuptools", minversion="77")  # SPDX `license = "MIT"` needs setuptools >= 77
    dist = tmp_path / "dist"
    res = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    wheel = next(dist.glob("fedvlr_plus-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "fedvlr_plus/datasets/core.py" in names and "fedvlr_plus/adapters/__init__.py" in names
    assert "fedvlr_plus/alignment/fedmpt/data/fedmpt_conditions.json" in names  # package data (FedMPT conditions)
    assert not any(n.startswith(("datasets/", "adapters/", "tests/")) for n in names), names[:20]
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    _see_dependencies_of_this_interpreter(py)
    res = subprocess.run(
        [py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = _probe(py, tmp_path)
    assert str(env_dir) in out["datasets"] and str(env_dir) in out["adapters"], out
    assert _not_ours(out["top_adapters"]) and _not_ours(out["top_datasets"]), out


def test_every_subpackage_is_listed_in_pyproject():
    """setuptools' explicit package list must name every package folder, or wheels silently lack it."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"fedvlr_plus"}
    for top, prefix in (
        ("fedvlr_plus", "fedvlr_plus"),
        ("adapters", "fedvlr_plus.adapters"),
        ("datasets", "fedvlr_plus.datasets"),
    ):
        for init in (root / top).rglob("__init__.py"):
            rel = init.parent.relative_to(root / top)
            found.add(".".join([prefix, *rel.parts]) if rel.parts else prefix)
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; stale: {sorted(listed - found)}"
