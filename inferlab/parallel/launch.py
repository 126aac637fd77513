"""Start ``world_size`` ranks of one function on this machine, and always stop them.

``run_ranks(fn, world_size, *args)`` spawns one process per rank (torch.multiprocessing with the
"spawn" start method, so each rank imports the package afresh and shares no state with the
parent), joins them over TCP on 127.0.0.1 at a free port, calls ``fn(rank, world_size, *args)``
in each and returns the ranks' return values in rank order. Every rank creates its process group
and destroys it in a ``try``/``finally``; the group has a timeout, so a rank whose peer died stops
waiting; the parent waits at most ``timeout`` seconds, then terminates and kills whatever is
still running. A failure in any rank is raised in the parent with that rank's traceback, so a
failing test leaves no process behind.

Return values travel back pickled by ``torch.save`` (tensors as plain bytes, not shared memory,
which would outlive neither the rank nor a crash). ``fn`` must be importable by name (defined at
a module's top level), as spawn requires.
"""

from __future__ import annotations

import io
import queue
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: str | torch.device) -> str:
    """NCCL for tensors on CUDA devices, gloo for tensors on the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _rank_main(rank: int, world_size: int, port: int, backend: str, timeout: float,
               threads: int, results, fn, args) -> None:
    """One rank: join the group, run ``fn``, send back its result or its traceback."""
    torch.set_num_threads(threads)
    try:
        if backend == "nccl":  # one GPU per rank: NCCL refuses two ranks on one device
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout))
        try:
            out = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        buffer = io.BytesIO()
        torch.save(out, buffer)
        results.put((rank, True, buffer.getvalue()))
    except BaseException:  # noqa: BLE001  (the parent re-raises it with the rank's traceback)
        results.put((rank, False, traceback.format_exc()))


class RankFailed(RuntimeError):
    """A rank raised, died or did not finish in time."""


def run_ranks(fn, world_size: int, *args, device: str = "cpu", backend: str | None = None,
              timeout: float = 60.0, threads: int = 1) -> list:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, ...)]``, each run in its own process.

    ``backend`` defaults to ``backend_for(device)``: gloo for "cpu", NCCL for "cuda" (rank r then
    uses GPU r; the rank programs of ``inferlab.parallel.runs`` themselves run on the CPU).
    ``threads``: intra-op threads per rank (one each by default, so two ranks share two cores
    without oversubscribing them).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    backend = backend_for(device) if backend is None else backend
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(rank, world_size, port, backend, timeout, threads, results, fn,
                               args)) for rank in range(world_size)]
    outputs: dict[int, object] = {}
    errors: list[str] = []
    try:
        for p in procs:
            p.start()
        # The ranks' own start-up (imports) comes on top of ``timeout``. After a first failure
        # the others get a few seconds to report too: the rank that failed first is not always
        # the first to say so (its peers see only a closed connection).
        deadline = time.monotonic() + timeout + 60.0
        while len(outputs) + len(errors) < world_size and time.monotonic() < deadline:
            try:
                rank, ok, payload = results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if not p.is_alive() and p.exitcode != 0]
                if dead and results.empty():
                    errors.append(f"rank(s) {dead} exited with code(s) "
                                  f"{[procs[i].exitcode for i in dead]} before reporting")
                    break
                continue
            if ok:
                outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"rank {rank} failed:\n{payload}")
                deadline = min(deadline, time.monotonic() + 5.0)
        if len(outputs) + len(errors) < world_size and not errors:
            errors.append(f"ranks did not finish within {timeout + 60.0:.0f} s")
    finally:
        for p in procs:
            p.join(timeout=5.0)
        for p in procs:  # stragglers: ask, then insist
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    if errors:
        raise RankFailed("\n".join(errors))
    return [outputs[rank] for rank in range(world_size)]

