"""``Work``: the handle of a collective made with ``async_op=True``, as torch.distributed's.

The call returns once NCCL has enqueued its work on the stream, as every shimrt collective does;
the handle holds an event recorded after it, so that a caller can ask whether it finished
(:meth:`Work.is_completed`) or wait for it: on the GPU, a stream of its own waiting for it
(``wait(stream=s)``, torch's ``work.wait()`` on the current stream), or on the host, bounded
by the communicator's timeout like every shimrt wait (``wait()``): a peer gone aborts the
communicator and raises :class:`~shimrt.errors.CollectiveError` instead of hanging. As torch's,
it offers a future (:meth:`Work.get_future`) whose value is the collective's output.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import TYPE_CHECKING, Any

from .. import waiting
from ..errors import CollectiveError
from ..stream import Event, timeout_seconds
from . import library

__all__ = ["Work"]

if TYPE_CHECKING:
    from .communicator import Communicator


class Work:
    """An enqueued collective of ``comm`` on ``stream``, followed by ``event``; ``output`` is
    the buffer it writes (what its future gives)."""

    def __init__(self, comm: "Communicator", event: Event, stream: Any, what: str, output: Any = None):
        self.comm, self.event, self.stream, self.what, self.output = comm, event, stream, what, output
        self._future: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<shimrt Work {self.what} on {self.comm!r}>"

    def is_completed(self) -> bool:
        """Whether the collective has finished on the GPU (CollectiveError where its communicator
        was aborted: the stream drained without the data)."""
        done = self.event.query()
        if done and self.comm.state.error is not None:
            raise self.comm.state.error
        return done

    def wait(self, stream: Any = None, timeout: Any = None) -> bool:
        """With ``stream`` (a shimrt Stream, or a torch or CuPy stream of the device): that stream's
        later work waits for the collective, the host does not. Without: the host waits, at most
        ``timeout`` seconds (a number or a ``datetime.timedelta``; default the communicator's);
        an asynchronous NCCL error or the timeout aborts the communicator and raises
        CollectiveError. Returns True, as torch's work objects do."""
        comm = self.comm
        if stream is not None:
            comm.device.stream_wait(stream, self.event)
            return True
        limit = comm.options.timeout if timeout is None else timeout_seconds(timeout)

        def finished() -> bool:
            if self.is_completed():
                return True
            state = comm.async_error()
            if state not in (0, library.IN_PROGRESS):  # a peer failed: stop now
                comm.abort()
                comm.lib.check(state, f"{self.what} (asynchronous error)")
            return False
        if not waiting.until(finished, limit, longest=0.01):
            comm.abort()
            raise CollectiveError(f"{self.what} did not finish within {limit:g} s (a peer may be gone); the "
                                  "communicator was aborted")
        return True

    def get_future(self) -> concurrent.futures.Future:
        """A :class:`concurrent.futures.Future` done once the collective has finished on the GPU:
        its result is the output buffer (as torch's future's value is the output tensors), its
        exception the CollectiveError that :meth:`wait` would raise (the communicator's timeout,
        a peer gone). One future per Work, whichever call asks; a daemon thread waits for it."""
        with self._lock:
            if self._future is None:
                future: concurrent.futures.Future = concurrent.futures.Future()
                future.set_running_or_notify_cancel()

                def settle() -> None:
                    try:
                        self.wait()
                    except BaseException as exc:  # handed to whoever reads the future
                        future.set_exception(exc)
                    else:
                        future.set_result(self.output)
                threading.Thread(target=settle, name=f"shimrt {self.what} future", daemon=True).start()
                self._future = future
            return self._future
