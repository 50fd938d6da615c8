"""Where many workers run: forked local processes, or Ray (the optional extra
``kvspec[distributed]``): a local Ray instance (``ray.init()``) or an existing cluster
(``--address``, Ray's own address forms: ``auto`` for the cluster this machine belongs to,
``ray://HOST:10001``, ``HOST:6379``; ``local`` starts a new local instance).

Two shapes of work go through here:

* **tasks** (``kvspec soak``): independent calls of a module-level function, submitted and
  collected as they finish — :class:`ProcessPool` (multiprocessing) or :class:`RayPool` (Ray
  tasks), both with ``submit`` / ``wait`` / ``close``;
* **workers with a message channel** (``kvspec explore --workers``): the explorer's
  :class:`~proofs.explorer.parallel.Backend` (start, send, receive, close); :class:`RayBackend`
  runs each worker in a Ray actor.

Ray workers are other interpreters (their ``hash()`` differs from the driver's): a soak task does
not depend on it, and the explorer runs in its portable mode there (proofs/explorer/parallel.py).
Every node of a cluster needs kvspec (and the target's module) importable; docs/throughput.md "Soak" shows a
set-up.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Callable, Hashable
from typing import Any

from kvspec.output import UsageError

EXTRA_HINT = "pip install 'kvspec[distributed]'"

Done = tuple[Hashable, Any, BaseException | None]
"""A finished task: (its key, its result, or the exception it raised)."""


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def connect(address: str | None, workers: int) -> tuple[Any, bool]:
    """The ``ray`` module, initialised: joined to the cluster at ``address``, or a new local
    instance with at least ``workers`` CPUs (``address`` ``None`` or ``local``). Returns
    ``(ray, owned)``; ``owned``: this call started Ray (the caller shuts it down). Without Ray:
    ``UsageError`` naming the extra (exit 2)."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"Ray is not installed: {EXTRA_HINT}") from None
    if ray.is_initialized():
        return ray, False
    options: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": False,  # stderr is the progress bar's; a task's error comes back raised
    }
    if address in (None, "local"):
        ray.init(num_cpus=max(workers, os.cpu_count() or 1), **options)
    else:
        ray.init(address=address, **options)
    return ray, True


def cluster_cpus(ray: Any) -> int:
    return int(ray.cluster_resources().get("CPU", 1))


def _unwrap(exc: BaseException) -> BaseException:
    """The exception a Ray task raised, rather than Ray's wrapper around it."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


# ----------------------------------------------------------------------------- task pools
def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the driver, which stops them (no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessPool:
    """``workers`` forked local processes (they inherit the loaded target, never pickle it)."""

    kind = "processes"

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool = multiprocessing.get_context("fork").Pool(workers, initializer=_ignore_sigint)
        self.done: queue.SimpleQueue[Done] = queue.SimpleQueue()

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        self.pool.apply_async(
            fn,
            args,
            callback=lambda result: self.done.put((key, result, None)),
            error_callback=lambda exc: self.done.put((key, None, exc)),
        )

    def wait(self, timeout: float) -> list[Done]:
        """The tasks finished so far, waiting up to ``timeout`` seconds for the first."""
        try:
            out = [self.done.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not self.done.empty():
            out.append(self.done.get_nowait())
        return out

    def close(self, cancel: bool = False) -> None:
        if cancel:
            self.pool.terminate()
        else:
            self.pool.close()
        self.pool.join()


class RayPool:
    """Ray tasks, one CPU each, on a local instance or the cluster at ``address``."""

    kind = "ray"

    def __init__(self, workers: int | None, address: str | None) -> None:
        self.ray, self.owned = connect(address, workers or 1)
        self.workers = workers or cluster_cpus(self.ray)
        self.pending: dict[Any, Hashable] = {}
        self.remotes: dict[Callable[..., Any], Any] = {}

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        remote = self.remotes.get(fn)
        if remote is None:
            remote = self.remotes[fn] = self.ray.remote(num_cpus=1, max_retries=0)(fn)
        self.pending[remote.remote(*args)] = key

    def wait(self, timeout: float) -> list[Done]:
        if not self.pending:
            return []
        refs = list(self.pending)
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        out: list[Done] = []
        for ref in ready:
            key = self.pending.pop(ref)
            try:
                out.append((key, self.ray.get(ref), None))
            except Exception as exc:  # the task's own exception, re-raised by the caller
                out.append((key, None, _unwrap(exc)))
        return out

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in self.pending:
                self.ray.cancel(ref, force=True)
        self.pending.clear()
        if self.owned:
            self.ray.shutdown()


# ----------------------------------------------------------------------------- explorer backend
class _Failed:
    """A worker's exception, carried back through the channel."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Channel:
    """The worker's end of the explorer's message channel, between two threads of an actor."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def recv(self) -> Any:
        return self.inbox.get()

    def send(self, message: Any) -> None:
        self.outbox.put(message)


class ExplorerActor:
    """One explorer worker in a Ray actor: the worker's loop runs in a thread and talks to
    :meth:`call` through a channel (each message the explorer sends gets exactly one reply,
    ``stop`` none)."""

    def __init__(self, worker: Callable[[Any, int, int], None], wid: int, n: int) -> None:
        gc.disable()  # as in a forked worker: the explorer collects young generations itself
        self.channel = _Channel()

        def run() -> None:
            try:
                worker(self.channel, wid, n)
            except BaseException as exc:  # the next call raises it in the driver
                self.channel.send(_Failed(exc))

        threading.Thread(target=run, daemon=True).start()

    def call(self, message: Any) -> Any:
        self.channel.inbox.put(message)
        reply = self.channel.outbox.get()
        if isinstance(reply, _Failed):
            raise reply.exc
        return reply

    def stop(self) -> None:
        self.channel.inbox.put(("stop",))


HASH_SEED = "20261207"  # the explorer actors' PYTHONHASHSEED (any fixed value)


class RayBackend:
    """The explorer's :class:`~proofs.explorer.parallel.Backend` on Ray actors (one CPU each).
    A new backend per search: ``kvspec explore`` passes ``lambda: RayBackend(address)``. Its
    workers are other interpreters, so the search runs in its portable mode (parallel.py)."""

    portable = True

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.ray: Any = None
        self.owned = False
        self.actors: list[Any] = []
        self.pending: dict[int, Any] = {}

    def start(self, n: int, worker: Callable[[Any, int, int], None]) -> None:
        self.ray, self.owned = connect(self.address, n)
        # one hash seed for every worker: sets of strings and bytes then cross as exact copies
        # (an element hashing otherwise would send its state as a path to replay)
        env = {"env_vars": {"PYTHONHASHSEED": HASH_SEED}}
        actor = self.ray.remote(num_cpus=1, max_restarts=0, runtime_env=env)(ExplorerActor)
        self.actors = [actor.remote(worker, i, n) for i in range(n)]

    def send(self, i: int, message: Any) -> None:
        if message[0] == "stop":
            self.actors[i].stop.remote()
        else:
            self.pending[i] = self.actors[i].call.remote(message)

    def receive(self, i: int) -> Any:
        try:
            return self.ray.get(self.pending.pop(i))
        except Exception as exc:
            raise _unwrap(exc) from None

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors, self.pending = [], {}
        if self.owned:
            self.ray.shutdown()
