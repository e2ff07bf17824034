"""bench torch's training step on one batch (one process, every rank in it): forward, backward
with the gradients' all-reduces launched as their buckets fill (or after backward), the optimizer
after they finish, and the step's phases timed."""

from __future__ import annotations

from typing import Any

from .. import validate
from ..errors import UsageError
from ..torch.step import GradientBuckets, NcclBuckets

__all__ = ["Trainer"]


class Trainer:
    """A model's training step on one batch: forward, backward with the gradients' all-reduces
    launched as their buckets fill (or after backward), the optimizer after they finish."""

    def __init__(self, model: Any, batch: tuple[Any, Any], buckets: GradientBuckets, lr: float = 1e-4):
        if not callable(getattr(model, "parameters", None)):
            raise UsageError(f"model must be a torch.nn.Module, not {validate.shown(model)}")
        if not isinstance(batch, tuple):
            raise UsageError(f"batch must be a tuple of the model's inputs, not {validate.shown(batch)}")
        if not isinstance(buckets, GradientBuckets):
            raise UsageError(f"buckets must be a GradientBuckets, not {validate.shown(buckets)}")
        lr = validate.number(lr, "lr", positive=True)
        import torch
        self.model, self.batch, self.buckets, self.lr = model, batch, buckets, lr
        self.initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.optimizer = self._optimizer()
        self._comm: NcclBuckets | None = None
        self._filled = [0] * len(buckets.counts)
        self._events = [torch.cuda.Event() for _ in buckets.counts]
        self._overlap = True
        self._launched = [False] * len(buckets.counts)
        #: events of the last step when set to a dict (:meth:`phases`): "start", "first bucket"
        #: (its gradients all ready), "backward" (its end), "end" (the optimizer's)
        self.marks: dict | None = None
        for p in buckets.params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def _optimizer(self) -> Any:
        import torch
        # Fused: one pass over weights, gradients and momentum (run 16 on the H200: 3.56 ms for 1.08 G
        # bf16 parameters against foreach's 5.34). It runs after the last all-reduce, never beside one.
        return torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9, fused=True)

    def reset(self) -> None:
        """Back to the initial weights, with a fresh optimizer: every policy starts alike."""
        import torch
        with torch.no_grad():
            self.model.load_state_dict(self.initial)
        self.optimizer = self._optimizer()

    def _on_grad(self, param: Any) -> None:
        # Runs on autograd's thread, on the stream that produced the gradient (as DDP's hooks do).
        i = self.buckets.bucket_of[param]
        self._filled[i] += 1
        if self._filled[i] == self.buckets.counts[i]:
            self._mark("first bucket")
            if self._comm is not None and self._overlap:
                self._launch(i)

    def _mark(self, name: str) -> None:
        if self.marks is not None and name not in self.marks:
            import torch
            self.marks[name] = torch.cuda.Event(enable_timing=True)
            self.marks[name].record(torch.cuda.current_stream())

    def phases(self, marks: dict | None = None) -> dict:
        """ms from a step's start to its first full bucket, to the end of backward, and to the end
        (after the optimizer), once its events are done: of ``marks`` (a step's, kept from
        :attr:`marks`), else of the last step; needs ``marks = {}`` before the step."""
        marks = self.marks if marks is None else marks
        if marks is None:
            raise UsageError("phases() needs trainer.marks = {} before a step")
        missing = [k for k in ("start", "first bucket", "backward", "end") if k not in marks]
        if missing:
            raise UsageError(f"the step has no {', '.join(missing)} mark (\"first bucket\": no bucket had every "
                             "parameter's gradient)")
        marks["end"].synchronize()
        return {k: marks["start"].elapsed_time(e) for k, e in marks.items() if k != "start"}

    def _launch(self, i: int) -> None:
        import torch
        self._launched[i] = True
        self._events[i].record(torch.cuda.current_stream())
        if self._comm is not None:  # only launched during a step with communication
            self._comm.launch(i, self._events[i])

    def step(self, comm: NcclBuckets | None, overlap: bool = True) -> Any:
        """One step on the current torch stream; returns the loss (a tensor: no host sync).
        ``comm`` None: no communication (compute alone)."""
        import torch
        self._comm, self._overlap = comm, overlap
        self._filled = [0] * len(self.buckets.counts)
        self._launched = [False] * len(self.buckets.counts)
        if self.marks is not None:
            self.marks.clear()
        self._mark("start")
        self.buckets.zero()
        try:
            loss = self.model(*self.batch)
            loss.backward()
            self._mark("backward")
            self.buckets.check_views()  # every step: a launch during backward checked its own bucket
            if comm is not None:
                # Sequential: every bucket now. Overlapped: any bucket a parameter without a gradient
                # kept from filling (its zeros are all-reduced all the same, so ranks stay in step).
                for i, launched in enumerate(self._launched):
                    if not launched:
                        self._launch(i)
                comm.join(torch.cuda.current_stream())
        except BaseException:
            if comm is not None:  # what the all-reduces held beside compute (a carveout) ends with the step
                comm.release()
            raise
        finally:
            self._comm = None  # no hook launches anything after backward
        self.optimizer.step()
        self._mark("end")
        return loss.detach()
