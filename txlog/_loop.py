"""One asyncio event loop in a daemon thread: the engine behind each synchronous
client object (Producer, Consumer, Admin).

Guarantees
----------
* Every coroutine of a client runs on its own loop thread, so the client's
  asyncio state (grpc.aio channels, tasks, events) is only touched from that
  thread; users call the synchronous facade from any thread.
* :meth:`LoopThread.run` never waits forever unless asked to, and refuses to
  block when called from the loop thread itself (a future callback calling a
  blocking client method would otherwise deadlock): it raises instead.
* :meth:`LoopThread.stop` cancels what is left, closes the loop and joins the
  thread within its timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from txlog.errors import ClientClosedError, ClientTimeoutError, IoThreadCallError

T = TypeVar("T")
STOP_TIMEOUT_S_DEFAULT = 5.0

# Set while the interpreter exits (shutdown.py): a stopped loop is then left
# open. gRPC's completion-queue poller may still hand it an event of a channel
# just closed, and on a closed loop that prints "Event loop is closed" with a
# traceback, the noise a script's exit must not make; the process is ending.
interpreter_exiting = False


class _ClientEventLoop(asyncio.SelectorEventLoop):
    """A client's loop, which a late event of gRPC's cannot make noisy.

    gRPC's completion-queue poller hands each event to the loop of its call
    with ``call_soon_threadsafe``, from a callback running on whichever loop
    it polls on. After a client closed its loop, an event of one of its calls
    may still come: on a closed loop that raises "Event loop is closed", and
    the traceback lands on another client's loop. The event belongs to a call
    the closed client no longer has, so it is dropped."""

    def call_soon_threadsafe(self, callback, *args, context=None):
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        except RuntimeError:
            if self.is_closed():
                return None
            raise


class LoopThread:
    """An event loop running forever in a daemon thread named ``name``."""

    def __init__(self, name: str):
        self._loop = _ClientEventLoop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._started.wait()
        self._stopped = False

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        try:
            self._loop.run_forever()
        finally:
            pending = [task for task in asyncio.all_tasks(self._loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            if not interpreter_exiting:
                self._loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def in_loop_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedules ``coro`` on the loop; its result arrives in the returned future."""
        if self._stopped:
            coro.close()
            raise ClientClosedError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None, *, what: str = "the operation") -> T:
        """Runs ``coro`` on the loop and waits for its result, at most ``timeout_s``
        (None: no limit). On timeout the coroutine is cancelled and
        :class:`ClientTimeoutError` is raised."""
        if self.in_loop_thread():
            coro.close()
            raise IoThreadCallError(
                f"{what} cannot block on the client's own I/O thread (called from a future callback?); "
                "call it from another thread"
            )
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClientTimeoutError(f"{what} did not finish within {timeout_s:.3f} s") from None

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Runs ``callback(*args)`` on the loop thread soon (thread-safe; a no-op once stopped)."""
        if self.in_loop_thread():
            self._loop.call_soon(callback, *args)
            return
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nothing left to wake
            pass

    def stop(self, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> None:
        """Stops the loop (cancelling its remaining tasks) and joins the thread."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._loop.call_soon_threadsafe(self._loop.stop)
        except RuntimeError:
            return
        if not self.in_loop_thread():
            self._thread.join(timeout_s)
