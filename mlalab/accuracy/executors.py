"""Where a sweep's tasks run: in this process (``"serial"``), in N local processes (``"processes:N"``), or on a Dask
cluster (``"local:N"`` starts a `distributed.LocalCluster` of N single-threaded worker processes; any other text
is a scheduler address such as ``tcp://10.0.0.5:8786``; a `distributed.Client` is used as it is).

Every worker pins torch to its share of the cores (no oversubscription: cores / workers threads each, or on a
remote Dask worker cores / its task slots), and with ``device="cuda"`` on a machine with several GPUs worker i
evaluates on GPU i mod count. Dask is imported only when a Dask executor is asked for (extra ``cluster``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as futures_completed
from typing import Any

import torch

from .grid import Task, run_task

__all__ = ["Runner", "open_runner", "CONNECT_TIMEOUT_S"]

CONNECT_TIMEOUT_S = 10  # how long to wait for a Dask scheduler before giving up
_WORKER_INDEX: int | None = None  # set in local worker processes


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _dask_worker() -> Any:
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _pin_threads(threads: int | None) -> None:
    if threads is None:
        w = _dask_worker()
        if w is None:
            return
        threads = max(1, _cores() // max(1, int(w.state.nthreads)))
    torch.set_num_threads(threads)


def _pick_device(device: str) -> str:
    if device != "cuda" or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return device
    idx = _WORKER_INDEX
    if idx is None:
        w = _dask_worker()
        name = getattr(w, "name", None)
        idx = name if isinstance(name, int) else (abs(hash(str(name))) if name is not None else 0)
    return f"cuda:{idx % torch.cuda.device_count()}"


def work(task: Task, tolerances: Sequence[tuple[float, float]], device: str, threads: int | None) -> list[dict]:
    """What a worker runs: pin threads, pick its GPU, evaluate the task (`run_task`)."""
    _pin_threads(threads)
    return run_task(task, tolerances, _pick_device(device))


def _init_process(counter: Any, threads: int) -> None:
    global _WORKER_INDEX
    with counter.get_lock():
        _WORKER_INDEX = int(counter.value)
        counter.value += 1
    torch.set_num_threads(threads)


class Runner:
    """An open executor: `run` yields (task, records or the exception that lost them) as tasks finish."""

    def __init__(self, kind: str, workers: int, *, pool: Any = None, client: Any = None, cluster: Any = None) -> None:
        self.kind, self.workers = kind, workers
        self._pool, self._client, self._cluster = pool, client, cluster
        self.threads = max(1, _cores() // workers) if kind in ("processes", "local") else None

    @property
    def dashboard_link(self) -> str | None:
        """Dask's dashboard URL when it serves one (needs bokeh), else None."""
        if self._client is None:
            return None
        try:
            import bokeh  # noqa: F401
        except ImportError:
            return None
        return self._client.dashboard_link

    def describe(self) -> str:
        if self.kind == "serial":
            return "serial (this process)"
        where = f" at {self._client.scheduler.address}" if self._client is not None else ""
        pin = f", {self.threads} torch thread(s) each" if self.threads else ", threads pinned to each worker's share"
        return f"{self.kind}: {self.workers} worker(s){where}{pin}"

    def run(
        self, tasks: Sequence[Task], tolerances: Sequence[tuple[float, float]], device: str
    ) -> Iterator[tuple[Task, list[dict] | BaseException]]:
        if self.kind == "serial":
            for t in tasks:
                yield t, run_task(t, tolerances, device)
            return
        if self._pool is not None:
            futs = {self._pool.submit(work, t, tolerances, device, self.threads): t for t in tasks}
            for f in futures_completed(futs):
                try:
                    yield futs[f], f.result()
                except Exception as e:  # BrokenProcessPool: a worker died (killed, out of memory)
                    yield futs[f], e
            return
        from distributed import as_completed

        dfuts = {self._client.submit(work, t, tolerances, device, self.threads, pure=False): t for t in tasks}
        for f in as_completed(list(dfuts)):
            try:
                yield dfuts[f], f.result()
            except Exception as e:  # KilledWorker: the task's workers died; CancelledError: scheduler lost
                yield dfuts[f], e

    def abandon(self) -> None:
        """Stop without the results of tasks in flight (a sweep's time limit): a process pool's workers are ended
        now rather than waited for; a Dask cluster's tasks go when `close` closes the client."""
        if self._pool is not None:
            workers = list(getattr(self._pool, "_processes", {}).values())  # (the pool has no public handle)
            self._pool.shutdown(wait=False, cancel_futures=True)
            for proc in workers:
                proc.terminate()
            for proc in workers:
                proc.join(timeout=10)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._client is not None and self.kind != "client":
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _count(text: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"executor {what!r}: expected a positive worker count after ':', e.g. {what.split(':')[0]}:2")
    return int(text)


def open_runner(executor: object = "serial", *, connect_timeout: float | None = None) -> Runner:
    """Start (or connect to) the executor named by `executor`; see the module docstring for the names. A scheduler
    address that does not answer within `connect_timeout` seconds (default CONNECT_TIMEOUT_S) is a ConnectionError."""
    if connect_timeout is None:
        connect_timeout = CONNECT_TIMEOUT_S
    if isinstance(executor, str):
        spec = executor.strip()
        if spec in ("", "serial"):
            return Runner("serial", 1)
        head, _, tail = spec.partition(":")
        if head == "processes":
            n = _count(tail, spec)
            ctx = mp.get_context("spawn")  # fork after torch started its threads can deadlock
            init = (ctx.Value("i", 0), max(1, _cores() // n))
            pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_process, initargs=init)
            return Runner("processes", n, pool=pool)
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        raise ValueError(
            f"executor {executor!r} needs Dask ({e}): pip install 'mlalab[cluster]' (dask + distributed), or use "
            "'serial' / 'processes:N'"
        ) from None
    if isinstance(executor, Client):
        return Runner("client", len(executor.scheduler_info().get("workers", {})) or 1, client=executor)
    if not isinstance(executor, str):
        raise TypeError(f"executor must be a str or a distributed.Client, got {type(executor).__name__}")
    head, _, tail = executor.strip().partition(":")
    if head == "local":
        n = _count(tail, executor)
        cluster = LocalCluster(  # dashboard on a free port (served when bokeh is installed)
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
        )
        return Runner("local", n, client=Client(cluster), cluster=cluster)
    address = executor.strip()
    try:
        client = Client(address, timeout=connect_timeout)
    except (OSError, TimeoutError, ValueError) as e:
        raise ConnectionError(
            f"could not reach the Dask scheduler at {address!r} within {connect_timeout:g} s ({type(e).__name__}: "
            f"{e}). Is `dask scheduler` running there and the port open? Nothing was computed or written"
        ) from None
    n = len(client.scheduler_info().get("workers", {}))
    return Runner("dask", max(n, 1), client=client)
