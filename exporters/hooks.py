"""Framework hooks: forward, backward and optimizer phases for free, and timed collectives.

``instrument(model, optimizer)`` registers module and optimizer hooks:
- forward: the model's forward pre-hook and forward hook;
- backward: from the moment the gradient of the model's output arrives (a tensor hook on the
  output) until the autograd engine finishes the pass (a callback queued on the engine, the
  mechanism DDP itself uses), so it covers the whole backward including DDP's overlap;
- optimizer: the optimizer's step pre- and post-hooks; the post-hook also closes the step;
- every collective the job issues is timed as ``{axis}-{op}`` (``collectives.py``: FSDP's
  all-gathers and reduce-scatters, tensor-parallel all-reduces, pipeline sends, all-to-all),
  and the time waited for it is taken out of the phase it ran inside;
- a ``DistributedDataParallel`` model also gets its gradient all-reduce timed as
  ``dp-allreduce``: Argus registers DDP's default all-reduce hook, timed, just before the
  first forward, unless the application registers a hook of its own (then that hook is timed:
  a ``register_comm_hook`` call after ``instrument`` is wrapped) or registered one before
  (left alone, with a log line saying how to time it).
Communication is timed on the stream the collective runs on: ``ddp_comm_hook`` wraps a DDP
communication hook and ends the phase in the future's callback, which CUDA runs after the
NCCL work; ``end_when_done`` does the same for any ``async_op=True`` work handle. A step's
buckets make one ``dp-allreduce`` interval, from the first bucket's start to the last one's end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from argus_exporters import collectives
from argus_exporters.tracer import NoOpTracer, Tracer

logger = logging.getLogger("argus_exporters")
_TIMED = "_argus_timed"  # marks a comm hook that already times itself


def instrument(model: Any, optimizer: Any, tracer: Tracer | NoOpTracer) -> list[Any]:
    """Register the hooks; returns their handles (call ``.remove()`` on each to undo).

    ``model`` may be already compiled (``torch.compile(model)``): its hooks run in eager mode
    around the compiled module, and a DDP module inside it gets its comm hook."""
    if not tracer.enabled:
        return []
    collectives.learn_existing_meshes(collectives.install(tracer))
    _compiling()  # bound now, in eager mode: never first looked up while dynamo traces
    handles = []
    eager: list[Callable] = []  # pre-hooks a compiled wrapper of the model runs for it
    inner = getattr(model, "_orig_mod", model)  # given torch.compile(model): the module in it
    if _is_ddp(inner):
        handles += instrument_ddp_comm(inner, tracer, eager)
        if inner is not model:  # dynamo traces the module's hooks: the wrapper runs them
            handles += [model.register_forward_pre_hook(pre) for pre in eager]
    state: dict[str, Any] = {"depth": 0}

    def forward_pre(module, args):
        if _compiling():  # traced by dynamo: the compiled wrapper's hooks time it instead
            return
        state["depth"] += 1
        if state["depth"] == 1:  # the wrapper and the model both run it: the outer one times
            state["forward"] = tracer.begin_phase("forward")

    def forward_post(module, args, output):
        if _compiling():
            return None
        state["depth"] = max(state["depth"] - 1, 0)
        if state["depth"]:
            return None
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

    eager.append(forward_pre)
    handles.append(model.register_forward_pre_hook(forward_pre))
    handles.append(model.register_forward_hook(forward_post, always_call=True))
    model._argus_eager_hooks = (eager, forward_post)
    _hook_compiled_wrappers()
    if optimizer is not None:
        handles += instrument_optimizer(optimizer, tracer)
    return handles


def _compiling() -> bool:
    """Whether dynamo is tracing (``torch.compiler.is_compiling``, looked up once)."""
    global _is_compiling
    if _is_compiling is None:
        from torch.compiler import is_compiling

        _is_compiling = is_compiling
    return _is_compiling()


_is_compiling = None  # torch.compiler.is_compiling, bound on first use (torch loads late)


def _hook_compiled_wrappers() -> None:
    """``torch.compile(model)`` after ``instrument``: dynamo traces the model's own hooks
    (which then do nothing: no graph breaks), so its wrapper gets them, run in eager mode."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:
        return
    init = OptimizedModule.__init__
    if getattr(init, "_argus", False):
        return

    def init_and_hook(wrapper, mod, *args, **kwargs):
        init(wrapper, mod, *args, **kwargs)
        found = mod.__dict__.get("_argus_eager_hooks")
        if found is not None:
            pre_hooks, post = found
            for pre in pre_hooks:
                wrapper.register_forward_pre_hook(pre)
            wrapper.register_forward_hook(post, always_call=True)

    init_and_hook._argus = True  # type: ignore[attr-defined]
    OptimizedModule.__init__ = init_and_hook


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

    ``ddp_model.register_comm_hook(state=None, hook=ddp_comm_hook(tracer))``. A step's
    buckets make one interval, from the first bucket's start to the last one's end (each
    bucket's own interval includes its queue behind the earlier ones: their sum could exceed
    the step).
    """
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        hook = allreduce_hook
    if getattr(hook, _TIMED, False):
        return hook

    def timed(state, bucket):
        token = tracer.begin_phase(phase, span=True)
        timing = collectives.installed()  # the bucket's collective is timed here, not twice
        if timing is None:
            future = hook(state, bucket)
        else:
            timing.muted += 1
            try:
                future = hook(state, bucket)
            finally:
                timing.muted -= 1

        def finished(fut):
            tracer.end_phase(token)
            return fut.value()

        return future.then(finished)

    setattr(timed, _TIMED, True)
    timed.__qualname__ = f"argus_timed({getattr(hook, '__qualname__', 'hook')})"
    return timed


def _is_ddp(model: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(model, DistributedDataParallel)


def instrument_ddp_comm(model: Any, tracer: Tracer | NoOpTracer,
                        eager: list[Callable] | None = None) -> list[Any]:
    """Time a DistributedDataParallel model's gradient communication as ``dp-allreduce``.

    A hook the application registers later (``model.register_comm_hook``) is wrapped so it is
    timed; if it registers none, DDP's default all-reduce is registered, timed, just before
    the first forward; one registered before this call is left alone (DDP allows one hook),
    with a log line. Returns a handle whose ``remove()`` undoes the interception.
    """
    existing = list(getattr(model, "_comm_hooks", []))
    if existing:
        if not all(getattr(hook, _TIMED, False) for hook, _ in existing):
            logger.warning("argus: this DDP model already has a communication hook (%s); it "
                           "is left as is and dp-allreduce is not timed. Register it as "
                           "argus_exporters.ddp_comm_hook(your_hook) to time it.",
                           ", ".join(getattr(h, "__qualname__", "?") for h, _ in existing))
        return []
    original = model.register_comm_hook
    state = {"registered": False, "tried": False}

    def register_comm_hook(hook_state: object, hook: Callable) -> None:
        state["registered"] = True
        if not getattr(hook, _TIMED, False):
            logger.info("argus: timing the application's DDP comm hook %s as dp-allreduce",
                        getattr(hook, "__qualname__", "?"))
        original(hook_state, ddp_comm_hook(tracer, hook))

    def before_first_forward(module, args):
        if state["tried"] or _compiling():  # traced: its compiled wrapper registers
            return
        state["tried"] = True
        handle.remove()
        if state["registered"] or getattr(model, "_comm_hooks", []):
            return
        try:
            original(None, ddp_comm_hook(tracer))
            state["registered"] = True
        except RuntimeError as exc:  # a built-in hook (fp16 compression) is already set
            logger.warning("argus: could not time DDP communication (%s); dp-allreduce is "
                           "not recorded", exc)

    model.register_comm_hook = register_comm_hook
    handle = model.register_forward_pre_hook(before_first_forward)
    if eager is not None:
        eager.append(before_first_forward)
    return [_Restore(model, "register_comm_hook", handle)]


class _Restore:
    """Undo an instance attribute override (and remove a hook) on ``remove()``."""

    def __init__(self, obj: Any, attribute: str, handle: Any):
        self.obj, self.attribute, self.handle = obj, attribute, handle

    def remove(self) -> None:
        self.obj.__dict__.pop(self.attribute, None)
        self.handle.remove()


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
