"""Several workers on one calculation with torch.distributed (torchrun or Slurm's srun).

Every stage divides its work over the ranks and exchanges small arrays: the SCF runs on every
rank with each J/K build split over the fit functions and summed (``allreduce_sum``), B is
built by all ranks into the shared scratch file (integrals by auxiliary shells, the fit by
columns), the energy's block pairs are dealt out by cost, longest first, to the least loaded
rank, and the gradient splits its sweeps the same way. After every round of pairs the ranks
send each other what they finished (in the background, a few rounds at most in flight), so
rank 0 can checkpoint each pair in the record (a resumed run skips them, whatever the world
size) and the fp64 sums are combined in a fixed order.
Collectives time out, so a lost rank ends the job with an error instead of a hang, and a
rank waits for its tensor collectives in Python (:func:`_wait`), so that a signal (torchrun's
SIGTERM to the survivors of a dead rank) is handled at once, not when gloo gives up.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist

from dfmp2.errors import InputError, RunFailure
from dfmp2.system import interrupts
from dfmp2.system.heartbeat import Heartbeat, SilenceWatch
from dfmp2.system.orphans import process_ended, process_state

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_SECONDS = 300
# A year. torch's deadlines (now plus the timeout, in int64 nanoseconds) overflow beyond about
# 7.4e9 s, and a join then hung for good.
LONGEST_TIMEOUT_SECONDS = 365 * 24 * 3600
DEFAULT_MASTER_PORT = "29500"
# How environment variables write a whole number (int() also reads '1_0' and other scripts).
WHOLE_NUMBER = re.compile(r"[+-]?\d+", re.ASCII)
# A diagonal (syrk) block pair costs about half an off-diagonal one.
DIAGONAL_COST = 0.5
# Longest pause between two looks at an unfinished collective: a bound on the latency a wait
# adds, and on how soon a signal is handled while waiting.
LONGEST_POLL_SECONDS = 0.002
# How often a rank that finished its share of a batch looks whether the others have.
ARRIVAL_POLL_SECONDS = 0.25
# How often a rank waiting in a collective looks whether its peers on the same host live.
PEER_CHECK_SECONDS = 1.0


@dataclass(frozen=True)
class Launch:
    """How this process was started: its rank among ``size`` ranks and where rank 0 listens.
    Built from the launcher's environment variables by :func:`launch_from` at the command
    line (torchrun's RANK/WORLD_SIZE/MASTER_*, or an ``srun`` task's SLURM_* variables)."""

    rank: int = 0
    size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: str = DEFAULT_MASTER_PORT
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS


def launch_from(environ: Mapping[str, str]) -> Launch:
    """The launch described by ``environ``: torchrun's variables, else a multi-task Slurm step
    (``srun``), else a single process. ``DFMP2_DIST_TIMEOUT`` bounds every collective.

    A Slurm step's size is SLURM_STEP_NUM_TASKS, which srun sets for the tasks it starts. A
    batch script's own shell has SLURM_PROCID=0 and the job's SLURM_NTASKS but no step of
    several tasks: a command run there directly is one process, not rank 0 of a job whose
    other ranks would never come (it used to wait for them until the timeout)."""
    timeout = environment_integer(environ, "DFMP2_DIST_TIMEOUT", DEFAULT_TIMEOUT_SECONDS,
                                  minimum=1, maximum=LONGEST_TIMEOUT_SECONDS)
    if "RANK" in environ and "WORLD_SIZE" in environ:
        size = environment_integer(environ, "WORLD_SIZE", 1, minimum=1)
        rank = _rank(environ, "RANK", size)
        if size > 1 and not environ.get("MASTER_ADDR", "").strip():
            raise InputError(f"RANK={rank} and WORLD_SIZE={size} are set but MASTER_ADDR is "
                             "not (or is empty): start the ranks with torchrun (which sets "
                             "all three) or unset RANK and WORLD_SIZE to run one process")
        if size == 1:
            return Launch(timeout_seconds=timeout)
        return Launch(rank, size, environ["MASTER_ADDR"].strip(), _port(environ), timeout)
    tasks = environment_integer(environ, "SLURM_STEP_NUM_TASKS", 1, minimum=1)
    if "SLURM_PROCID" in environ and tasks > 1:
        address = (environ.get("MASTER_ADDR", "").strip()
                   or environ.get("SLURM_LAUNCH_NODE_IPADDR", "").strip() or "127.0.0.1")
        return Launch(_rank(environ, "SLURM_PROCID", tasks), tasks, address, _port(environ),
                      timeout)
    return Launch(timeout_seconds=timeout)


def _port(environ: Mapping[str, str]) -> str:
    port = environment_integer(environ, "MASTER_PORT", int(DEFAULT_MASTER_PORT), minimum=1,
                               remedy="give a TCP port from 1 to 65535, or unset it")
    if port > 65535:
        raise InputError(f"MASTER_PORT={port} is not a TCP port; give one from 1 to 65535, "
                         "or unset it")
    return str(port)


def check_reachable(launch: Launch) -> None:
    """Refuse a rendezvous address that does not resolve, before torch tries it (its C++
    layer would retry and print stack traces until the timeout)."""
    try:
        socket.getaddrinfo(launch.master_addr, int(launch.master_port))
    except (OSError, UnicodeError) as exc:
        raise InputError(f"MASTER_ADDR={launch.master_addr!r} does not resolve "
                         f"({exc.strerror if isinstance(exc, OSError) else exc}); give the "
                         "address of the host of rank 0") from None


def environment_integer(environ: Mapping[str, str], name: str, default: int | None,
                        minimum: int | None = 0, remedy: str = "fix or unset it",
                        maximum: int | None = None) -> int | None:
    """The integer in ``environ[name]`` (``default`` when unset); anything else is an input
    error naming the variable and what to do (``remedy``), never a traceback."""
    text = environ.get(name)
    if text is None:
        return default
    if not WHOLE_NUMBER.fullmatch(text.strip()):
        raise InputError(f"{name}={text!r} is not a whole number; {remedy}")
    value = int(text.strip())
    if minimum is not None and value < minimum:
        raise InputError(f"{name}={text!r} must be at least {minimum}; {remedy}")
    if maximum is not None and value > maximum:
        raise InputError(f"{name}={text!r} must be at most {maximum}; {remedy}")
    return value


def _rank(environ: Mapping[str, str], name: str, size: int) -> int:
    rank = environment_integer(environ, name, 0)
    if rank >= size:
        raise InputError(f"environment variable {name}={rank} is not below the number of "
                         f"ranks ({size})")
    return rank


@dataclass(frozen=True)
class PeerWatch:
    """The processes of this rank's peers on its own machine (rank: (pid, start time)). Gloo
    does not always notice a dead peer of an all-to-all before the collective's timeout;
    torchrun then stops the survivors, but srun (by default) leaves them waiting the whole
    timeout (300 s). A waiting rank looks at these processes, which a dead rank's are not."""

    processes: dict[int, tuple[int, str]] = field(default_factory=dict)

    def lost(self) -> str | None:
        """Which peer has ended, if one has (Linux; elsewhere the timeout alone tells)."""
        for rank, (pid, started) in self.processes.items():
            if process_ended(pid, started):
                return f"rank {rank} (process {pid}) has ended"
        return None


def _machine() -> tuple[str, str]:
    """This machine as the ranks compare it: its host name and this boot's id (host names
    repeat across containers; two machines never share a boot id)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def _watch_peers(places: list, rank: int) -> PeerWatch:
    """The peers on this machine whose process this rank sees as they described it (another
    PID namespace, or no /proc, leaves a peer unwatched rather than taken for dead)."""
    here = places[rank][0]
    watched = {}
    for other, (machine, pid, started) in enumerate(places):
        if other == rank or machine != here or not here[1] or started is None:
            continue
        state = process_state(pid)
        if state is not None and state[1] == started:
            watched[other] = (pid, started)
    return PeerWatch(watched)


@dataclass
class World:
    """The process group of a distributed run (or a world of one)."""

    size: int = 1
    rank: int = 0
    backend: str = "none"
    hosts: int = 1
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    meetings: int = 0
    """How many :meth:`gather_when_all_arrive` meetings (and boards,
    :class:`dfmp2.system.board.Board`) this rank has been to: their keys in the store."""
    peers: PeerWatch = field(default_factory=PeerWatch)
    key_store: object = None
    """The launch's key-value store (a ``torch.distributed.TCPStore`` held by rank 0's
    process), which the process group shares; None in a world of one."""
    heartbeat: Heartbeat | None = None
    """This rank's sign of life in ``key_store`` (:mod:`dfmp2.system.heartbeat`)."""

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def barrier(self, what: str) -> None:
        if self.size > 1:
            self._collective(what, torch_dist.barrier)

    def _collective(self, what: str, collective, *args, **kwargs) -> None:
        """Start ``collective(*args, async_op=True, **kwargs)`` and wait for it."""
        _wait(_started(what, collective, *args, **kwargs), what, self.timeout_seconds,
              self.peers)

    def publish(self, stores: list, what: str) -> None:
        """Make this rank's writes to shared scratch files visible to every rank, then wait
        for all of them. Ranks on one host share the page cache; across hosts each rank's
        writes go to disk first (``sync``), since a shared filesystem shows another node only
        what is there."""
        if self.hosts > 1:
            for store in stores:
                store.sync()
        self.barrier(what)

    def broadcast(self, value, what: str):
        """``value`` from rank 0 on every rank."""
        if self.size == 1:
            return value
        box = [value]
        guarded_call(lambda: torch_dist.broadcast_object_list(box, src=0), what)
        return box[0]

    def allreduce_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        """The sum over ranks of ``array`` (float64), the same bits on every rank; it moves
        ``array.size`` numbers, never a tensor the size of the molecule's integrals."""
        if self.size == 1:
            return array
        buffer = self._buffer(array)
        self._collective(what, torch_dist.all_reduce, buffer, op=torch_dist.ReduceOp.SUM)
        return buffer.cpu().numpy()

    def broadcast_array(self, array: np.ndarray, what: str) -> np.ndarray:
        """Rank 0's ``array`` (float64, the same shape on every rank) on every rank."""
        if self.size == 1:
            return array
        buffer = self._buffer(array)
        self._collective(what, torch_dist.broadcast, buffer, src=0)
        return buffer.cpu().numpy()

    def exchange(self, outgoing: list[np.ndarray], incoming_sizes: list[int],
                 what: str) -> list[np.ndarray]:
        """All-to-all: ``outgoing[r]`` (float64, any shape) goes to rank r, and this rank gets
        from each rank r ``incoming_sizes[r]`` numbers, flat, in rank order."""
        return self.start_exchange(outgoing, incoming_sizes, what).result()

    def start_exchange(self, outgoing: list[np.ndarray], incoming_sizes: list[int],
                       what: str) -> "PendingExchange":
        """:meth:`exchange` started in the background; its ``result()`` waits for it, so a
        rank computes its next piece while this one travels."""
        if self.size == 1:
            return PendingExchange(
                None, np.ascontiguousarray(outgoing[0], dtype=np.float64).ravel(),
                list(incoming_sizes), what)
        send = torch.from_numpy(np.concatenate(
            [np.ascontiguousarray(part, dtype=np.float64).ravel() for part in outgoing]))
        receive = torch.empty(sum(incoming_sizes), dtype=torch.float64)
        if self.backend == "nccl":
            send, receive = send.cuda(), receive.cuda()
        work = _started(what, torch_dist.all_to_all_single, receive, send,
                        output_split_sizes=list(incoming_sizes),
                        input_split_sizes=[int(part.size) for part in outgoing])
        return PendingExchange(work, receive, list(incoming_sizes), what, send,
                               self.timeout_seconds, self.peers)

    def _buffer(self, array: np.ndarray) -> torch.Tensor:
        """``array`` as a tensor where the process group can reach it: NCCL moves only CUDA
        tensors, gloo CPU ones."""
        buffer = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64).copy())
        return buffer.cuda() if self.backend == "nccl" else buffer

    def share(self, count: int) -> range:
        """This rank's contiguous share of ``count`` items (rank r of R takes the r-th of R
        nearly equal ranges)."""
        return range(count * self.rank // self.size, count * (self.rank + 1) // self.size)

    def gather(self, value, what: str) -> list:
        """Every rank's ``value``, in rank order, on every rank."""
        if self.size == 1:
            return [value]
        out = [None] * self.size
        guarded_call(lambda: torch_dist.all_gather_object(out, value), what)
        return out

    def ranks_on_this_node(self) -> int:
        """How many ranks share this rank's host (by host name), itself included."""
        hosts = self.gather(socket.gethostname(), "counting the ranks on each node")
        return hosts.count(hosts[self.rank])

    def gather_when_all_arrive(self, value, what: str) -> list:
        """:meth:`gather` for ranks that arrive hours apart (a batch's shares, the last round
        of a frequency job's points): each rank marks its arrival in the process group's
        store and waits for the others' marks (:meth:`wait_until`), with no deadline (a
        collective's timeout would end the early ranks)."""
        if self.size == 1:
            return [value]
        self.meetings += 1
        keys = [f"dfmp2/meeting{self.meetings}/rank{rank}" for rank in range(self.size)]
        store = self.store()
        guarded_call(lambda: store.set(keys[self.rank], "here"), what)
        self.wait_until(lambda: store.check(keys), what)
        return self.gather(value, what)

    def store(self):
        """The launch's key-value store (held by rank 0's process); our keys start with
        ``dfmp2/``, apart from the process group's own."""
        return self.key_store

    def wait_until(self, condition, what: str) -> None:
        """Look at ``condition()`` (typically a look at the store) until it holds, with no
        deadline and this rank's signal handlers running: first every millisecond (ranks
        that finish together meet at once), then a few times a second. A rank that dies ends
        the wait through the launcher, the store that rank 0 holds (a look then fails), or,
        on this rank's machine, the look at its process every second; a rank that is alive
        but stopped or hung, by its heartbeat standing still for DFMP2_DIST_TIMEOUT."""
        next_check = time.monotonic() + PEER_CHECK_SECONDS
        pause = 1e-3
        beats = (None if self.heartbeat is None else guarded_call(
            lambda: SilenceWatch(self.store(), [r for r in range(self.size) if r != self.rank],
                                 self.timeout_seconds), what))
        while True:
            if guarded_call(condition, what):
                return
            time.sleep(pause)
            pause = min(2 * pause, ARRIVAL_POLL_SECONDS)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + PEER_CHECK_SECONDS
                lost = self.peers.lost() or (beats and guarded_call(beats.silent, what))
                if lost is not None:
                    raise RunFailure(f"distributed run broken while {what}: {lost}")

    def close(self, failed: bool = False) -> None:
        """Leave the process group. After a failure a collective may still be waiting on a
        dead rank, and destroying the group would wait for it (until torchrun's SIGKILL):
        the group is then left to the process's exit."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.size > 1 and torch_dist.is_initialized() and not failed:
            torch_dist.destroy_process_group()


@dataclass
class PendingExchange:
    """An all-to-all under way: ``result()`` waits for it and splits what came in by rank."""

    work: object
    receive: object
    incoming_sizes: list[int]
    what: str
    send: object = None
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    peers: PeerWatch = field(default_factory=PeerWatch)

    def ready(self) -> bool:
        """Whether ``result()`` would return without waiting."""
        return self.work is None or self.work.is_completed()

    def result(self) -> list[np.ndarray]:
        if self.work is not None:
            _wait(self.work, self.what, self.timeout_seconds, self.peers)
        received = (self.receive.cpu().numpy() if isinstance(self.receive, torch.Tensor)
                    else self.receive)
        bounds = np.cumsum([0, *self.incoming_sizes])
        return [received[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


def _started(what: str, collective, *args, **kwargs):
    """The work handle of ``collective(*args, async_op=True, **kwargs)``."""
    return guarded_call(lambda: collective(*args, async_op=True, **kwargs), what)


def _wait(work, what: str, timeout_seconds: float, peers: PeerWatch = PeerWatch()) -> None:
    """Wait for a collective started with ``async_op=True``. A blocking ``work.wait()`` holds
    off Python's signal handlers until it returns, and gloo may not notice a dead peer of an
    all-to-all before the collective's timeout: torchrun's SIGTERM to the surviving ranks
    then waited 30 s for its SIGKILL. Looking every few milliseconds lets the handler run,
    and every second the wait looks whether a peer on this host has ended."""
    now = time.monotonic()
    deadline, next_check = now + timeout_seconds, now + PEER_CHECK_SECONDS
    pause = 1e-5
    while not work.is_completed() and now < deadline:
        time.sleep(pause)
        pause = min(2 * pause, LONGEST_POLL_SECONDS)
        now = time.monotonic()
        if now >= next_check:
            next_check = now + PEER_CHECK_SECONDS
            lost = peers.lost()
            if lost is not None:
                raise RunFailure(f"distributed run broken while {what}: {lost}")
    guarded_call(work.wait, what)


def guarded_call(call, what: str):
    """``call()``'s value; a failure of the process group (a peer gone, the store
    unreachable) as one clear error naming ``what`` the rank was doing."""
    try:
        return call()
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunFailure(f"distributed run broken while {what}: another rank failed or is "
                         f"unreachable ({first[:160]})") from None


def init_world(launch: Launch) -> World:
    """Join the process group of a launch with more than one rank."""
    if launch.size < 2:
        return World()
    check_reachable(launch)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    log.debug("joining the process group of %d ranks at %s:%s", launch.size,
              launch.master_addr, launch.master_port)
    timeout = dt.timedelta(seconds=launch.timeout_seconds)
    with interrupts.ending_at_once(), _joined_within(launch):
        try:
            key_store = torch_dist.TCPStore(launch.master_addr, int(launch.master_port),
                                            launch.size, is_master=launch.rank == 0,
                                            timeout=timeout)
            torch_dist.init_process_group(backend=backend, store=key_store, rank=launch.rank,
                                          world_size=launch.size, timeout=timeout)
        except (RuntimeError, ValueError) as exc:
            # torch's message goes on with the C++ stack of where it was raised.
            reason = (str(exc).strip().splitlines()[0] if str(exc).strip()
                      else type(exc).__name__)
            raise RunFailure(f"cannot join the distributed job ({reason}); launch with "
                             "torchrun or srun, with MASTER_ADDR/MASTER_PORT reachable") from None
        world = World(launch.size, torch_dist.get_rank(), backend,
                      timeout_seconds=launch.timeout_seconds, key_store=key_store)
        own = process_state(os.getpid())
        places = world.gather((_machine(), os.getpid(), None if own is None else own[1]),
                              "meeting the other ranks")
        world.hosts = len({host for (host, _), _, _ in places})
        world.peers = _watch_peers(places, world.rank)
        world.heartbeat = guarded_call(lambda: Heartbeat(
            launch.master_addr, int(launch.master_port), world.rank, launch.timeout_seconds),
            "starting this rank's heartbeat")
    log.info("rank %d of %d (%s) on %d host(s)", world.rank, world.size, backend, world.hosts)
    return world


@contextmanager
def _joined_within(launch: Launch) -> Iterator[None]:
    """End the process with one line if joining takes longer than the launch's timeout.
    Joining waits in several steps (the rendezvous, gloo's connections, the first gather),
    each with the whole timeout: a rank killed between two of them kept the others waiting
    twice or three times ``DFMP2_DIST_TIMEOUT``. Nothing has been written yet, so ending at
    once loses nothing (as a signal does here: :func:`interrupts.ending_at_once`)."""
    joined = threading.Event()

    def watch() -> None:
        if not joined.wait(launch.timeout_seconds):
            sys.stderr.write(
                f"Error: cannot join the distributed job of {launch.size} ranks at "
                f"{launch.master_addr}:{launch.master_port} within DFMP2_DIST_TIMEOUT="
                f"{launch.timeout_seconds} s (a rank did not start, or ended while "
                "joining); nothing was run\n")
            sys.stderr.flush()
            os._exit(RunFailure.exit_code)

    threading.Thread(target=watch, name="dfmp2-join-deadline", daemon=True).start()
    try:
        yield
    finally:
        joined.set()


def deal_pairs(work: list, cost, nranks: int) -> list[list]:
    """Longest-processing-time-first assignment: each item to the least loaded rank."""
    loads = [0.0] * nranks
    assignment: list[list] = [[] for _ in range(nranks)]
    for item in sorted(work, key=cost, reverse=True):
        target = min(range(nranks), key=lambda r: (loads[r], r))
        assignment[target].append(item)
        loads[target] += cost(item)
    return assignment
