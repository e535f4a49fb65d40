"""Framework hooks: forward, backward and optimizer phases for free, and timed collectives.

``instrument(model, optimizer)`` registers module and optimizer hooks:
- forward: the model's forward pre-hook and forward hook;
- backward: from the moment the gradient of the model's output arrives (a tensor hook on the
  output) until the autograd engine finishes the pass (a callback queued on the engine, the
  mechanism DDP itself uses), so it covers the whole backward including DDP's overlap;
- optimizer: the optimizer's step pre- and post-hooks; the post-hook also closes the step.
Communication is timed on the stream the collective runs on: ``ddp_comm_hook`` wraps a DDP
communication hook and ends the phase in the future's callback, which CUDA runs after the
NCCL work; ``end_when_done`` does the same for any ``async_op=True`` work handle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from argus_exporters.tracer import NoOpTracer, Tracer


def instrument(model: Any, optimizer: Any, tracer: Tracer | NoOpTracer) -> list[Any]:
    """Register the hooks; returns their handles (call ``.remove()`` on each to undo)."""
    if not tracer.enabled:
        return []
    handles = []
    state: dict[str, Any] = {}

    def forward_pre(module, args):
        state["forward"] = tracer.begin_phase("forward")

    def forward_post(module, args, output):
        tracer.end_phase(state.pop("forward", None))
        tensor = _first_tensor(output)
        if tensor is not None and tensor.requires_grad:
            tensor.register_hook(_backward_started)
        return None

    def _backward_started(grad):
        if "backward" in state:  # several outputs: the first gradient starts the phase
            return grad
        state["backward"] = tracer.begin_phase("backward")
        import torch

        torch.autograd.Variable._execution_engine.queue_callback(_backward_finished)
        return grad

    def _backward_finished():
        tracer.end_phase(state.pop("backward", None))

    handles.append(model.register_forward_pre_hook(forward_pre))
    handles.append(model.register_forward_hook(forward_post))
    if optimizer is not None:
        handles += instrument_optimizer(optimizer, tracer)
    return handles


def instrument_optimizer(optimizer: Any, tracer: Tracer | NoOpTracer) -> list[Any]:
    """Optimizer phase and the step boundary from the optimizer's step hooks."""
    if not tracer.enabled:
        return []
    state: dict[str, Any] = {}

    def pre(opt, args, kwargs):
        state["optimizer"] = tracer.begin_phase("optimizer")

    def post(opt, args, kwargs):
        tracer.end_phase(state.pop("optimizer", None))
        tracer.step()

    return [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]


def _first_tensor(output: Any):
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, list | tuple):
        for item in output:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def ddp_comm_hook(tracer: Tracer | NoOpTracer, hook: Callable | None = None,
                  phase: str = "dp-allreduce") -> Callable:
    """Wrap a DDP communication hook (default: plain all-reduce) to time it as ``phase``.

    ``ddp_model.register_comm_hook(state=None, hook=ddp_comm_hook(tracer))``. Buckets of one
    step add up into one phase time.
    """
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        hook = allreduce_hook

    def timed(state, bucket):
        token = tracer.begin_phase(phase)
        future = hook(state, bucket)

        def finished(fut):
            tracer.end_phase(token)
            return fut.value()

        return future.then(finished)

    return timed


def end_when_done(tracer: Tracer | NoOpTracer, token: Any, work: Any) -> Any:
    """End a phase when an ``async_op=True`` collective completes; returns ``work``.

    ``token = tracer.begin_phase("tp-allgather"); work = dist.all_gather(..., async_op=True);
    end_when_done(tracer, token, work)``. The future's callback runs after the collective's
    work on its own stream, so the end mark is taken there.
    """
    if token is None or not tracer.enabled:
        return work
    work.get_future().then(lambda fut: tracer.end_phase(token))
    return work
