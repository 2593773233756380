"""The user-facing API: ``define`` a TC operator, call it on numpy arrays; ``einsum``.

An :class:`Operator` holds the generic kernel (sizes symbolic). A call binds the sizes
from its arrays and, by default (``Options.specialize``), compiles code specialised to
those sizes, cached per size signature as Tensor Comprehensions does; with
``specialize=False`` one library takes the sizes as parameters.
"""
from __future__ import annotations

import threading
from typing import Any

import islpy as isl
import numpy as np

from . import pipeline
from .codegen.runtime import MAX_CALL_PLANS, call_signature, check_array_sizes
from .errors import CallError
from .ir import Kernel
from .options import Options


class Operator:
    """A compiled-on-demand operator. Call it with numpy arrays (inputs in signature order)."""

    def __init__(self, kernel: Kernel, options: Options | None = None):
        self.kernel = kernel
        self.options = options or Options()
        self._compiled: dict[tuple[int, ...], pipeline.Compiled] = {}
        #: call signature -> (the library, the sizes it binds): see :func:`call_signature`
        self._calls: dict[tuple, tuple[pipeline.Compiled, dict[str, int]]] = {}
        self._last: pipeline.Compiled | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.kernel.inputs

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.kernel.outputs

    def compiled_for(self, sizes: dict[str, int]) -> pipeline.Compiled:
        """The library for these sizes (compiled once per size signature): a value for
        each of the kernel's sizes (:class:`CallError` naming the missing ones); values
        for names that are no size of the kernel are ignored."""
        missing = [s for s in self.kernel.sizes if s not in sizes]
        if missing:
            raise CallError(f"{self.kernel.name}: compiled_for takes a value for each of its "
                            f"sizes {list(self.kernel.sizes)}; missing: {missing}")
        sizes = {s: sizes[s] for s in self.kernel.sizes}
        key = tuple(sizes[s] for s in self.kernel.sizes) if self.options.specialize else ()
        with self._lock:
            found = self._compiled.get(key)
            if found is None:
                # before compiling for these sizes: an output too big for the machine is
                # refused at once (each call checks its temporaries too, in the runtime)
                check_array_sizes(self.kernel, sizes, self.kernel.outputs)
                kernel = self.kernel.specialize(sizes) if self.options.specialize else self.kernel
                found = pipeline.compile_kernel(kernel, self.options)
                self._compiled[key] = found
            self._last = found
            return found

    def __call__(self, *inputs: Any, sizes: dict[str, int] | None = None) -> Any:
        """Run on ``inputs`` (numpy arrays, in signature order). ``sizes`` gives sizes that
        no input dimension determines (e.g. a ``where i in 0:M`` range). With
        ``target="cuda"``, inputs may be device arrays (``__cuda_array_interface__``,
        DLPack, :class:`polyc.DeviceArray`): the operator then runs on them without
        copies and returns :class:`polyc.DeviceArray` outputs."""
        key = call_signature(inputs, sizes)
        hit = self._calls.get(key) if key is not None else None
        if hit is None:
            arrays = pipeline.check_inputs(self.kernel, inputs,
                                           device=self.options.target == "cuda")
            bound = pipeline.bind_sizes(self.kernel, arrays, sizes)
            compiled = self.compiled_for(bound)
            if key is not None:  # the same shapes and dtypes bind the same sizes
                if len(self._calls) >= MAX_CALL_PLANS:
                    self._calls.clear()
                self._calls[key] = (compiled, bound)
        else:
            (compiled, bound), arrays = hit, inputs
            self._last = compiled
        outs = compiled.run(arrays, bound, key)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def schedule_space(self, sizes: dict[str, int] | None = None,
                       auto: bool | dict[str, Any] = False) -> Any:
        """The operator's schedule as an editable, immutable
        :class:`polyc.schedule.space.ScheduleSpace` (source order; ``sizes`` fixes the
        sizes it is checked for; ``auto=True``, or a dict of schedule options such as
        ``{"scheduler": "pluto"}``: the schedule polyc's passes choose, see
        :meth:`~polyc.schedule.space.ScheduleSpace.auto`). Edit it with its primitives
        (``tile``, ``skew``, ``parallel``...), then run it with :meth:`with_schedule`."""
        from .schedule.space import ScheduleSpace
        kernel = self.kernel.specialize(sizes) if sizes else self.kernel
        space = ScheduleSpace.default(kernel)
        if auto is not False:
            space = space.auto(auto if isinstance(auto, dict) else None)
        return space

    def with_schedule(self, schedule: Any) -> Operator:
        """This operator compiled with ``schedule``: a ScheduleSpace, or a ScheduleTrace
        (:func:`polyc.load_schedule`), replayed on every size it is compiled for."""
        from .schedule.space import ScheduleSpace, ScheduleTrace
        checked = isinstance(schedule, ScheduleSpace)  # every step was checked already
        if checked:
            schedule = schedule.trace()
        if not isinstance(schedule, ScheduleTrace):
            raise TypeError(f"with_schedule takes a ScheduleSpace or ScheduleTrace, got "
                            f"{type(schedule).__name__}")
        text = schedule.to_json()
        if not checked:  # a loaded trace: refused now, not at the first call
            pipeline.user_schedule(self.kernel, text)
        return self._with_options(self.options.replace(schedule=text))

    def _with_options(self, options: Options) -> Operator:
        return Operator(self.kernel, options)

    def _shown(self) -> pipeline.Compiled:
        if self._last is None:
            self._last = pipeline.compile_kernel(self.kernel, self.options.replace(specialize=False),
                                                 build=False)
        return self._last

    @property
    def c_source(self) -> str:
        """The C of the last call's library (or of the generic kernel before any call)."""
        return self._shown().c_source

    @property
    def cuda_source(self) -> str:
        """The ``.cu`` of the last call's library (target ``"cuda"``)."""
        return self._shown().cuda_source

    @property
    def gpu_report(self) -> Any:
        """The static GPU report of :attr:`cuda_source` (:mod:`polyc.codegen.gpu_report`):
        per kernel the grid and block, the coalescing of every global access, ptxas's
        registers, shared memory and spills, and the theoretical occupancy."""
        return self._shown().gpu_report

    @property
    def schedule(self) -> isl.Schedule:
        """The isl schedule tree that produced :attr:`c_source`."""
        return self._shown().schedule

    def __repr__(self) -> str:
        return f"<polyc.Operator {self.name}({', '.join(self.input_names)}) -> " \
               f"({', '.join(self.output_names)})>"


def define(source: str, name: str | None = None, options: Options | None = None,
           **option_values: Any) -> Operator:
    """Compile-on-demand operator from TC-language ``source`` (``name`` picks a ``def``).

    Options may be given as an :class:`Options` object or as keywords
    (``fusion="min"``, ``tile=(32, 64, 512)``, ``threads=2``...).
    """
    from .frontend import from_tc
    options = _options(options, option_values)
    return Operator(from_tc(source, name), options)


def einsum(spec: str, *operands: Any, options: Options | None = None,
           **option_values: Any) -> np.ndarray:
    """``numpy.einsum(spec, *operands)`` through the polyc pipeline (compiled once per spec,
    dtypes and shapes, and cached)."""
    options = _options(options, option_values)
    arrays = [np.asarray(x) for x in operands]
    key = (spec, tuple(str(a.dtype) for a in arrays), tuple(a.ndim for a in arrays), options)
    op = _EINSUM_CACHE.get(key)
    if op is None:
        from .frontend import from_einsum
        op = Operator(from_einsum(spec, [str(a.dtype) for a in arrays], [a.ndim for a in arrays]),
                      options)
        _EINSUM_CACHE[key] = op
    return op(*arrays)


_EINSUM_CACHE: dict[tuple[Any, ...], Operator] = {}


def _options(options: Options | None, values: dict[str, Any]) -> Options:
    base = options or Options()
    return base.replace(**values) if values else base


class ScopOperator(Operator):
    """A C function's ``#pragma scop`` region (:func:`scop`), called like the C function:
    ``op(T=5, N=33, A=a, B=b)`` (or positionally, in the C parameter order). The arrays
    the region writes are updated in place, as the C would, and returned."""

    def __init__(self, scop: Any, options: Options | None = None):
        super().__init__(scop.kernel, options)
        self.scop = scop

    def _with_options(self, options: Options) -> Operator:
        return ScopOperator(self.scop, options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .codegen.runtime import NUMPY_DTYPES
        from .errors import CallError
        from . import expr as E
        params = self.scop.params
        if len(args) > len(params):
            raise CallError(f"{self.name} takes {len(params)} parameters, got {len(args)}")
        given = dict(zip((p.name for p in params), args))
        for k, v in kwargs.items():
            if k in given:
                raise CallError(f"{self.name}: parameter {k!r} given twice")
            if k not in {p.name for p in params}:
                raise CallError(f"{self.name} has no parameter {k!r} (parameters: "
                                f"{', '.join(p.name for p in params)})")
            given[k] = v
        missing = [p.name for p in params if p.name not in given]
        if missing:
            raise CallError(f"{self.name}: missing parameter(s) {', '.join(missing)}")
        sizes = {p.name: int(given[p.name]) for p in params if p.kind == "size"}
        kernel = self.kernel
        for p in params:
            if p.kind != "array" or p.name not in {a.name for a in kernel.arrays}:
                continue
            x, arr = given[p.name], kernel.array(p.name)
            shape = tuple(E.evaluate(d, sizes) for d in arr.shape)
            want = NUMPY_DTYPES[arr.dtype]
            if not isinstance(x, np.ndarray) or x.dtype != want or x.shape != shape:
                got = f"{x.dtype}{list(x.shape)}" if isinstance(x, np.ndarray) else type(x).__name__
                raise CallError(f"{self.name}: parameter {p.name!r} must be a {want}"
                                f"{list(shape)} array with {sizes}, got {got}")
        outs = [given[n] for n in kernel.outputs]
        inputs = [given[n] for n in kernel.inputs]
        self.compiled_for(sizes).function(inputs, sizes, outputs=outs)
        return outs[0] if len(outs) == 1 else tuple(outs)


def scop(source: str, function: str | None = None, options: Options | None = None,
         **option_values: Any) -> ScopOperator:
    """The ``#pragma scop`` region of the C ``function`` in ``source`` as an operator
    (see :mod:`polyc.frontend.scop`); its schedule space and every primitive work as for
    a TC operator."""
    from .frontend.scop import from_scop
    return ScopOperator(from_scop(source, function), _options(options, option_values))

