"""Every collective timed where it runs: ``{axis}-{op}`` phases for FSDP, TP, PP, MoE and more.

``install(tracer)`` hooks the two places every torch.distributed collective passes through from
Python, in whichever spelling the installed torch has (2.4 to 2.13):

- the ``ProcessGroup`` methods that ``torch.distributed``'s API calls (``all_reduce``,
  ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``, ``send``...,
  sync or ``async_op=True``; FSDP 1 and 2 and pipeline schedules call these), with
  ``Work.wait``: the collective lasts from its issue to the end of its wait;
- the functional collective operators, ``torch.ops._c10d_functional`` (and
  ``_c10d_functional_autograd``): what DTensor's tensor parallelism calls through
  ``funcol.all_reduce``... in eager mode, and what a compiled graph calls when dynamo traced
  a collective into it (an MoE layer's ``dist.all_to_all_single`` in a compiled forward).
  The Python callable behind each operator and its overloads is wrapped, so the graph's
  operators stay the objects torch knows; each lasts from its call to the end of the
  ``wait_tensor`` of its result.

A send or recv also names its peer (the global rank it exchanges data with), so that the
step record holds its time per peer and a slow link between two pipeline stages can be told
from the stages waiting for each other.

Each interval is recorded on the stream it was issued on (CUDA events on the current stream;
the host clock on CPU), so arrival skew is measured as for DDP's all-reduce. The time the
rank was blocked in the wait is also taken out of any phase it fell inside (FSDP's all-gather
inside forward): forward means forward's own compute.

Which axis? A group's name comes from, in order: ``register_group(group, axis)``; the named
dimensions of a ``DeviceMesh`` (``dp``, ``tp``, ``pp``, ``ep``; ``dp_shard``, ``dp_replicate``
and ``fsdp`` count as ``dp``), learned when the mesh is built (or, for meshes built before
``instrument``, found once among the process's objects); the default group (``dp`` when the
rank's coordinates put the whole world on the dp axis, else ``world``); any other group is
``pg``. Registering a group or building a named mesh also gives the rank its coordinate on
that axis (its rank in the group) unless ``ARGUS_COORDS`` set the coordinates.

Where the hooks' extension module loads (``_native/hooks.c``; ``ARGUS_NATIVE_HOOKS=0``
turns it off), the wrappers (but the point-to-point ones) are its C types and, on the host
clock, the tracer's recording is its C recorder (``Tracer.collective_recording``), which the
C wrappers call directly: the same calls on the same objects, without a Python frame of their
own.

Off (Argus disabled or ``ARGUS_COLLECTIVES=0``) nothing is patched. While torch.compile traces
or compiles (``torch.compiler.is_compiling``: AOT autograd calls the functional operators on
fake tensors), the wrappers call straight through; the graph's collectives are timed each
time it runs (not the functional point-to-point operators, ``isend``/``irecv``). Dynamo never
compiles a wrapper's own frame (its code is skipped, as torch skips its own files): code that
dynamo does not trace but runs inside a compiled call (FSDP1's hooks under torch.compile)
reaches the wrappers as plain Python, and its collectives are timed.
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from argus_exporters._native.extension import load_hooks
from argus_exporters.identity import AXES
from argus_exporters.imports import after_import
from argus_exporters.tracer import NO_PEER, Tracer

logger = logging.getLogger("argus_exporters")

# ProcessGroup method -> operation name, over the spellings of torch 2.4 to 2.13
PG_METHODS = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce",
    "allgather": "allgather", "_allgather_base": "allgather", "all_gather_single": "allgather",
    "allgather_coalesced": "allgather", "allgather_into_tensor_coalesced": "allgather",
    "all_gather_single_coalesced": "allgather",
    "reduce_scatter": "reducescatter", "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_single": "reducescatter", "reduce_scatter_tensor_coalesced":
    "reducescatter", "reduce_scatter_single_coalesced": "reducescatter",
    "alltoall": "alltoall", "alltoall_base": "alltoall", "all_to_all_single": "alltoall",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "send": "send", "recv": "recv", "recv_anysource": "recv", "barrier": "barrier",
}
# torch.ops namespaces of the functional collectives, and each operator -> operation name
FUNCTIONAL_OPS = {
    "_c10d_functional": {
        "all_reduce": "allreduce", "all_reduce_": "allreduce",
        "all_reduce_coalesced": "allreduce", "all_reduce_coalesced_": "allreduce",
        "all_gather_into_tensor": "allgather", "all_gather_into_tensor_out": "allgather",
        "all_gather_into_tensor_coalesced": "allgather",
        "reduce_scatter_tensor": "reducescatter", "reduce_scatter_tensor_out": "reducescatter",
        "reduce_scatter_tensor_coalesced": "reducescatter",
        "all_to_all_single": "alltoall", "broadcast": "broadcast", "broadcast_": "broadcast",
    },
    "_c10d_functional_autograd": {
        "all_gather_into_tensor": "allgather", "reduce_scatter_tensor": "reducescatter",
        "all_to_all_single": "alltoall",
    },
}
MESH_AXES = {"dp": "dp", "dp_shard": "dp", "dp_replicate": "dp", "fsdp": "dp", "ddp": "dp",
             "hsdp": "dp", "tp": "tp", "pp": "pp", "ep": "ep"}
OPS = frozenset(PG_METHODS.values())
POINT_TO_POINT = frozenset({"send", "recv"})  # methods whose second argument is the peer
# (its rank in the group); ``recv_anysource`` has none
_INHERITED = object()  # a patched attribute the owner did not define itself
MAX_PENDING = 4096  # issued collectives awaiting their wait; older ones are dropped, counted


def _held_weakly(group: Any) -> Callable[[], Any]:
    """A weak reference to ``group``, so that the caches never keep a process group alive:
    one outliving ``destroy_process_group`` is torn down with the interpreter, when its peers
    have gone, and gloo aborts the process at exit. (None, or an object that cannot be
    weakly referenced, is held as it is.)"""
    try:
        return weakref.ref(group)
    except TypeError:
        return lambda: group


class Collectives:
    """The installed hooks: group names, pending works and the tracer they report to."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer
        self.muted = 0  # > 0 while a collective is already timed (DDP's comm hook)
        # id(group) -> (weak reference to the group, names); and -> (reference, axis) for the
        # groups named by the application or a mesh
        self._names: dict[int, tuple[Callable[[], Any], dict[str, str]]] = {}
        self._axis_of: dict[int, tuple[Callable[[], Any], str]] = {}
        self._learned: dict[str, int] = {}  # axis -> this rank's coordinate on it
        # (id(group), rank in it) -> (weak reference to the group, its global rank)
        self._global: dict[tuple[int, int], tuple[Callable[[], Any], int]] = {}
        # group name -> (weak reference to the group, its names), forgotten with the names
        self._labelled: dict[str, tuple[Callable[[], Any], dict[str, str]]] = {}
        self.works: dict[int, Any] = {}  # id(work) -> PhaseToken of its collective
        self.tensors: dict[int, Any] = {}  # result's storage address -> PhaseToken (funcol)
        self._lock = threading.Lock()
        self.scanned = False  # meshes built before install were looked for
        self.patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, its own value or
        # _INHERITED)
        # the wrappers' extension module (_native/hooks.c), where it loads and is wanted,
        # and the tracer's recording the wrappers call (in C on the host clock with it)
        self.native = load_hooks() if tracer.settings.native_hooks else None
        self.begin, self.end = tracer.collective_recording(self.native)
        # the C wrappers hold the newest Work and the newest functional result apart from
        # ``works`` and ``tensors`` (found by identity at their wait, without a key and a
        # dictionary); empty otherwise
        native = self.native
        self.newest_work: Any = native.NewestPending() if native is not None else ()
        self.newest_result: Any = native.NewestPending() if native is not None else ()
        # (namespace, name) of the flag ``compiling`` returns, where it is one (the C
        # wrappers read it there instead of calling the check); found with the check
        self.compile_flag: tuple[dict[str, Any], str] | None = None

    def compiling(self) -> bool:
        """Whether torch.compile is tracing or compiling now (``_compiling``). The check is
        found at the first collective, when torch is whole: ``argus run`` installs the hooks
        while torch itself is importing, before ``torch.compiler`` exists. From then on this
        attribute is the check itself."""
        import torch

        self.compiling = check = _compiling(torch)  # type: ignore[method-assign]
        self.compile_flag = _compile_flag(torch)
        return check()

    def patch(self, owner: Any, attribute: str, replacement: Any) -> None:
        """Replace ``owner.attribute``, remembering the original for ``uninstall`` (the raw
        class attribute: a pybind method read with getattr would not bind again)."""
        self.patched.append((owner, attribute, vars(owner).get(attribute, _INHERITED)))
        setattr(owner, attribute, replacement)

    # -- naming ------------------------------------------------------------------------
    def names(self, group: Any) -> dict[str, str]:
        """Phase name per operation for collectives on ``group`` (cached per group)."""
        entry = self._names.get(id(group))
        if entry is not None and entry[0]() is group:
            return entry[1]
        named = self._axis_of.get(id(group))
        axis = named[1] if named is not None and named[0]() is group else self._default_axis(
            group)
        names = {op: f"{axis}-{op}" for op in OPS}
        self._names[id(group)] = (_held_weakly(group), names)
        return names

    def named(self, label: Any) -> dict[str, str]:
        """Phase name per operation for collectives on the group a functional operator's
        ``group_name`` argument names (the group itself where torch passes it, with
        ``dist.config.compile_on_one_rank``; looked up once per name and cached with the
        group's names; forgotten when a mesh or a registration renames a group)."""
        if not isinstance(label, str):  # the group itself (or None): cached by the group
            return self.names(label)
        entry = self._labelled.get(label)
        if entry is not None and entry[0]() is not None:
            return entry[1]
        group = _group_named(label)
        names = self.names(group)
        if group is not None:
            if len(self._labelled) >= MAX_PENDING:
                self._labelled.clear()
            self._labelled[label] = (_held_weakly(group), names)
        return names

    def peer(self, group: Any, group_rank: Any) -> int:
        """The global rank of ``group``'s rank ``group_rank`` (cached per group; NO_PEER
        when it cannot be told)."""
        try:
            key = (id(group), int(group_rank))
        except (TypeError, ValueError):
            return NO_PEER
        entry = self._global.get(key)
        if entry is not None and entry[0]() is group:
            return entry[1]
        try:
            import torch.distributed as dist

            found = int(dist.get_global_rank(group, key[1]))
        except Exception:  # not a registered group (a bare ProcessGroup): its own ranks
            found = key[1] if key[1] >= 0 else NO_PEER
        if len(self._global) >= MAX_PENDING:
            self._global.clear()
        self._global[key] = (_held_weakly(group), found)
        return found

    def _name_group(self, group: Any, axis: str) -> None:
        self._axis_of[id(group)] = (_held_weakly(group), axis)
        self._forget_names(group)

    def _forget_names(self, group: Any = None) -> None:
        """Name ``group`` (None: every group) afresh at its next collective."""
        if group is None:
            self._names.clear()
        else:
            self._names.pop(id(group), None)
        self._labelled.clear()
        if self.native is not None:  # the C wrappers remember their last group's name
            self.native.renamed()

    def _default_axis(self, group: Any) -> str:
        try:
            import torch.distributed as dist

            is_world = group is None or group is dist.GroupMember.WORLD or (
                group.size() == dist.get_world_size())
        except Exception:
            is_world = False
        if not is_world:
            return "pg"
        coords = self.tracer.identity.coords
        return "dp" if all(coords.get(a, 0) == 0 for a in AXES if a != "dp") else "world"

    def register(self, group: Any, axis: str, coordinate: int | None = None) -> None:
        """Name ``group``'s collectives ``{axis}-{op}`` and learn this rank's coordinate."""
        self._name_group(group, axis)
        if axis in AXES:
            if coordinate is None:
                try:
                    coordinate = int(group.rank())
                except Exception:
                    coordinate = None
            if coordinate is not None and coordinate >= 0:
                self._learn({axis: coordinate})

    def learn_mesh(self, mesh: Any) -> None:
        """Name a DeviceMesh's groups after its dimensions and learn the rank's coordinates."""
        names = getattr(mesh, "mesh_dim_names", None)
        if not names:
            return
        try:
            coordinate = mesh.get_coordinate()
            shape = tuple(mesh.mesh.shape)
        except Exception:
            return
        found: dict[str, int] = {}
        for dim, name in enumerate(names):
            axis = MESH_AXES.get(str(name).lower())
            if axis is None:
                continue
            try:
                group = mesh.get_group(dim)
            except Exception:  # a mesh without its process groups (``_init_backend=False``)
                group = None
            if group is not None:
                self._name_group(group, axis)
            if coordinate is not None:  # dimensions of one axis combine row-major
                found[axis] = found.get(axis, 0) * shape[dim] + int(coordinate[dim])
        if found:
            self._learn(found)

    def _learn(self, coords: dict[str, int]) -> None:
        if all(self._learned.get(a) == c for a, c in coords.items()):
            return
        self._learned.update(coords)
        identity = self.tracer.identity
        if identity.coords_given:
            return
        self._forget_names()  # the default group's axis may change with the coordinates
        self.tracer.update_coords({a: self._learned.get(a, 0) for a in AXES})

    # -- timing --------------------------------------------------------------------------
    def pending(self) -> int:
        """How many timed collectives await their wait (works, functional results)."""
        return (len(self.works) + len(self.tensors) + len(self.newest_work)
                + len(self.newest_result))

    def remember(self, pending: dict[int, Any], key: int, token: Any) -> None:
        """A collective was issued (``token``): its interval ends at the wait of ``key``."""
        if len(pending) >= MAX_PENDING:  # works nobody waits for (fire-and-forget sends)
            with self._lock:
                while len(pending) >= MAX_PENDING // 2:
                    try:
                        oldest = pending.pop(next(iter(pending)))
                    except (StopIteration, KeyError, RuntimeError):  # emptied meanwhile
                        break
                    self.tracer.drop_phase(oldest, "unwaited")
        pending[key] = token


_installed: Collectives | None = None
_install_lock = threading.Lock()
_DYNAMO = "torch._dynamo.eval_frame"
_unskipped: set[types.CodeType] = set()  # wrappers' code awaiting dynamo's import


def _never_compiled(wrapper: Callable) -> Callable:
    """Keep dynamo from compiling ``wrapper``'s frame (it runs as plain Python inside a
    compiled call, so it times what it wraps): now if torch.compile is loaded, else once it
    is. A torch without ``skip_code`` compiles it as before."""
    code = wrapper.__code__
    skip = getattr(sys.modules.get(_DYNAMO), "skip_code", None)
    if skip is not None:
        skip(code)
    elif code not in _unskipped:
        if not _unskipped:
            after_import(_DYNAMO, _skip_waiting)
        _unskipped.add(code)
    return wrapper


def _skip_waiting() -> None:
    skip = getattr(sys.modules.get(_DYNAMO), "skip_code", None)
    if skip is not None:
        for code in _unskipped:
            skip(code)
    _unskipped.clear()


def installed() -> Collectives | None:
    """The hooks in place in this process, or None."""
    return _installed


def install(tracer: Any) -> Collectives | None:
    """Patch torch.distributed's collectives to time them for ``tracer`` (once per process)."""
    global _installed
    if not getattr(tracer, "enabled", False) or not tracer.settings.collectives:
        return None
    with _install_lock:
        if _installed is not None:
            return _installed
        state = None
        try:
            import torch.distributed as dist

            if not dist.is_available():
                return None
            state = _installed = Collectives(tracer)
            _patch_process_group(state)
            _patch_device_mesh(state)
            # the functional operators: once their Python module is imported (never imported
            # from here: this may run while torch itself is importing)
            after_import("torch.distributed._functional_collectives",
                         lambda: _patch_functional(state))
        except Exception:  # never break training: it goes on with DDP's phases only
            logger.exception("argus: could not time collectives; only DDP's are recorded")
            if state is not None:
                _restore(state)
            _installed = None
            return None
        return state


def _restore(state: Collectives) -> None:
    for owner, attribute, original in reversed(state.patched):
        if original is _INHERITED:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, original)
    state.patched.clear()
    if state.native is not None:  # what they hold is nobody's to wait for now
        state.newest_work.clear()
        state.newest_result.clear()


def uninstall() -> None:
    """Put torch.distributed back as it was (benchmarks compare with and without). Left in
    place, the hooks of a closed tracer only call through."""
    global _installed
    with _install_lock:
        if _installed is not None:
            _restore(_installed)
            _installed = None


def _patch_process_group(state: Collectives) -> None:
    from torch._C._distributed_c10d import ProcessGroup, Work

    for method, op in PG_METHODS.items():
        original = getattr(ProcessGroup, method, None)
        if original is None or getattr(original, "_argus", False):
            continue
        state.patch(ProcessGroup, method, _timed_method(state, original, op,
                                                        method in POINT_TO_POINT))
    wait = Work.wait
    if getattr(wait, "_argus", False):
        return
    tracer, works = state.tracer, state.works
    end, mark = state.end, tracer.mark_now
    if state.native is not None:  # the same calls, no Python frame
        state.patch(Work, "wait", state.native.TimedWait(wait, works, mark, end,
                                                         newest=state.newest_work))
        return

    def timed_wait(work, *args, **kwargs):
        token = works.pop(id(work), None) if works else None
        if token is None:
            return wait(work, *args, **kwargs)
        waited_from = mark()  # now, on the current stream
        result = wait(work, *args, **kwargs)
        end(token, waited_from)
        return result

    timed_wait._argus = True  # type: ignore[attr-defined]
    state.patch(Work, "wait", _never_compiled(timed_wait))


def _compile_flag(torch: Any) -> tuple[dict[str, Any], str] | None:
    """Where the flag that ``_compiling``'s check returns lives: (namespace, name), or None
    where the check is more than one flag."""
    compiler = torch.compiler
    if (hasattr(compiler, "_compile_session_context")
            and isinstance(getattr(compiler, "_is_compiling_flag", None), bool)):
        return vars(compiler), "_is_compiling_flag"
    return None


def _compiling(torch: Any) -> Callable[[], bool]:
    """Whether torch.compile is tracing or compiling now. A torch with
    ``_compile_session_context`` (2.13) sets ``torch.compiler.is_compiling`` for the whole
    compile session; an older one (2.4) only inside the code dynamo traces, so the operators
    that dynamo's fake-tensor propagation and AOT autograd call also look for the tracing
    context they run in."""
    compiler = torch.compiler
    is_compiling = compiler.is_compiling
    if hasattr(compiler, "_compile_session_context"):
        if _compile_flag(torch) is not None:  # what it returns, read without a Python frame
            return functools.partial(getattr, compiler, "_is_compiling_flag")
        return is_compiling
    try:
        from torch._guards import TracingContext
    except ImportError:
        return is_compiling
    tracing = TracingContext.try_get
    return lambda: is_compiling() or tracing() is not None


def _timed_method(state: Collectives, original: Any, op: str,
                  point_to_point: bool = False) -> Any:
    works, cached = state.works, state._names
    begin, end = state.begin, state.end
    native = state.native
    if native is not None and not point_to_point:  # the same calls, no Python frame
        return native.TimedMethod(original, op, state, begin, end, state.remember, MAX_PENDING,
                                  state.newest_work)

    def timed(group, *args, **kwargs):
        if state.muted or state.compiling():
            return original(group, *args, **kwargs)
        if point_to_point:
            group_rank = args[1] if len(args) > 1 else kwargs.get(
                "dstRank", kwargs.get("srcRank"))
            peer = state.peer(group, group_rank)
        else:
            peer = NO_PEER
        entry = cached.get(id(group))  # ``state.names(group)``, its cache read here
        names = entry[1] if entry is not None and entry[0]() is group else state.names(group)
        token = begin(names[op], peer)
        work = original(group, *args, **kwargs)
        if token is not None:
            if work is None:
                end(token, None)
            elif len(works) < MAX_PENDING:
                works[id(work)] = token
            else:
                state.remember(works, id(work), token)
        return work

    timed._argus = True  # type: ignore[attr-defined]
    timed.__qualname__ = f"argus_timed({getattr(original, '__name__', op)})"
    return _never_compiled(timed)


def _patch_functional(state: Collectives) -> None:
    """Wrap the callable behind each functional collective operator and its overloads
    (``OpOverloadPacket._op``, ``OpOverload._op``): what funcol's functions and a compiled
    graph call."""
    import torch

    if _installed is not state:  # uninstalled before the functional module was imported
        return
    address = _storage_address(torch)
    for namespace, operators in (*FUNCTIONAL_OPS.items(), ("_c10d_functional",
                                                           {"wait_tensor": None})):
        for name, op in operators.items():
            try:
                packet = getattr(getattr(torch.ops, namespace), name)
                overloads = [getattr(packet, o) for o in packet.overloads()]
            except (AttributeError, RuntimeError):  # not in this torch
                continue
            for owner in (packet, *overloads):
                original = vars(owner).get("_op")
                if original is None or getattr(original, "_argus", False):
                    continue
                state.patch(owner, "_op", _timed_wait_tensor(state, original, address)
                            if op is None else _timed_operator(state, original, op, address))


def _timed_wait_tensor(state: Collectives, wait_tensor: Any,
                       address: Callable[[Any], int]) -> Any:
    """``wait_tensor`` that ends the collective whose result it waits for, if one is timed
    (found by the ``address`` of its storage)."""
    tensors = state.tensors
    end, mark = state.end, state.tracer.mark_now
    if state.native is not None:  # the same calls, no Python frame
        return state.native.TimedWait(wait_tensor, tensors, mark, end, key=address,
                                      newest=state.newest_result)

    def timed_wait_tensor(tensor, *args, **kwargs):
        token = tensors.pop(_storage(address, tensor), None) if tensors else None
        if token is None:
            return wait_tensor(tensor, *args, **kwargs)
        waited_from = mark()  # now, on the current stream
        result = wait_tensor(tensor, *args, **kwargs)
        end(token, waited_from)
        return result

    timed_wait_tensor._argus = True  # type: ignore[attr-defined]
    return _never_compiled(timed_wait_tensor)


def _timed_operator(state: Collectives, original: Any, op: str,
                    address: Callable[[Any], int]) -> Any:
    """A functional collective operator timed from its call to the ``wait_tensor`` of its
    result (of a list of results, the last one's; found by the ``address`` of its storage),
    its group read off its ``group_name`` argument (the last positional one)."""
    import torch

    tensors, tensor_type, labelled = state.tensors, torch.Tensor, state._labelled
    begin, end, named = state.begin, state.end, state.named
    if state.native is not None:  # the same calls, no Python frame
        return state.native.TimedOperator(original, op, state, begin, end, state.remember,
                                          MAX_PENDING, tensor_type, address,
                                          state.newest_result)

    def timed(*args, **kwargs):
        if state.muted or state.compiling():
            return original(*args, **kwargs)
        label = kwargs["group_name"] if "group_name" in kwargs else args[-1] if args else None
        entry = labelled.get(label)  # ``state.named(label)``, its cache read here
        token = begin((entry[1] if entry is not None and entry[0]() is not None
                       else named(label))[op])
        result = original(*args, **kwargs)
        if token is not None:
            last = result if type(result) is not list or not result else result[-1]
            if not isinstance(last, tensor_type):
                end(token, None)
            elif len(tensors) < MAX_PENDING:
                tensors[_storage(address, last)] = token
            else:
                state.remember(tensors, _storage(address, last), token)
        return result

    timed._argus = True  # type: ignore[attr-defined]
    return _never_compiled(timed)


def _storage_address(torch: Any) -> Callable[[Any], int]:
    """The address of a tensor's storage: the same for the views DTensor waits on as for the
    collective's result. ``torch._C._storage_address`` (one call, no object made) where this
    torch has it, else its untyped storage's data pointer."""
    address = getattr(torch._C, "_storage_address", None)
    if callable(address):
        return address
    return lambda tensor: tensor.untyped_storage().data_ptr()


def _storage(address: Callable[[Any], int], tensor: Any) -> int:
    """Where ``tensor``'s data lives (``address(tensor)``); its id where it has no storage."""
    try:
        return address(tensor)
    except Exception:
        return id(tensor)


def _group_named(name: str) -> Any:
    """The ProcessGroup registered under ``name`` (a functional operator's ``group_name``);
    None when there is none."""
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(name)
    except Exception:
        return None


def _patch_device_mesh(state: Collectives) -> None:
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:
        return
    init = DeviceMesh.__init__
    if getattr(init, "_argus", False):
        return

    def init_and_learn(self, /, *args, **kwargs):  # torch passes ``mesh=`` by keyword
        init(self, *args, **kwargs)
        try:
            state.learn_mesh(self)
        except Exception:  # never break building a mesh
            logger.exception("argus: could not read the device mesh's dimensions")

    init_and_learn._argus = True  # type: ignore[attr-defined]
    state.patch(DeviceMesh, "__init__", init_and_learn)


def learn_existing_meshes(state: Collectives | None) -> None:
    """Learn the DeviceMeshes built before ``install`` (the one-line ``instrument`` comes
    after the model is sharded): one pass over the garbage collector's objects, once."""
    if state is None or state.scanned:
        return
    state.scanned = True
    try:
        from torch.distributed.device_mesh import DeviceMesh

        # by type, not isinstance: the latter touches every object's ``__class__``, and
        # torch's deprecated ``reduce_op`` warns when it is touched
        meshes = [o for o in gc.get_objects() if issubclass(type(o), DeviceMesh)]
    except Exception:
        return
    for mesh in meshes:
        try:
            state.learn_mesh(mesh)
        except Exception:
            logger.exception("argus: could not read a device mesh's dimensions")
