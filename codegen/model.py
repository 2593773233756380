"""A whole :class:`polyc.program.Program` as one C translation unit, header and weights
layout. (For the build, the kernels are also dealt out over a few translation units
that gcc compiles in parallel and links into the same library:
:func:`polyc.codegen.model_c.translation_units`; the one unit stays what ``c_source``
shows and the ``.c`` file holds.)

The translation unit holds, in order: the header's declarations, the prelude once,
one ``static`` function per *distinct* kernel (steps whose kernels are equal up to the
names of their arrays share one function: ResNet repeats its layers), the weights
table, and the public functions::

    <m>_model *<m>_init(const char *weights_path)    reads + verifies the weights file
    int  <m>_run(const <m>_model *, inputs..., outputs...)
    int  <m>_run_with_workspace(const <m>_model *, void *workspace, inputs..., outputs...)
    void <m>_free(<m>_model *)
    const char *<m>_last_error(void)     why the calling thread's last run failed
    size_t <m>_workspace_size(void), and name/dtype/rank/shape queries

``run`` allocates the arena (:mod:`.memplan`) for the call and frees it, so concurrent
runs share nothing mutable. Each step is one call ``polyc_k<i>_<name>(buffers...)``
on pointers into the caller's inputs/outputs, the weights or the arena. An output
buffer is zeroed before its step only when its kernel reads the initial value of some
element (the kernel contract: outputs start at zero) -- see
:func:`.initial_values.reads_initial_values` (the analysis that also decides which kernel
temporaries are zeroed). The program's index checks (:class:`polyc.program.IndexCheck`)
run between the steps: a loop over the index buffer that, on a value out of range,
stops the run with status 4 and a message naming the node (``<m>_last_error``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import islpy as isl

from polyc import dtypes as D
from polyc import expr as E
from polyc.errors import InternalError
from polyc.ir import Access, Array, Kernel, Statement
from polyc.options import Options
from polyc.program import Program

from . import model_c, toolchain
from .c_expr import CTYPES, Namer, sanitize
from .c_family import CDialect, CFunction, generate_function
from .initial_values import reads_initial_values
from .memplan import MemoryPlan, lifetimes, plan_memory
from .weights import WeightsLayout, plan_weights

#: ``schedule(kernel) -> (kernel, schedule)``: the pipeline's stages check .. legality
Scheduler = Callable[[Kernel], "tuple[Kernel, isl.Schedule]"]


@dataclass(frozen=True)
class Tensor:
    """An input or output of the model's C API."""
    name: str  # the model's name
    cname: str  # the C parameter
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSource:
    """Everything generated for a model (no file written yet)."""
    name: str  # the C prefix
    text: str
    header: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    weights: WeightsLayout
    plan: MemoryPlan
    #: buffer -> storage: ("input"|"output", index) | ("weight", slot) | ("arena", offset)
    storage: dict[str, tuple[str, int]]
    #: (step index, function name) and the number of distinct functions
    calls: tuple[tuple[int, str], ...]
    functions: int
    #: the translation units the library is built from, compiled in parallel (one:
    #: ``text`` itself); ``text`` is the whole library in one unit, for reading
    units: tuple[str, ...] = ()
    #: target "cuda": per distinct operator, (its kernel after scheduling, its GPU
    #: kernels, its launches, the number of steps that run it), for the GPU report
    gpu_operators: tuple[tuple[Any, ...], ...] = ()


def generate_model(program: Program, schedule: Scheduler, options: Options | None = None,
                   *, name: str | None = None, dialect: CDialect | None = None,
                   progress: Callable[[str], None] | None = None,
                   jobs: int | None = None) -> ModelSource:
    """C for ``program``; ``schedule`` runs the pipeline's scheduling stages on a kernel
    (called once per distinct kernel). The kernels are split over ``jobs`` translation
    units (default: one per CPU this process may run on) for a parallel build."""
    options = options or Options()
    say = progress or (lambda _msg: None)
    prefix = sanitize(name or program.name or "model")
    storage, plan, layout, copies = _storage(program)
    say(f"planned memory: {plan.describe()}")
    functions, calls = _functions(program, schedule, options, dialect, say)
    inputs, outputs = _interface(program)
    zero = {i: [a for a, arr in zip(step.args, _arg_arrays(step.kernel))
                if arr.role == "output" and reads_initial_values(step.kernel, arr.name)]
            for i, step in enumerate(program.steps)}
    parts = model_c.Parts(prefix, program, inputs, outputs, storage, layout, plan, copies,
                          calls, zero, functions)
    text = model_c.translation_unit(parts)
    jobs = toolchain.build_jobs() if jobs is None else jobs
    units = model_c.translation_units(parts, jobs, text)
    return ModelSource(prefix, text, model_c.header(parts),
                       inputs, outputs, layout, plan, storage, tuple(calls), len(functions),
                       units)


# -- storage -----------------------------------------------------------------------------

def _storage(program: Program) -> tuple[dict[str, tuple[str, int]], MemoryPlan,
                                        WeightsLayout, list[tuple[int, str]]]:
    """Where each root buffer lives, the arena plan, the weights layout, and the outputs
    that need a memcpy (output index, source buffer)."""
    weights = [n for n, _ in program.weights]
    layout = plan_weights([(n, program.buffer(n).dtype, program.buffer(n).shape)
                           for n in weights])
    storage: dict[str, tuple[str, int]] = {n: ("weight", i) for i, n in enumerate(weights)}
    storage.update({n: ("input", i) for i, n in enumerate(program.inputs)})
    copies: list[tuple[int, str]] = []
    claimed: set[str] = set()
    # outputs that are their own storage first, then outputs that are views of temporaries
    for own in (True, False):
        for i, out in enumerate(program.outputs):
            root = program.root(out)
            if (root == out) != own or root in claimed:
                continue
            if root not in storage:
                storage[root] = ("output", i)
                claimed.add(root)
    for i, out in enumerate(program.outputs):
        if storage.get(program.root(out)) != ("output", i):
            copies.append((i, program.root(out)))
    uses = [(s, program.root(a)) for s, step in enumerate(program.steps) for a in step.args]
    end = len(program.steps)
    uses += [(end, root) for _, root in copies]
    sizes = {b.name: b.size * D.itemsize(b.dtype) for b in program.buffers
             if program.root(b.name) == b.name and b.name not in storage}
    plan = plan_memory(lifetimes(uses, sizes))
    storage.update({n: ("arena", off) for n, off in plan.offsets.items()})
    _check_writes(program, storage)
    return storage, plan, layout, copies


def _check_writes(program: Program, storage: dict[str, tuple[str, int]]) -> None:
    for s, step in enumerate(program.steps):
        for a, arr in zip(step.args, _arg_arrays(step.kernel)):
            kind = storage.get(program.root(a), ("?", 0))[0]
            if arr.role == "output" and kind in ("input", "weight"):
                raise InternalError(f"step {s} ({step.kernel.name}) writes {a!r}, whose "
                                    f"storage is a model {kind}")
            if kind == "?":
                raise InternalError(f"step {s} ({step.kernel.name}) uses {a!r}, which is "
                                    "never stored (not a buffer of the program?)")


def _arg_arrays(kernel: Kernel) -> list[Array]:
    return [kernel.array(a) for a in kernel.inputs + kernel.outputs]


def _interface(program: Program) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    namer = Namer({"model", "workspace"})
    def tensor(n: str) -> Tensor:
        b = program.buffer(n)
        return Tensor(n, namer.fresh(n), b.dtype, tuple(b.shape))
    return (tuple(tensor(n) for n in program.inputs),
            tuple(tensor(n) for n in program.outputs))


# -- kernels -----------------------------------------------------------------------------

def _functions(program: Program, schedule: Scheduler, options: Options,
               dialect: CDialect | None,
               say: Callable[[str], None]) -> tuple[list[CFunction], list[tuple[int, str]]]:
    """One function per distinct kernel; the function each step calls."""
    by_key: dict[str, CFunction] = {}
    calls: list[tuple[int, str]] = []
    total = len(program.steps)
    for s, step in enumerate(program.steps):
        key = kernel_key(step.kernel)
        fn = by_key.get(key)
        if fn is None:
            base = sanitize(step.kernel.name).rstrip("_") or "k"
            kernel, sched = schedule(step.kernel)
            fn = generate_function(kernel, sched, options, dialect,
                                   name=f"polyc_k{len(by_key)}_{base}", static=True)
            by_key[key] = fn
            say(f"[{s + 1}/{total}] {step.kernel.name}: scheduled and generated {fn.name}")
        else:
            say(f"[{s + 1}/{total}] {step.kernel.name}: same kernel as {fn.name}")
        calls.append((s, fn.name))
    return list(by_key.values()), calls


def kernel_key(kernel: Kernel) -> str:
    """Text that is equal for two kernels exactly when they differ only in the names of
    the kernel and its arrays (arrays renamed ``a0, a1...`` in signature order) and
    mark the same inputs constant."""
    order = list(kernel.inputs) + list(kernel.outputs) + [a.name for a in kernel.temporaries]
    new = {a: f"a{i}" for i, a in enumerate(order)}

    def expr(e: E.Expr) -> E.Expr:
        return E.map_expr(e, lambda x: E.Read(new[x.array], x.indices)
                          if isinstance(x, E.Read) else None)

    stmts = tuple(replace(s, write=Access(new[s.write.array], s.write.indices),
                          value=expr(s.value), origin="") for s in kernel.statements)
    arrays = tuple(replace(a, name=new[a.name]) for a in kernel.arrays)
    key = (arrays, tuple(new[i] for i in kernel.inputs),
           tuple(new[o] for o in kernel.outputs), kernel.sizes, kernel.fixed_sizes)
    if kernel.constants:  # (a key without them is the one earlier caches hold)
        key += (tuple(new[c] for c in kernel.constants if c in new),)
    parts = [repr(key),
             str(kernel.context)]
    parts += [_statement_key(s) for s in stmts]
    return "\n".join(parts)


def _statement_key(s: Statement) -> str:
    return repr((s.name, str(s.domain), s.iterators, s.write.array, s.write.indices, s.op,
                 s.value, s.kind))


def itemsize(dtype: str) -> int:
    return D.itemsize(dtype)


def ctype(dtype: str) -> str:
    return CTYPES[dtype]
