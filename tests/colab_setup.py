"""Learners in Colab: every lab's setup cell installs the course package into a fresh runtime,
and installing it never replaces the torch, NumPy and matplotlib that Colab preinstalls.

The fresh runtime is a plain virtual environment (not ``--system-site-packages``: this machine's
Python has inferlab installed in editable mode, which such a venv would see, and the setup cell
would then skip the install it is meant to test). Into it go first the packages Colab ships
preinstalled (torch, NumPy, matplotlib), from the pip configuration of this machine (torch's
CPU wheel lies in /opt/wheels; nothing is downloaded when the configured indexes are local).
That environment is made once per session and shared with the learner's install test, which
runs after this one: tests/test_learner_setup.py imports this module's tests, so pytest
collects them there, first, and pytest-xdist (which hands out a test file at a time) runs both
on one worker, where one venv serves both (tests/fresh_env.py); this test leaves it without
inferlab. Then the setup cell of every lab runs, as extracted from the notebook, with the
repository's URL replaced by this checkout's path; then the test imports the package from the
venv and reads its data. The wheel pip built from pyproject.toml must carry the data tables (hatchling's
force-include of data/ as inferlab/data).

The second test checks pyproject's dependency ranges against the versions Colab has shipped
preinstalled (listed in COLAB_PREINSTALLED below).
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import nbformat
from packaging.requirements import Requirement
from packaging.version import Version

from fresh_env import shared_venv
from inferlab.course import labgen
from inferlab.model.config import ModelConfig

# Versions Colab has preinstalled over 2024-2025 (torch 2.5-2.9, NumPy 1.26 and 2.0,
# matplotlib 3.8-3.10, ...): the package's ranges must admit every one, so that pip keeps them.
COLAB_PREINSTALLED = {
    "python": ["3.10", "3.11", "3.12"],
    "torch": ["2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.0"],
    "numpy": ["1.26.4", "2.0.2"],
    "matplotlib": ["3.8.0", "3.9.2", "3.10.0"],
    "tqdm": ["4.66.6", "4.67.1"],
    "safetensors": ["0.4.5", "0.5.3"],
    "nbformat": ["5.10.4"],
    "pyyaml": ["6.0.2"],
    "ipywidgets": ["7.7.1"],
    "tokenizers": ["0.20.3", "0.21.1"],
}
KEPT = ("torch", "numpy", "matplotlib")


def _setup_cells(root: Path) -> dict[str, list[str]]:
    """{setup cell source: [notebooks that have it]} for every lab and the calculators page."""
    cells: dict[str, list[str]] = {}
    notebooks = sorted((root / "labs").glob("*.ipynb")) + sorted((root / "book").glob("*.ipynb"))
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        first = next(c.source for c in nb.cells if c.cell_type == "code")
        assert first.startswith(labgen.SETUP_FIRST_LINE), f"{path.name}: no setup cell first"
        cells.setdefault(first, []).append(str(path.relative_to(root)))
    assert cells
    return cells


def test_setup_cell_installs_inferlab_in_a_fresh_runtime(root, tmp_path_factory):
    venv = shared_venv(tmp_path_factory).without_inferlab()
    try:
        _setup_cells_install_and_ship_the_data(root, venv)
    finally:
        venv.without_inferlab()  # as the learner's test expects to find it


def _setup_cells_install_and_ship_the_data(root, venv):
    python, tmp_path = venv.python, venv.folder
    run = dict(env=venv.env, cwd=tmp_path, capture_output=True, text=True)
    probe = "import importlib.util; print(importlib.util.find_spec('inferlab'))"
    assert subprocess.run([str(python), "-c", probe], **run).stdout.strip() == "None"
    before = venv.versions()

    url = labgen.repository_url(root)
    for source, notebooks in _setup_cells(root).items():
        assert f"git+{url}" in source, f"{notebooks}: the setup cell does not install from {url}"
        cell = tmp_path / "setup_cell.py"
        cell.write_text(source.replace(f"git+{url}", root.resolve().as_uri()))
        first = subprocess.run([str(python), str(cell)], timeout=600, **run)
        assert first.returncode == 0, f"{notebooks}:\n{first.stderr[-3000:]}"
        again = subprocess.run([str(python), str(cell)], timeout=60, **run)  # now a no-op
        assert again.returncode == 0 and "pip" not in again.stderr
        after = venv.versions()
        for name in KEPT:
            assert after[name] == before[name], f"installing inferlab replaced {name}"
        assert "inferlab" in after

        check = subprocess.run([str(python), "-c", """
import json, sys
import inferlab
from inferlab import data_path
from inferlab.analysis.hardware import load_hardware
from inferlab.model.config import ModelConfig
from inferlab.model.weights import checkpoint_path, load_checkpoint
cfg = ModelConfig.from_name("llama-3-8b")
course = load_checkpoint(checkpoint_path("course-target"))  # the course's own, from the wheel
print(json.dumps({"package": inferlab.__file__, "table": str(data_path("hardware.csv")),
                  "devices": len(load_hardware()), "layers": cfg.n_layers,
                  "course_model": str(checkpoint_path("course-target")),
                  "course_layers": course.config.n_layers}))
"""], timeout=120, **run)
        assert check.returncode == 0, check.stderr[-3000:]
        seen = json.loads(check.stdout)
        site = str(python.parent.parent)
        assert seen["package"].startswith(site) and seen["table"].startswith(site), seen
        assert seen["devices"] > 0 and seen["layers"] == 32
        assert seen["course_model"].startswith(site)
        assert seen["course_layers"] == ModelConfig.from_name("course-target").n_layers

        # The wheel pip built carried every file of data/ as inferlab/data/.
        record = next((python.parent.parent / "lib").glob(
            "python*/site-packages/inferlab-*.dist-info/RECORD"))
        shipped = {line.split(",")[0] for line in record.read_text().splitlines()}
        wanted = {f"inferlab/data/{p.relative_to(root / 'data').as_posix()}"
                  for p in (root / "data").rglob("*") if p.is_file() and p.suffix in (
                      ".csv", ".md", ".json", ".jsonl", ".txt", ".safetensors")}
        assert wanted and wanted <= shipped, f"missing from the wheel: {sorted(wanted - shipped)}"
        if len(_setup_cells(root)) > 1:  # another distinct setup cell: start it from scratch
            subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "inferlab"],
                           check=True, **run)


def test_dependencies_are_ranges_that_colabs_preinstalled_versions_satisfy(root):
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    python_spec = project["requires-python"]
    for version in COLAB_PREINSTALLED["python"]:
        assert Version(version) in Requirement(f"python{python_spec}").specifier, version
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        requirements += [Requirement(r) for r in extra]
    for req in requirements:
        name = req.name.lower()
        assert not any(s.operator in ("==", "===", "~=") for s in req.specifier), \
            f"{req}: a pin or a compatible-release clause would replace Colab's copy"
        if name in COLAB_PREINSTALLED:
            for version in COLAB_PREINSTALLED[name]:
                assert req.specifier.contains(version, prereleases=True), \
                    f"{req} would replace Colab's preinstalled {name} {version}"
    names = {r.name.lower() for r in requirements}
    assert {"torch", "numpy", "matplotlib"} <= names
