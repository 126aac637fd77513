"""Execute the pages a build is about to read on every core, before Sphinx reads them.

With ``execute_notebooks: cache``, myst-nb executes a notebook page when Sphinx reads it, one
page after another, and stores the executed notebook in jupyter-cache under a hash of its code.
Most pages spend their time in one Python thread (a kernel starting, imports, a simulator's
loop), so on a machine with two cores half of it sits idle for the whole build.

At ``env-before-read-docs`` this extension reads each page Sphinx is about to read as myst-nb
will (same reader, same kernel alias, same per-notebook settings), leaves out what myst-nb would
not execute (another execution mode, an ``execute: exclude_patterns`` match, a notebook the cache
already holds) and executes the rest in worker processes, one per core, storing each success in
the same cache exactly as myst-nb does. When Sphinx then reads a page, myst-nb finds it cached.
A page with ``execution_mode: force`` (executed at every build, because what it shows comes from
files other than its code: the model card, the status page) is executed with the rest; as Sphinx
reads it, myst-nb is handed this build's execution from the cache instead of running it again,
alone, while the other core waits (the model card alone took 61 s so).
A notebook that fails here is not stored: myst-nb executes it again as it reads it and reports
the error the usual way, so a failure looks the same with or without this extension.

Every execution of the build, here and myst-nb's own, waits for a kernel's messages in slices of
a second (``inferlab.course.runner.slice_waits``): a wake-up that ZeroMQ's asyncio integration
misses then costs a second, not the cell's whole 600-s timeout (a build here lost 600 s to one).

``MEMORY_BOUND_BUILD_JOBS`` sets the number of workers (default: the cores there are); ``1``
turns the extension off.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path, PurePosixPath

from sphinx.util import logging

logger = logging.getLogger(__name__)


def _jobs() -> int:
    value = os.environ.get("MEMORY_BOUND_BUILD_JOBS", "")
    return max(1, int(value)) if value.strip() else max(1, os.cpu_count() or 1)


def _execute(text: str, cwd: str, timeout: int | None, allow_errors: bool):
    """In a worker: execute one notebook (``nbformat`` JSON) in ``cwd``; return the executed
    notebook as JSON, the seconds it took and the error's traceback (None on success)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    from inferlab.course.runner import slice_every_notebook_client

    slice_every_notebook_client()
    nb = nbformat.reads(text, as_version=4)
    result = single_nb_execution(nb, cwd=cwd, timeout=timeout, allow_errors=allow_errors,
                                 meta_override=True)
    return nbformat.writes(nb), result.time, result.exc_string if result.err else None


# the pages with ``execution_mode: force`` that this build has executed (resolved paths)
_FORCED_AHEAD: set[str] = set()


def _to_execute(env, docnames):
    """(path, notebook, reader format, timeout, allow_errors, forced) for each page in
    ``docnames`` that myst-nb would execute now: read as ``myst_nb.sphinx_.Parser.parse`` reads
    it."""
    from jupyter_cache import get_cache
    from myst_nb.core.nb_to_tokens import nb_node_to_dict
    from myst_nb.core.read import create_nb_reader

    base = env.mystnb_config
    if base.execution_mode not in ("cache", "force"):
        return None, []
    cache = get_cache(base.execution_cache_path or ".jupyter_cache")
    todo = []
    for docname in docnames:
        path = Path(env.doc2path(docname))
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        reader = create_nb_reader(str(path), env.myst_config, base, text)
        if reader is None:
            continue
        nb = reader.read(text)
        name = nb.metadata.get("kernelspec", {}).get("name")
        for rgx, alias in (base.kernel_rgx_aliases or {}).items():
            if name is not None and re.fullmatch(rgx, name):
                nb.metadata["kernelspec"]["name"] = alias
                break
        config = base
        if base.metadata_key in nb.metadata:
            overrides = nb_node_to_dict(nb.metadata[base.metadata_key])
            overrides.pop("output_folder", None)
            try:
                config = base.copy(**overrides)
            except Exception:  # myst-nb warns about it as it reads the page
                continue
        forced = config.execution_mode == "force"
        if not forced and config.execution_mode != "cache":
            continue
        posix = PurePosixPath(path.as_posix())
        if any(posix.match(p) for p in config.execution_excludepatterns or ()):
            continue
        if not forced:
            try:
                cache.match_cache_notebook(nb)
                continue                  # already executed, code unchanged
            except KeyError:
                pass
        todo.append((path, nb, reader.read_fmt, config.execution_timeout,
                     config.execution_allow_errors, forced))
    return cache, todo


def execute_ahead(app, env, docnames):
    jobs = _jobs()
    if jobs < 2 or not docnames:
        return
    import nbformat
    from jupyter_cache.base import CacheBundleIn

    cache, todo = _to_execute(env, docnames)
    if len(todo) < 2:
        return                        # nothing to overlap: myst-nb runs it as it reads
    # the solved labs and the forced pages first: they are the longest (the model card 61 s), and
    # a long one last would run alone
    todo.sort(key=lambda t: (not (t[0].parts[-2] == "solutions" or t[5]), str(t[0])))
    logger.info(f"[parallel_execute] executing {len(todo)} notebooks in {jobs} processes")
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_execute, nbformat.writes(nb), str(path.parent), timeout,
                               allow): (path, fmt, forced)
                   for path, nb, fmt, timeout, allow, forced in todo}
        for future in as_completed(futures):
            path, fmt, forced = futures[future]
            try:
                text, seconds, error = future.result()
            except Exception as exc:  # a worker died: myst-nb executes the page itself
                logger.info(f"[parallel_execute] {path}: {exc!r}; left to myst-nb")
                continue
            if error is not None:
                logger.info(f"[parallel_execute] {path} failed; myst-nb runs it again and "
                            "reports the error")
                continue
            record = (cache.add_nb_to_project(str(path), read_data=fmt) if fmt is not None
                      else cache.add_nb_to_project(str(path)))
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.reads(text, as_version=4), record.uri,
                              data={"execution_seconds": seconds}),
                check_validity=False, overwrite=True)
            if forced:
                _FORCED_AHEAD.add(str(path.resolve()))
            logger.info(f"[parallel_execute] {path}: executed in {seconds:.2f} seconds")
    logger.info(f"[parallel_execute] {len(todo)} notebooks in "
                f"{time.perf_counter() - start:.1f} s")


def _read_forced_from_cache() -> None:
    """Make myst-nb read a page with ``execution_mode: force`` that this build has already
    executed (``_FORCED_AHEAD``) from the cache, where that execution is, as for a page of mode
    ``cache``; every other page as before. Its code is unchanged since, so the cache matches it;
    if it did not, myst-nb would execute the page as it reads it, as in mode ``force``."""
    import myst_nb.sphinx_ as sphinx_

    create = sphinx_.create_client
    if getattr(create, "_reads_forced_from_cache", False):
        return

    def create_client(notebook, source, nb_config, logger, read_fmt=None):
        if nb_config.execution_mode == "force" and \
                str(Path(str(source)).resolve()) in _FORCED_AHEAD:
            nb_config = nb_config.copy(execution_mode="cache")
        return create(notebook, source, nb_config, logger, read_fmt)

    create_client._reads_forced_from_cache = True
    sphinx_.create_client = create_client


def setup(app):
    from inferlab.course.runner import slice_every_notebook_client

    slice_every_notebook_client()   # myst-nb's own executions in this process
    _read_forced_from_cache()
    # after myst-nb's builder-inited handler has set env.mystnb_config
    app.connect("env-before-read-docs", execute_ahead)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
