"""Worker processes that decode large request bodies, so that parsing never holds the server's
interpreter lock.

A thread of the server that parses a 4 MiB body holds the interpreter lock for most of the parse
(libyaml's events and the limit checks are Python code): the event loop then waits up to the
switch interval (5 ms) each time it wants the lock back, many times per request it answers. A
:class:`DecoderPool` runs the same decoding functions in :data:`DECODE_PROCESSES` child
interpreters instead; the server only pickles the call (the body's text: a copy, ~1 ms for
4 MiB) and sends it over a socket, in a thread that waits without the lock.

* **Workers.** Each is `python -c` (:data:`_BOOTSTRAP`) with the server's `sys.path`, in a session
  of its own (a terminal's Ctrl-C is the server's to handle) and :data:`NICENESS` steps nicer
  than the server, talking over one end of a `socketpair` passed as a file descriptor. It imports :data:`PRELOAD` (the modules whose
  functions it runs), says it is ready, then answers one call at a time. A refusal comes back as
  the same exception, rebuilt (small: a `json.JSONDecodeError` loses its `doc`, the body);
  a valid body comes back as the decoded value (e.g. `TrainingJob` models).
* **Start.** Lazily, in the background: :meth:`DecoderPool.warm` on the first body over the
  threshold (`bodies` also calls it when a `Content-Length` announces one), one worker at a time.
  Until the first is up (a fresh interpreter importing the API: about a second), large bodies
  are decoded in threads as before, so starting never delays an answer.
* **Time.** :meth:`DecoderPool.run` gives up at the caller's deadline (waiting for a free worker
  included) with `TimeoutError`; a worker still decoding then is killed and a new one started,
  so an overrun body burns no more CPU.
* **Memory.** A worker gives freed heap back (`malloc_trim`) after each body over
  :data:`TRIM_AFTER_BYTES` and reports its resident set with each answer; one over
  :data:`RECYCLE_RSS_BYTES` is stopped and replaced.
* **End.** The pool belongs to the event loop that made it (:func:`decoder_pool`) and is closed
  when that loop shuts down its asynchronous generators (`asyncio.run`, `aiohttp.web.run_app`
  and pytest's loops do), by :func:`close_decoders`, or at interpreter exit; a worker whose
  server died reads end-of-file on its socket and exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import ctypes.util
import functools
import importlib
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

__all__ = [
    "DECODE_PROCESSES",
    "PRELOAD",
    "RECYCLE_RSS_BYTES",
    "DecoderPool",
    "NotPortable",
    "WorkerLost",
    "close_decoders",
    "current_pool",
    "decoder_pool",
    "serve",
]

log = structlog.get_logger(__name__)

DECODE_PROCESSES = 2
"""Worker processes of a pool."""

PRELOAD = ("gpuyard.apis.decoding", "gpuyard.platform.api.jobs", "gpuyard.platform.api.manifests")
"""Modules a worker imports before it says it is ready: those of the functions `bodies.off_loop`
is given (any other is imported on first use)."""

TRIM_AFTER_BYTES = 256 * 1024
"""A worker returns freed heap pages to the system after a call this large."""

RECYCLE_RSS_BYTES = 384 * 1024 * 1024
"""A worker whose resident set is larger after a call is replaced."""

NICENESS = 5
"""Added to a worker's nice value: on a machine whose cores are all busy, the event loop (health
checks, small requests) gets the CPU before a large body's parse; with a core to spare it changes
nothing."""

START_TIMEOUT_S = 60.0
"""How long a worker may take to import :data:`PRELOAD` and say it is ready."""

RETRY_START_AFTER_S = 30.0
"""After a worker failed to start, how long large bodies are decoded in threads before the next try."""

MAX_ERROR_TEXT = 4096
"""A refusal's text attributes longer than this (a `JSONDecodeError`'s `doc`: the body) are not sent back."""

_HEADER = struct.Struct("!QQ")  # payload length, resident set (replies) or 0
_BOOTSTRAP = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
    "from gpuyard.platform.api.decoders import serve; serve(int(sys.argv[1]))"
)


class NotPortable(Exception):
    """The call cannot be sent to a worker (an argument that does not pickle): decode in a thread."""


class WorkerLost(Exception):
    """The worker ended while decoding (killed from outside, out of memory, a crash)."""


# --- framing ----------------------------------------------------------------------------------


def _send(sock: socket.socket, data: bytes, extra: int = 0) -> None:
    sock.sendall(_HEADER.pack(len(data), extra))
    sock.sendall(data)


def _recv_exactly(sock: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the other end closed the socket")
        got += n
    return buf


def _recv(sock: socket.socket) -> tuple[bytearray, int]:
    size, extra = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    return _recv_exactly(sock, size), extra


# --- the worker process -----------------------------------------------------------------------


def _rebuild_exception(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    """An exception of `cls` with these `args` and attributes, without calling its `__init__`
    (whose signature need not match `args`: `ApiError`, `DocumentLimitError`, `JSONDecodeError`)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class _PortableError:
    """Pickles as the exception it carries, rebuilt by :func:`_rebuild_exception`."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, ...]:
        exc = self.exc
        state = {
            k: ("" if isinstance(v, str) and len(v) > MAX_ERROR_TEXT else v) for k, v in vars(exc).items()
        }
        return (_rebuild_exception, (type(exc), exc.args, state))


def _error_reply(exc: Exception) -> bytes:
    try:
        return pickle.dumps((False, _PortableError(exc)), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an attribute that does not pickle: its type and message still do
        fallback = RuntimeError(f"{type(exc).__name__}: {exc}")
        return pickle.dumps((False, _PortableError(fallback)), protocol=pickle.HIGHEST_PROTOCOL)


def _answer(request: bytearray) -> bytes:
    try:
        fn, args, kwargs = pickle.loads(request)
        value = fn(*args, **kwargs)
        del fn, args, kwargs
        return pickle.dumps((True, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return _error_reply(exc)


def malloc_trim_libc() -> ctypes.CDLL | None:
    """The C library when it has `malloc_trim` (glibc), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def serve(fd: int) -> None:
    """A worker's life: import :data:`PRELOAD`, say ready, then answer calls sent on socket `fd`
    (pickled `(fn, args, kwargs)`; answered `(True, value)` or `(False, exception)`, with the
    resident set) until the server closes its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        importlib.import_module(name)
    libc = malloc_trim_libc()
    _send(sock, b"ready", _rss_bytes())
    while True:
        try:
            request, _ = _recv(sock)
        except (EOFError, OSError):
            return
        large = len(request) > TRIM_AFTER_BYTES
        reply = _answer(request)
        del request
        if large and libc is not None:
            libc.malloc_trim(0)
        try:
            _send(sock, reply, _rss_bytes())
        except OSError:  # the server is gone
            return
        del reply


# --- the server's side ------------------------------------------------------------------------


class _Worker:
    """One worker process and the server's end of its socket."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, rss: int) -> None:
        self.proc = proc
        self.sock = sock
        self.rss = rss
        self.retired = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, spawned: Callable[[subprocess.Popen[bytes]], None]) -> _Worker:
        """Start one and wait until it is ready (blocking: called in a thread); `spawned` is
        told of the process as soon as it exists (killing it makes this raise)."""
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(theirs.fileno()), json.dumps(sys.path)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            spawned(proc)
            ours.settimeout(START_TIMEOUT_S)
            hello, rss = _recv(ours)
            ours.settimeout(None)
            if hello != b"ready":
                raise RuntimeError(f"unexpected first message from decoder process {proc.pid}")
        except BaseException:
            ours.close()
            proc.kill()
            proc.wait()
            raise
        return cls(proc, ours, rss)

    def exchange(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[bool, Any]:
        """Pickle the call, send it and wait for the answer (blocking, without the interpreter
        lock while it waits: called in a thread). :class:`NotPortable` before anything is sent
        when the call does not pickle."""
        try:
            payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # PicklingError, TypeError, AttributeError...
            raise NotPortable(str(exc)) from None
        _send(self.sock, payload)
        del payload
        data, self.rss = _recv(self.sock)
        ok, value = pickle.loads(data)
        return bool(ok), value

    def end(self, *, kill: bool) -> None:
        """Stop it (its socket closed: it exits at its next read) or kill it; always reaped."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # also wakes a thread blocked in `exchange`
        self.sock.close()
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ended(proc: subprocess.Popen[bytes]) -> bool:
    """The process has exited. `poll()` alone may answer "running" for a dead one (it does not wait
    while another thread holds the Popen's waitpid lock), so an unreaped zombie counts as ended too."""
    if proc.poll() is not None:
        return True
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False  # no /proc here: trust poll()


class DecoderPool:
    """:data:`DECODE_PROCESSES` worker processes serving one event loop (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, processes: int = DECODE_PROCESSES) -> None:
        self.loop = loop
        self.processes = processes
        self.closed = False
        self.started = 0  # workers started so far, replacements included
        self._threads = ThreadPoolExecutor(max_workers=2 * processes + 1, thread_name_prefix="decoder")
        self._idle: asyncio.Queue[_Worker | None] = asyncio.Queue()
        self._waiting = 0
        self._lock = threading.Lock()  # `close` may come from another thread (atexit)
        self._workers: set[_Worker] = set()  # up, idle or busy
        self._spawning: set[subprocess.Popen[bytes]] = set()  # started, not ready yet
        self._pending: set[_Worker] = set()  # ready, not yet taken in by the loop
        self._starting = 0
        self._retry_at = 0.0
        self._portable: dict[object, bool] = {}

    @property
    def ready(self) -> bool:
        """A worker is up (perhaps busy: a caller then waits for it rather than decode in a thread)."""
        return bool(self._workers) and not self.closed

    def pids(self) -> list[int]:
        return sorted(w.pid for w in self._workers)

    def worker_rss_bytes(self) -> dict[int, int]:
        """Each worker's resident set as it reported it with its last answer."""
        return {w.pid: w.rss for w in self._workers}

    def warm(self) -> None:
        """Start a missing worker in the background, one at a time (the next when it is up: one
        interpreter importing the API at a time, on a machine of few cores)."""
        if self.closed or self._starting or self.loop.time() < self._retry_at:
            return
        if len(self._workers) < self.processes:
            self._starting += 1
            future = self.loop.run_in_executor(self._threads, self._start_worker)
            future.add_done_callback(self._started)

    def _start_worker(self) -> _Worker:
        """In a thread: a worker, ready, kept in `_pending` until the loop takes it in."""
        spawned: list[subprocess.Popen[bytes]] = []

        def track(proc: subprocess.Popen[bytes]) -> None:
            spawned.append(proc)
            with self._lock:
                if self.closed:
                    proc.kill()  # `start` then fails and reaps it
                else:
                    self._spawning.add(proc)

        try:
            worker = _Worker.start(track)
        finally:
            with self._lock:
                self._spawning.difference_update(spawned)
        with self._lock:
            if not self.closed:
                self._pending.add(worker)
                return worker
        worker.end(kill=True)
        raise RuntimeError("the decoder pool was closed while a worker started")

    def _started(self, future: asyncio.Future[_Worker]) -> None:
        self._starting -= 1
        if future.cancelled() or self.closed:
            if not future.cancelled():
                future.exception()  # retrieved: the closing pool ended the worker
            return
        exc = future.exception()
        if exc is not None:
            log.warning("decoder process did not start; large bodies are decoded in threads", error=str(exc))
            self._retry_at = self.loop.time() + RETRY_START_AFTER_S
            if not self._workers and not self._starting:
                self._wake_waiters()
            return
        worker = future.result()
        with self._lock:
            if worker not in self._pending:  # closed meanwhile: `close` ended it
                return
            self._pending.discard(worker)
            self._workers.add(worker)
        self.started += 1
        self._idle.put_nowait(worker)
        self.warm()

    def _wake_waiters(self) -> None:
        for _ in range(self._waiting):
            self._idle.put_nowait(None)  # a caller given None decodes in a thread

    def _retire(self, worker: _Worker, *, kill: bool) -> None:
        if worker.retired:
            return
        worker.retired = True
        with self._lock:
            self._workers.discard(worker)
        if self.closed:
            worker.end(kill=kill)
            return
        self.loop.run_in_executor(self._threads, functools.partial(worker.end, kill=kill))
        self.warm()

    def _returned(self, worker: _Worker, future: asyncio.Future[tuple[bool, Any]]) -> None:
        exc = None if future.cancelled() else future.exception()  # retrieved even when nobody waits
        if worker.retired:
            return
        if future.cancelled() or (exc is not None and not isinstance(exc, NotPortable)):
            self._retire(worker, kill=True)  # it ended, or its socket failed
        elif worker.rss > RECYCLE_RSS_BYTES:
            log.info("decoder process replaced", pid=worker.pid, rss_mib=worker.rss >> 20)
            self._retire(worker, kill=False)
        else:
            self._idle.put_nowait(worker)

    def portable(self, fn: Callable[..., Any]) -> bool:
        """`fn` can be sent to a worker (a module-level function; not a lambda or a closure)."""
        known = self._portable.get(fn)
        if known is None:
            try:
                pickle.dumps(fn)
                known = True
            except Exception:
                known = False
            self._portable[fn] = known
        return known

    async def run(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, deadline: float
    ) -> Any:
        """`fn(*args, **kwargs)` in a worker by `deadline` (the loop's clock; waiting for a free
        worker included) or `TimeoutError`, the worker then killed and replaced. Raises
        :class:`NotPortable` when the call does not pickle or no worker can be had (decode it in
        a thread) and :class:`WorkerLost` when the worker ended while decoding."""
        if self.closed or not self.portable(fn):
            raise NotPortable(f"{getattr(fn, '__qualname__', fn)!r} cannot be sent to a decoder process")
        while True:
            self._waiting += 1
            try:
                async with asyncio.timeout_at(deadline):
                    worker = await self._idle.get()
            finally:
                self._waiting -= 1
            if worker is None:
                raise NotPortable("no decoder process")
            if not _ended(worker.proc):
                break
            log.warning(
                "decoder process ended while idle; replaced", pid=worker.pid, code=worker.proc.returncode
            )
            self._retire(worker, kill=False)
        exchange = self.loop.run_in_executor(self._threads, worker.exchange, fn, args, kwargs)
        exchange.add_done_callback(functools.partial(self._returned, worker))
        try:
            async with asyncio.timeout_at(deadline):
                ok, value = await asyncio.shield(exchange)
        except TimeoutError:
            log.warning("decoder process overran the decode timeout; killed", pid=worker.pid)
            self._retire(worker, kill=True)
            raise
        except (EOFError, OSError) as exc:
            raise WorkerLost(f"the decoding process {worker.pid} ended: {exc}") from None
        if ok:
            return value
        # Raised with no frame of ours holding it (`value`, or the finished future's result): a
        # traceback refers to this frame, which would refer back to the error, and the cycle
        # would keep the frames, the body's text among them, until the garbage collector ran.
        error = value
        del value, exchange
        try:
            raise error
        finally:
            del error

    def close(self) -> None:
        """Kill every worker, those starting included, and wait for them; idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            spawning = list(self._spawning)
            workers = [*self._workers, *self._pending]
            self._workers, self._pending = set(), set()
        for proc in spawning:
            proc.kill()  # its starting thread reaps it
        for worker in workers:
            worker.retired = True
            worker.end(kill=True)
        self._threads.shutdown(wait=True, cancel_futures=True)
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._wake_waiters)


_POOL: DecoderPool | None = None
_POOL_LOCK = threading.Lock()
_CLOSERS: dict[DecoderPool, AsyncGenerator[None, None]] = {}  # the loop keeps weak references only


async def _close_with_loop(pool: DecoderPool) -> AsyncGenerator[None, None]:
    """Suspended for the loop's life; `loop.shutdown_asyncgens()` closes it, closing the pool."""
    try:
        yield
    finally:
        _CLOSERS.pop(pool, None)
        close_decoders(pool)


async def decoder_pool(processes: int = DECODE_PROCESSES) -> DecoderPool:
    """The running loop's pool, made on first use (one of another loop is closed first)."""
    global _POOL
    loop = asyncio.get_running_loop()
    with _POOL_LOCK:
        pool, stale = _POOL, None
        if pool is not None and (pool.loop is not loop or pool.closed):
            stale, pool = pool, None
        if pool is None:
            pool = _POOL = DecoderPool(loop, processes)
    if stale is not None:
        close_decoders(stale)
    if pool not in _CLOSERS:
        closer = _close_with_loop(pool)
        _CLOSERS[pool] = closer
        await anext(closer)
    return pool


def current_pool() -> DecoderPool | None:
    """The pool in use, if any."""
    return _POOL


def close_decoders(pool: DecoderPool | None = None) -> None:
    """Close `pool` (default: the one in use) and forget it."""
    global _POOL
    with _POOL_LOCK:
        if pool is None:
            pool = _POOL
        if pool is not None and _POOL is pool:
            _POOL = None
    if pool is not None:
        pool.close()


atexit.register(close_decoders)
