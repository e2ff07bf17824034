"""``Work``: the handle of a collective made with ``async_op=True``, as torch.distributed's.

The call returns once NCCL has enqueued its work on the stream, as every shimrt collective does;
the handle holds an event recorded after it, so that a caller can ask whether it finished
(:meth:`Work.is_completed`) or wait for it: on the GPU, a stream of its own waiting for it
(``wait(stream=s)``, torch's ``work.wait()`` on the current stream), or on the host, bounded
by the communicator's timeout like every shimrt wait (``wait()``): a peer gone aborts the
communicator and raises :class:`~shimrt.errors.CollectiveError` instead of hanging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import waiting
from ..errors import CollectiveError
from ..stream import Event, timeout_seconds
from . import library

if TYPE_CHECKING:
    from .communicator import Communicator


class Work:
    """An enqueued collective of ``comm`` on ``stream``, followed by ``event``."""

    def __init__(self, comm: "Communicator", event: Event, stream: Any, what: str):
        self.comm, self.event, self.stream, self.what = comm, event, stream, what

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
