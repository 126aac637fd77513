"""One fresh virtual environment for the two install tests of a session: Colab's
(tests/colab_setup.py, collected in tests/test_learner_setup.py) and then the learner's.

Both start the same way, a plain venv (not ``--system-site-packages``: this machine's Python
has inferlab installed in editable mode, which such a venv would see) into which pip puts
torch's CPU wheel first, with NumPy and matplotlib, the packages Colab ships preinstalled
(``PREINSTALL``; pip reads this machine's configured local indexes, so nothing is downloaded).
Making that environment once instead of twice spares the second torch install. The Colab test
runs first (the learner's test file imports it before its own tests): it installs the package
as a lab's setup cell does, checks it and uninstalls it again, leaving torch, NumPy,
matplotlib and the package's own requirements, all of which the learner's ``pip install -e
".[labs]"`` installs anyway; the learner's test then installs from there, so what the labs find
is what that command gives.
A test run alone makes the environment itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PREINSTALL = ["torch==2.13.0", "numpy", "matplotlib"]  # the local stand-ins for Colab's copies


def offline_pip_env() -> dict[str, str]:
    """The environment for pip in the venv: this machine's configured local indexes, if every
    configured index is a local one, replace PyPI, so that the test downloads nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True).stdout
    urls = []
    for line in out.splitlines():
        if re.match(r"^[\w.:-]*extra-index-url=", line):
            urls += line.split("=", 1)[1].strip("'\"").split()
    if urls and all(u.startswith("file:") for u in urls):
        env["PIP_INDEX_URL"], env["PIP_EXTRA_INDEX_URL"] = urls[0], " ".join(urls[1:])
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@dataclass
class Venv:
    folder: Path       # holds the venv and whatever a test writes beside it
    python: Path
    bin_dir: Path
    env: dict          # pip's offline environment, the venv's bin first on PATH

    def run(self, *args, timeout=600, check=False):
        return subprocess.run([str(a) for a in args], env=self.env, cwd=self.folder,
                              capture_output=True, text=True, timeout=timeout, check=check)

    def pip(self, *args, timeout=900):
        return self.run(self.python, "-m", "pip", *args, timeout=timeout)

    def versions(self) -> dict[str, str]:
        out = self.pip("list", "--format=json").stdout
        return {p["name"].lower(): p["version"] for p in json.loads(out)}

    def without_inferlab(self) -> "Venv":
        """Uninstall the course package if a test left it installed (a no-op otherwise)."""
        if "inferlab" in self.versions():
            self.pip("uninstall", "-y", "-q", "inferlab")
        return self


_SHARED: dict[str, Venv] = {}


def shared_venv(tmp_path_factory) -> Venv:
    """The session's venv with ``PREINSTALL`` in it, made on first use."""
    if "venv" not in _SHARED:
        folder = tmp_path_factory.mktemp("fresh-env")
        env = offline_pip_env()
        env["JUPYTER_DATA_DIR"] = str(folder / "jupyter-data")  # no kernels but the venv's own
        env["JUPYTER_CONFIG_DIR"] = str(folder / "jupyter-config")
        env.pop("TRITON_INTERPRET", None)  # a learner's shell does not set it
        venv = folder / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        made = Venv(folder, venv / "bin" / "python", venv / "bin", env)
        # --no-compile: pip would byte-compile every module of torch at install time (2,285
        # files, 9 CPU seconds); Python compiles what a lab imports when it imports it.
        first = made.pip("install", "-q", "--no-compile", *PREINSTALL)
        assert first.returncode == 0, first.stderr[-3000:]
        _SHARED["venv"] = made
    return _SHARED["venv"]
