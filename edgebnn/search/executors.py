"""Where trials run: a process pool on this machine, or Ray tasks on a cluster.

An executor maps a batch of :class:`~edgebnn.search.trial.TrialJob` to their results, in job order; it never
chooses configs (the study does, before the batch starts), so the executor changes the wall time, not the
trials or their metrics.

* :class:`LocalExecutor`: ``workers`` processes (``spawn``: no forked onnxruntime/torch state); one worker
  runs the trials in this process.
* :class:`RayExecutor`: each trial is two Ray tasks: :func:`~edgebnn.search.trial.evaluate_trial` (lower,
  export, evaluate: 1 CPU on any node) and :func:`~edgebnn.search.trial.profile_trial`, which asks for one unit
  of the custom resource named after the device profile (``jetson-orin-nano``, ``rtx``), so it runs on a node
  started with ``ray start --resources '{"jetson-orin-nano": 1}'`` and each board profiles one trial at a time
  while the others are evaluated on CPU nodes. On the ``cpu`` device the profile needs no custom resource.

Both start their workers importing the trial code and opening the model and data
(:func:`~edgebnn.search.trial.warm_up`) when the search begins, while it measures the baseline, and submit a batch
largest ensemble first (:func:`largest_first`), so a slow trial does not start last and keep the batch waiting.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from edgebnn.errors import InvalidOptionError, MissingDependencyError
from edgebnn.search.trial import TrialJob, evaluate_trial, profile_trial, run_trial, warm_up

EXECUTORS = ("local", "ray")
RAY_CONNECT_TIMEOUT_S = 5
"""How long ``--ray-address`` may take to accept a TCP connection, and then Ray's handshake with its head
(``RAY_gcs_server_port_wait_time_s``, unless set already), before the search gives up: 10 s in all."""

Done = Callable[[dict[str, Any]], None]


def largest_first(jobs: Sequence[TrialJob]) -> list[int]:
    """Indices of ``jobs``, the largest ensemble first (then in job order): the order to submit a batch in.

    A trial's time grows with S (S members are exported, evaluated and profiled), and the batch ends with its
    slowest trial: submitted last, a large-S trial runs alone on one worker while the others wait. Submitting the
    longest first (LPT) makes a 6-trial batch on 2 workers end sooner; the results are still told in trial order,
    so the order changes the wall time only.
    """
    def size(job: TrialJob) -> int:  # an anytime ensemble (auto): its largest count, 16
        return job.config.samples if isinstance(job.config.samples, int) else 16

    return sorted(range(len(jobs)), key=lambda i: -size(jobs[i]))


class LocalExecutor(AbstractContextManager["LocalExecutor"]):
    """Trials in ``workers`` processes on this machine (1: in this process)."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise InvalidOptionError(f"--workers {workers}: must be at least 1")
        self.workers = workers
        self._pool: Executor | None = None

    def describe(self) -> str:
        return f"local ({self.workers} worker{'s' if self.workers > 1 else ''})"

    def _processes(self) -> Executor:
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def warm_up(self, model: str, data: str, ood_data: str | None, parallel: int,
                rows: tuple[float, int, int] | None = None) -> None:
        """Start the worker processes importing and opening the inputs (1 worker: nothing, trials run here)."""
        if self.workers > 1:
            pool = self._processes()
            for _ in range(min(self.workers, parallel)):
                pool.submit(warm_up, model, data, ood_data, rows)

    def map(self, jobs: Sequence[TrialJob]) -> Iterator[dict[str, Any]]:
        """Results of ``jobs`` in job order (submitted largest S first, see :func:`largest_first`)."""
        if self.workers == 1:
            yield from map(run_trial, jobs)
            return
        pool = self._processes()
        futures = {i: pool.submit(run_trial, jobs[i]) for i in largest_first(jobs)}
        for i in range(len(jobs)):
            yield futures[i].result()

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def check_reachable(address: str, timeout_s: int = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) that accepts no TCP connection within ``timeout_s``.

    ``ray.init`` itself retries an unreachable head for a long time; this fails in at most ``timeout_s``.
    """
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidOptionError(f"--ray-address {address}: give HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise InvalidOptionError(f"--ray-address {address}: no Ray cluster reachable within {timeout_s} s "
                                 f"({why})") from e


@contextlib.contextmanager
def _stderr_held() -> Iterator[None]:
    """Send file descriptor 2 to a temp file; give it back to stderr only when the block succeeds."""
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        sys.stderr.write(held.read().decode(errors="replace"))


class RayExecutor(AbstractContextManager["RayExecutor"]):
    """Trials as Ray tasks: on the cluster at ``address``, or on a local Ray instance of ``workers`` CPUs.

    Args:
        address: ``HOST:PORT`` / ``ray://HOST:PORT`` / ``auto`` of a running cluster, or None to start a local
            instance (loopback only, no dashboard) with ``workers`` CPUs.
        workers: CPUs of the local instance (ignored with ``address``: the cluster's resources decide).
        device: Device profile the trials are profiled on (its canonical name is the custom resource asked for).
    """

    def __init__(self, address: str | None = None, *, workers: int = 1, device: str = "cpu") -> None:
        if workers < 1:
            raise InvalidOptionError(f"--workers {workers}: must be at least 1")
        # Set before ray starts: bounds the handshake with a cluster head.
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(RAY_CONNECT_TIMEOUT_S))
        try:
            import ray
        except ImportError as e:
            raise MissingDependencyError("--executor ray needs ray: pip install 'edgebnn[search]'") from e
        from edgebnn.targets.registry import get_target

        device = get_target(device).name  # the canonical profile name is the resource: jetson -> jetson-orin-nano
        if address is not None:
            check_reachable(address)
        self.address, self.workers, self.device = address, workers, device
        self._ray = ray
        self._started = False
        self._evaluate: Any = None
        self._profile: Any = None
        self._warming: list[Any] = []

    def describe(self) -> str:
        return f"ray ({self.address})" if self.address else f"ray (local instance, {self.workers} CPUs)"

    def _start(self) -> None:
        if self._started:
            return
        ray = self._ray
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        try:
            if self.address is None:  # this machine is the device: it holds the profile's resource
                ray.init(num_cpus=self.workers, resources=self._resources(), _node_ip_address="127.0.0.1", **options)
            else:
                with _stderr_held():  # Ray's C++ client logs each retry; a failure is reported as one line
                    ray.init(address=self.address, **options)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = self.address or "a local instance"
            if self.address is not None:
                where += f" within {2 * RAY_CONNECT_TIMEOUT_S} s"
            raise InvalidOptionError(f"--executor ray: cannot start or join {where}: "
                                     f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
                                     ) from e
        self._started = True
        if self.address is not None:
            check_device_resource(ray.cluster_resources(), self.device, self.address)
        self._evaluate = ray.remote(num_cpus=1, num_returns=2, max_retries=0)(evaluate_trial)
        self._profile = ray.remote(num_cpus=1, resources=self._resources(), max_retries=0)(profile_trial)

    def _resources(self) -> dict[str, float]:
        """The custom resource a profile task asks for: one unit named after the device (none for ``cpu``)."""
        return {} if self.device == "cpu" else {self.device: 1}

    def warm_up(self, model: str, data: str, ood_data: str | None, parallel: int,
                rows: tuple[float, int, int] | None = None) -> None:
        """Have up to ``parallel`` workers (one per CPU) import and open the inputs; returns at once.

        Ray reuses a worker process for the tasks of one search, so the first trial on each would otherwise pay the
        imports (about a second); submitted while the driver measures the baseline, they overlap it.
        """
        self._start()
        cpus = self.workers if self.address is None else int(self._ray.cluster_resources().get("CPU", 1))
        task = self._ray.remote(num_cpus=1, max_retries=0)(warm_up)
        self._warming = [task.remote(model, data, ood_data, rows)  # type: ignore[call-arg]  # ray typed its 3-param overload
                         for _ in range(max(1, min(cpus, parallel)))]

    def __enter__(self) -> RayExecutor:
        self._start()
        return self

    def map(self, jobs: Sequence[TrialJob]) -> Iterator[dict[str, Any]]:
        """Submit every job of the batch (largest S first, see :func:`largest_first`); results in job order."""
        self._start()
        refs = {}
        for i in largest_first(jobs):
            result_ref, onnx_ref = self._evaluate.remote(jobs[i])
            refs[i] = self._profile.remote(result_ref, onnx_ref, jobs[i])
        for i in range(len(jobs)):
            yield self._ray.get(refs[i])

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._warming = []
            self._ray.shutdown()
            self._started = False


def check_device_resource(cluster: dict[str, float], device: str, address: str) -> None:
    """Refuse a cluster on which no node offers ``device``'s custom resource: its profile tasks would wait forever.

    Raises:
        InvalidOptionError: One line naming the address, the resource and how to offer it.
    """
    if device != "cpu" and cluster.get(device, 0) < 1:
        raise InvalidOptionError(
            f"--ray-address {address}: no node offers the resource {device!r} that --device {device} profiles "
            f"on; start one on the board with: ray start --address {address} --resources '{{\"{device}\": 1}}'")


def make_executor(kind: str, *, workers: int = 1, ray_address: str | None = None,
                  device: str = "cpu") -> LocalExecutor | RayExecutor:
    """The executor ``--executor`` names.

    Raises:
        InvalidOptionError: An unknown kind, ``--ray-address`` without ray, or an unreachable address.
        MissingDependencyError: ray is not installed.
    """
    if kind not in EXECUTORS:
        raise InvalidOptionError(f"--executor {kind}: choose one of {', '.join(EXECUTORS)}")
    if kind == "local":
        if ray_address:
            raise InvalidOptionError("--ray-address: only with --executor ray")
        return LocalExecutor(workers)
    return RayExecutor(ray_address, workers=workers, device=device)
