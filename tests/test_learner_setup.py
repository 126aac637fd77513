"""A learner's own machine: the short path the README and the setup page give, in a fresh
virtual environment, and every lab run to its end in it.

    python -m pip install torch==2.13.0      # the CPU build first, on Linux
    python -m pip install -e ".[labs]"
    cp -r labs my-labs && jupyter lab my-labs

The environment is the plain venv tests/test_colab_setup.py used before (tests/fresh_env.py:
one venv a session, so torch is installed once): pip reads this machine's configured local
indexes so that nothing is downloaded, and torch went in first from the CPU wheel on disk, as
the setup page tells a Linux learner without a GPU to do; the install must then keep it. What
the Colab test left there (torch, NumPy, matplotlib and the package's own requirements, the
package itself uninstalled) is what ``pip install -e ".[labs]"`` brings anyway. The test copies labs/ as a learner
does, checks that JupyterLab and a kernel of the venv's own Python are there, and runs **every**
copied lab from top to bottom in that kernel with ``jupyter nbconvert --execute``, unsolved (each
check lends the package's reference): a lab that imports anything the learner's install lacks
fails here. This is where CI executes the student labs (once: they are not collected by nbval
as well). Then the course server starts from the venv and answers ``/health``: Chapter 9's
server and Lab 9 need its imports too.

The other tests read the files: the ``labs`` extra exists and pins nothing, and every
requirement with no wheels for some system (triton: Linux only) carries its platform marker.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement

from fresh_env import shared_venv

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.name for p in (ROOT / "labs").glob("*.ipynb"))
# Packages with no wheels for some of the systems a learner may use, and those systems.
NOT_ON = {"triton": ("win32", "darwin"), "uvloop": ("win32",)}


@dataclass
class Learner:
    venv: Path
    python: Path
    bin_dir: Path
    labs: Path          # the learner's copy of labs/
    env: dict
    before: dict        # package versions before the course's install (torch first)
    after: dict

    def run(self, *args, timeout=900):
        return subprocess.run([str(a) for a in args], env=self.env, cwd=self.venv.parent,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> Learner:
    """The session's fresh venv (torch first), with the course installed as README's learner
    quick start says, and a copy of labs/ beside it."""
    venv = shared_venv(tmp_path_factory).without_inferlab()
    before = venv.versions()
    installed = venv.pip("install", "-q", "-e", f"{ROOT}[labs]")
    assert installed.returncode == 0, installed.stderr[-3000:]
    mine = venv.folder / "my-labs"
    shutil.rmtree(mine, ignore_errors=True)
    shutil.copytree(ROOT / "labs", mine)  # what the learner works in
    return Learner(venv.python.parent.parent, venv.python, venv.bin_dir, mine, venv.env, before,
                   venv.versions())


def test_the_learner_path_installs_jupyterlab_and_keeps_torch(learner):
    assert learner.after["torch"] == learner.before["torch"], "the learner's install replaced torch"
    assert {"inferlab", "jupyterlab", "ipykernel", "ipywidgets", "tokenizers"} <= set(learner.after)
    lab = learner.run(learner.bin_dir / "jupyter", "lab", "--version", timeout=120)
    assert lab.returncode == 0 and lab.stdout.strip(), lab.stderr[-2000:]
    specs = learner.run(learner.bin_dir / "jupyter", "kernelspec", "list", "--json", timeout=120)
    kernel = json.loads(specs.stdout)["kernelspecs"]["python3"]
    assert kernel["resource_dir"].startswith(str(learner.venv)) or \
        kernel["spec"]["argv"][0] in ("python", str(learner.python)), kernel
    probe = learner.run(learner.python, "-c", "import inferlab; print(inferlab.__file__)",
                        timeout=120)
    assert probe.stdout.strip().startswith(str(ROOT)), probe  # editable: the checkout's package


@pytest.mark.parametrize("lab", LABS)
def test_every_lab_runs_to_its_end_in_the_learner_s_install(learner, lab):
    number = int(lab.split("_")[0])
    out = learner.labs / f"executed_{lab}"
    done = learner.run(learner.bin_dir / "jupyter", "nbconvert", "--to", "notebook", "--execute",
                       "--ExecutePreprocessor.timeout=600", "--output", out.name,
                       learner.labs / lab)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    executed = nbformat.read(out, as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert f"[TODO] Exercise {number}.1" in text  # the unsolved lab ran on the references
    assert "exercises checked in this session passed" in text  # ...to its last cell


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_course_server_starts_in_the_learner_s_install(learner):
    port = _free_port()
    server = subprocess.Popen([str(learner.python), "-m", "inferlab.serve", "--port", str(port),
                               "--threads", "1"], env=learner.env, cwd=learner.venv.parent,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, answer = time.monotonic() + 180, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                    answer = json.loads(r.read())
                    break
            except OSError:
                time.sleep(0.5)
        if answer is None:
            said = server.communicate(timeout=30)[0] if server.poll() is not None \
                else "(still starting after 180 s)"
            pytest.fail(f"the course server did not start in the learner's install:\n{said[-3000:]}")
        assert answer["data"] and answer["data"][0]["id"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


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
