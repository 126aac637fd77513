"""A learner's own machine: the short path the README and the setup page give, in a fresh
virtual environment.

    python -m pip install -e ".[labs]"      # after the CPU build of torch, on Linux
    cp -r labs my-labs && jupyter lab my-labs

As tests/test_colab_setup.py does for Colab, the environment is a plain venv (not
``--system-site-packages``), pip reads this machine's configured local indexes so that nothing is
downloaded, and torch goes in first from the CPU wheel on disk, as the setup page tells a Linux
learner without a GPU to do; the install must then keep it. The test copies labs/ as a learner
does, checks that JupyterLab and a kernel of the venv's own Python are there, and runs a copied
lab from top to bottom in that kernel with ``jupyter nbconvert --execute``.

The other tests read the files: the ``labs`` extra exists and pins nothing, and every
requirement with no wheels for some system (triton: Linux only) carries its platform marker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib

import nbformat
from packaging.requirements import Requirement

from test_colab_setup import PREINSTALL, _offline_pip_env, _versions

LAB = "08_cost.ipynb"  # formulas, tables and the simulator: the quickest lab to run end to end
# Packages with no wheels for some of the systems a learner may use, and those systems.
NOT_ON = {"triton": ("win32", "darwin"), "uvloop": ("win32",)}


def test_the_learner_path_installs_and_runs_a_lab(root, tmp_path):
    env = _offline_pip_env()
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "jupyter-data")  # no kernels but the venv's own
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "jupyter-config")
    venv = tmp_path / "learner"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    run = dict(env=env, cwd=tmp_path, capture_output=True, text=True)

    torch_first = subprocess.run([str(python), "-m", "pip", "install", "-q", PREINSTALL[0]],
                                 timeout=600, **run)
    assert torch_first.returncode == 0, torch_first.stderr[-3000:]
    before = _versions(python, env, tmp_path)
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "-e",
                                f"{root}[labs]"], timeout=900, **run)
    assert installed.returncode == 0, installed.stderr[-3000:]
    after = _versions(python, env, tmp_path)
    assert after["torch"] == before["torch"], "the learner's install replaced torch"
    assert {"inferlab", "jupyterlab", "ipykernel", "ipywidgets"} <= set(after)

    lab = subprocess.run([str(bin_dir / "jupyter"), "lab", "--version"], timeout=120, **run)
    assert lab.returncode == 0 and lab.stdout.strip(), lab.stderr[-2000:]
    specs = subprocess.run([str(bin_dir / "jupyter"), "kernelspec", "list", "--json"],
                           timeout=120, **run)
    kernel = json.loads(specs.stdout)["kernelspecs"]["python3"]
    assert kernel["resource_dir"].startswith(str(venv)) or \
        kernel["spec"]["argv"][0] in ("python", str(python)), kernel

    mine = tmp_path / "my-labs"
    shutil.copytree(root / "labs", mine)  # what the learner works in
    done = subprocess.run([str(bin_dir / "jupyter"), "nbconvert", "--to", "notebook",
                           "--execute", "--ExecutePreprocessor.timeout=300",
                           "--output", "executed.ipynb", str(mine / LAB)], timeout=900, **run)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    executed = nbformat.read(mine / "executed.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "[TODO] Exercise 8.1" in text  # the unsolved lab ran on the references
    assert "exercises checked in this session passed" in text  # ...to its last cell
    probe = subprocess.run([str(python), "-c", "import inferlab, sys; print(inferlab.__file__)"],
                           timeout=120, **run)
    assert probe.stdout.strip().startswith(str(root)), probe  # editable: the checkout's package


def test_the_labs_extra_pins_nothing_and_brings_no_torch(root):
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = [Requirement(r) for r in project["optional-dependencies"]["labs"]]
    assert {"jupyterlab", "ipykernel"} <= {r.name for r in extra}
    assert "torch" not in {r.name for r in extra}
    assert not any(s.operator == "==" for r in extra for s in r.specifier)


def test_platform_bound_requirements_carry_a_marker(root):
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [line.split("#")[0].strip() for line in
             (root / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    reqs = [Requirement(line) for line in lines if line and not line.startswith("-")]
    reqs += [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    for req in reqs:
        if req.name.lower() in NOT_ON:
            assert req.marker is not None, f"{req} needs a platform marker"
            for system in NOT_ON[req.name.lower()]:
                assert not req.marker.evaluate({"sys_platform": system, "platform_system":
                                                "Windows" if system == "win32" else "Darwin"}), \
                    f"{req} would be installed on {system}"
