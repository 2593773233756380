"""Whole ONNX models compiled into one C library, called from Python.

    m = polyc.compile_onnx("model.onnx")          # or an onnx.ModelProto
    outputs = m.run(None, {"input": x})           # as onnxruntime's InferenceSession.run
    y, = m(x)                                     # positional form

The stages (each a function of the previous result)::

    model --load_graph--> Graph --optimize_graph--> Graph --lower_graph--> Program
          --generate_model (schedule each distinct kernel)--> C + header + weights layout
          --write_model_files (gcc, cached)--> .so .h .c .weights --ModelLibrary--> run

:func:`build_model` starts from a :class:`polyc.program.Program` (the frontend's output,
or one written by hand).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import pipeline, tune
from .coalesce import coalesce_elementwise
from .codegen.model import ModelSource, generate_model, kernel_key
from .codegen.model_runtime import ModelLibrary, check_array, write_model_files
from .errors import RunError as RunError  # re-exported: run's error
from .codegen.weights import weights_bytes
from .errors import CallError, CompileError
from .ir import Kernel
from .options import Options
from .program import Program
from .schedule import machine

Progress = Callable[[str], None]


def progress_printer(progress: bool | Progress | None) -> Progress | None:
    if progress is True:
        start = time.perf_counter()
        return lambda msg: print(f"polyc [{time.perf_counter() - start:6.1f}s] {msg}",
                                 file=sys.stderr, flush=True)
    return progress or None


class CompiledModel:
    """A model compiled into a shared library, loaded and initialised.

    :attr:`input_names`/:attr:`output_names` are the model's names, in graph order;
    :attr:`library_path`, :attr:`header_path`, :attr:`weights_path` and
    :attr:`source_path` the files (``output_dir`` when given, else the cache);
    :attr:`c_source` the C; :attr:`arena_bytes` the workspace one run allocates.
    """

    def __init__(self, source: ModelSource, program: Program, library_path: str,
                 header_path: str, weights_path: str, source_path: str, loaded_path: str,
                 library_class: type[ModelLibrary] = ModelLibrary,
                 options: Options | None = None):
        self.source, self.program = source, program
        self.options = options or Options()
        self.library_path, self.header_path = library_path, header_path
        self.weights_path, self.source_path = weights_path, source_path
        self._library = library_class(loaded_path, source, weights_path)
        counts = program.counts()
        self._outputs = tuple(t for t in source.outputs if t.name not in counts)
        self._output_index = {t.name: i for i, t in enumerate(self._outputs)}
        # outputs whose extent depends on data: (output index, axis, index of its count)
        where = {t.name: i for i, t in enumerate(source.outputs)}
        self._extents = tuple((where[o], axis, where[c]) for o, axis, c in program.extents)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.source.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self._outputs]

    @property
    def dynamic_outputs(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """The outputs whose extent depends on the data (NonZero, Unique...): name ->
        (the axis, the shape at most). In C they are written at that shape, with their
        counts as more outputs (see the header); :meth:`run` cuts them to size."""
        return {self.source.outputs[i].name: (axis, tuple(self.source.outputs[i].shape))
                for i, axis, _ in self._extents}

    def _finish(self, outs: list[np.ndarray]) -> list[np.ndarray]:
        """The library's outputs with the dynamic ones cut to their counts, and without
        the counts."""
        if not self._extents:
            return outs
        for i, axis, c in self._extents:
            n = int(outs[c].reshape(-1)[0])
            cut = (slice(None),) * axis + (slice(0, n),)
            outs[i] = np.ascontiguousarray(outs[i][cut])
        counts = {c for _, _, c in self._extents}
        return [o for k, o in enumerate(outs) if k not in counts]

    @property
    def c_source(self) -> str:
        return self.source.text

    @property
    def header(self) -> str:
        return self.source.header

    @property
    def arena_bytes(self) -> int:
        return self.source.plan.arena_bytes

    @property
    def gpu_report(self) -> Any:
        """Target ``"cuda"``: the static GPU report of every distinct operator's kernels
        (:class:`polyc.codegen.gpu_report.ModelGpuReport`): mapping, shared memory,
        register tiles, coalescing, bank conflicts, ptxas figures, occupancy."""
        if not self.source.gpu_operators:
            raise CompileError("this model was compiled for the C target (target='cuda' "
                               "has a GPU report)")
        from .codegen.gpu_report import model_report
        built = None if self.options.emulate else self.library_path
        return model_report(self.source, self.options, built)

    def run(self, output_names: Sequence[str] | None,
            input_feed: Mapping[str, Any]) -> list[np.ndarray]:
        """The outputs named by ``output_names`` (all, in graph order, for None) computed
        from ``input_feed`` (input name -> numpy array of the exact dtype and shape).

        Raises :class:`RunError` (a :class:`polyc.CallError`) when an input value is out
        of range -- an index a Gather reads at run time -- naming the node."""
        outs = self._finish(self._library.run_feed(input_feed))
        if output_names is None:
            return outs
        if isinstance(output_names, str):
            raise CallError("output_names must be a list of names (or None), not a string")
        index = self._output_index
        unknown = [n for n in output_names if n not in index]
        if unknown:
            raise CallError(f"unknown output(s) {unknown}; the model's outputs are "
                            f"{self.output_names}")
        return [outs[index[n]] for n in output_names]

    def __call__(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        """Positional form: the inputs in graph order; every output, as a tuple."""
        specs = self._library._input_specs
        if len(inputs) != len(specs):
            raise CallError(f"{self.name} takes {len(self.source.inputs)} inputs "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        for x, (_, dtype, shape) in zip(inputs, specs):
            if type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape:
                break
            flags = x.flags
            if not (flags.c_contiguous and flags.aligned):
                break
        else:
            return tuple(self._finish(self._library.run(inputs)))
        arrays = [check_array(t, x, f"input {t.name!r} (argument {i})")
                  for i, (t, x) in enumerate(zip(self.source.inputs, inputs))]
        return tuple(self._finish(self._library.run(arrays)))

    def close(self) -> None:
        """Free the model's weights now (later calls raise :class:`polyc.CallError`)."""
        self._library.close()

    def __repr__(self) -> str:
        def show(ts: Sequence[Any]) -> str:
            return ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in ts)
        return f"<polyc.CompiledModel {self.name}({show(self.source.inputs)}) -> " \
               f"({show(self._outputs)})>"


def build_model(program: Program, options: Options | None = None, *, name: str | None = None,
                output_dir: str | None = None,
                progress: bool | Progress | None = False) -> CompiledModel:
    """Generate, build, write and load the library of ``program``.

    ``name`` (sanitised) prefixes every C symbol and names the files (default: the
    program's name); ``output_dir`` receives ``<name>.so/.h/.c/.weights`` (default: they
    stay in the cache).
    """
    options = options or Options()
    say = progress_printer(progress)
    if options.target == "cuda":
        return _build_cuda_model(program, options, name, output_dir, say)
    source = model_source(program, options, name=name, progress=say)
    if say:
        say(f"{len(program.steps)} steps, {source.functions} distinct kernels; compiling C")
    blob = weights_bytes(source.weights, [v for _, v in program.weights])
    files, cached = write_model_files(source, blob, options, output_dir)
    if say:
        say(f"built {files.library} ({source.plan.describe()})")
    return CompiledModel(source, program, files.library, files.header, files.weights,
                         files.source, cached)


def _build_cuda_model(program: Program, options: Options, name: str | None,
                      output_dir: str | None, say: Progress | None) -> CompiledModel:
    """Target ``"cuda"``: one ``.cu`` (:mod:`polyc.codegen.cuda_model`) built by nvcc, or
    by g++ with the CPU emulation when ``options.emulate``."""
    from .codegen.cuda_model import write_cuda_model_files
    from .codegen.cuda_runtime import CudaModelLibrary
    source = model_source(program, options, name=name, progress=say)
    if say:
        say(f"{len(program.steps)} steps, {source.functions} distinct operators; compiling "
            + ("for the CPU emulation" if options.emulate else "with nvcc"))
    blob = weights_bytes(source.weights, [v for _, v in program.weights])
    files, cached = write_cuda_model_files(source, blob, options, output_dir)
    if say:
        say(f"built {files.library} ({source.plan.describe()})")
    return CompiledModel(source, program, files.library, files.header, files.weights,
                         files.source, cached, library_class=CudaModelLibrary,
                         options=options)


def gpu_mapper(options: Options) -> Callable[[Kernel], Any]:
    """The pipeline's stages check .. legality, then the GPU mapping, as
    :func:`polyc.codegen.cuda_model.generate_cuda_model` wants them."""
    from .schedule.gpu_map import map_to_gpu

    def gpu_map(kernel: Kernel) -> Any:
        scheduled = pipeline.schedule_kernel(kernel, options)
        return scheduled.kernel, map_to_gpu(scheduled.kernel, scheduled.deps,
                                            scheduled.schedule, options)
    return gpu_map


def model_source(program: Program, options: Options | None = None, *, name: str | None = None,
                 progress: bool | Progress | None = False) -> ModelSource:
    """The C (or, for target ``"cuda"``, the ``.cu``), header and layouts of ``program``
    (nothing built or written)."""
    options = options or Options()
    if options.target == "cuda":
        from .codegen.cuda_model import generate_cuda_model
        return generate_cuda_model(program, gpu_mapper(options), options, name=name,
                                   progress=progress_printer(progress))
    return generate_model(program, schedule_function(options, progress=bool(progress)),
                          options, name=name, progress=progress_printer(progress))


def schedule_function(options: Options, progress: bool = False) -> Callable[[Kernel], Any]:
    """The scheduling stages of the pipeline, as ``generate_model`` wants them, memoised
    for the process: kernels equal up to names (:func:`kernel_key`) share a schedule (it
    is over statement instances, which do not mention arrays).

    With ``options.tune`` each kernel is scheduled with its tuned options
    (:mod:`polyc.tune`; ``progress``: a bar per searched kernel on stderr); after a
    Ctrl-C stops one search, later kernels take only what the tuning cache holds."""
    interrupted = False

    def schedule(kernel: Kernel) -> Any:
        nonlocal interrupted
        kernel = coalesce_elementwise(kernel)  # a step's arrays are only pointers to it
        opts = options
        if options.tune:
            tuned = tune.tune_kernel(kernel, options, progress=progress, search=not interrupted)
            interrupted = interrupted or tuned.status == "interrupted"
            opts = tuned.options
        if opts.parallel and opts.schedule is None and _too_small_for_threads(kernel, opts):
            opts = dataclasses.replace(opts, parallel=False)
        if opts.schedule is None:  # as schedule_kernel does: the schedule is of this kernel
            kernel = pipeline.prepare_kernel(kernel, opts)
        key = (kernel_key(kernel), opts, _machine_facts())
        with _SCHEDULES_LOCK:
            found = _SCHEDULES.get(key)
        if found is None:
            found = pipeline.schedule_kernel(kernel, opts).schedule
            with _SCHEDULES_LOCK:
                if len(_SCHEDULES) >= _SCHEDULES_MAX:
                    _SCHEDULES.pop(next(iter(_SCHEDULES)))
                _SCHEDULES[key] = found
        kernel, _, found = pipeline.storage_rewrites(kernel, found)
        return kernel, found
    return schedule


#: a model step runs on one thread when it has fewer reduction instances than this and
#: fewer other statement instances than :data:`SERIAL_ELEMENTS`: waking the other threads
#: and moving the step's data to their cores costs more than they give (measured on a
#: 2-core Xeon, 2 threads bound: the small CNN 0.039 -> 0.024 ms, the small transformer
#: layer 0.030 -> 0.021 ms; LeNet-5's 75k-element pool kept its threads, which it needs)
SERIAL_REDUCTIONS = 800_000
SERIAL_ELEMENTS = 50_000


def _too_small_for_threads(kernel: Kernel, options: Options) -> bool:
    """Whether ``kernel`` (a model step with fixed sizes) is too small to share between
    threads (:data:`SERIAL_REDUCTIONS`)."""
    if machine.threads(options.threads) < 2:
        return False
    n = tune.instances(kernel)
    return n is not None and n[0] < SERIAL_REDUCTIONS and n[1] < SERIAL_ELEMENTS


def _machine_facts() -> tuple:
    """What the scheduler reads of the machine (vector unit, caches, dot products): part
    of a cached schedule's key, so that a model compiled under another machine model
    (a test's, an A/B script's) does not reuse one made for this CPU. (The strided-panel
    probe is not read here: it runs only where a pack needs it.)"""
    from .schedule import machine, register_tile
    return (register_tile.vector_bits(), register_tile.vector_registers(),
            machine.l1d_bytes(), machine.l2_bytes(), machine.has_integer_dot(),
            machine.has_vnni512())


_SCHEDULES: dict[tuple[str, Options, tuple], Any] = {}
_SCHEDULES_LOCK = threading.Lock()
_SCHEDULES_MAX = 4096


def _widest_block(options: Options) -> int:
    """The widest block constant weights are laid out in: the register tile's float32
    columns on the C target (64 with AVX-512, 16 with AVX2: one contiguous stream per
    tile), 64 for CUDA or without a machine tile."""
    from .frontend.onnx_layout import COLUMN_BLOCK, CHANNEL_MULTIPLE
    from .schedule import register_tile
    if options.target != "c" or not options.vectorize:
        return COLUMN_BLOCK
    shape = register_tile.machine_shape("float32", Options())
    nr = shape[1] if shape else COLUMN_BLOCK
    return nr if CHANNEL_MULTIPLE <= nr <= COLUMN_BLOCK and nr % CHANNEL_MULTIPLE == 0 \
        else COLUMN_BLOCK


def lower_onnx(model: Any, shapes: Mapping[str, Sequence[int]] | None = None,
               progress: Progress | None = None, options: Options | None = None) -> Program:
    """ONNX model (path, bytes or ModelProto) -> optimized Graph -> Program, for the
    target of ``options``: on a CPU with integer dot-product instructions, quantized
    convolutions run on the integers
    (:func:`polyc.frontend.onnx_passes.convs_as_dot_products`), elsewhere as exact float
    convolutions."""
    from .schedule import machine
    from .frontend.onnx_import import load_graph
    from .frontend.onnx_lower import lower_graph
    from .frontend.onnx_passes import optimize_graph

    graph = load_graph(model, shapes)
    if progress:
        progress(f"loaded {len(graph.nodes)} nodes")
    options = options or Options()
    integer_dot = options.target == "c" and options.vectorize and \
        options.register_tile is not False and machine.has_integer_dot()
    graph = optimize_graph(graph, integer_dot=integer_dot,
                           byte_quads=integer_dot and machine.has_vnni512(),
                           winograd=options.winograd if options.target == "c" else False,
                           widest_block=_widest_block(options))
    if progress:
        progress(f"optimized the graph: {len(graph.nodes)} nodes")

    def lowered(i: int, n: int, names: Sequence[str]) -> None:
        if progress and names:
            progress(f"lowering group {i + 1}/{n}: {', '.join(names)}")
    return lower_graph(graph, progress=lowered if progress else None)


def compile_onnx(model: str | os.PathLike | bytes | Any,
                 shapes: Mapping[str, Sequence[int]] | None = None,
                 options: Options | None = None, progress: bool | Progress = False, *,
                 name: str | None = None, output_dir: str | None = None,
                 target: str | None = None, emulate: bool | None = None,
                 values: Mapping[str, Any] | None = None) -> CompiledModel:
    """Compile an ONNX model (a path, serialized bytes or an ``onnx.ModelProto``).

    ``values`` fixes graph inputs that the model uses as parameters (a Reduce's axes, a
    Slice's bounds, Pad's pads, Split's sizes, TopK's K, a Reshape's shape...): they leave
    the compiled model's inputs (``polyc.backend`` does this itself, per set of values,
    at the first run; on the command line ``--value name=...``). A model with such
    inputs and no values for them is refused with their names.
    ``shapes`` fixes symbolic input dimensions (``{"input": (1, 3, 224, 224)}``);
    ``progress=True`` reports each stage on stderr (or pass a callable taking a str).
    The C prefix is ``name``, else the file's stem, else the graph's name.
    ``target="cuda"`` (``emulate=True``: run on the CPU emulation) overrides ``options``.
    """
    options = options or Options()
    if target is not None or emulate is not None:
        changes: dict[str, Any] = {}
        if target is not None:
            changes["target"] = target
        if emulate is not None:
            changes["emulate"] = emulate
        options = options.replace(**changes)
    say = progress_printer(progress)
    if name is None and isinstance(model, (str, os.PathLike)):
        name = os.path.splitext(os.path.basename(os.fspath(model)))[0]
    from .frontend.onnx_import import fix_inputs, parameter_inputs
    if values:
        model = fix_inputs(model, values)
    params = parameter_inputs(model)
    if params:
        from .frontend.onnx_graph import UnsupportedOpError
        raise UnsupportedOpError(
            f"the model's inputs {', '.join(map(repr, params))} are parameters (axes, pads, "
            "bounds, sizes or shapes that polyc compiles in): give their values "
            "(compile_onnx(..., values={name: array}); on the command line --value "
            "name=v0,v1,...), or run the model through polyc.backend, which compiles it "
            "for each set of values at the first run")
    program = lower_onnx(model, shapes, say, options)
    return build_model(program, options, name=name, output_dir=output_dir, progress=say)
