"""Code generation: isl schedule -> C/OpenMP via cgen; toolchain and runtime glue.

The three stages, each usable alone::

    source = generate_c(kernel, schedule, options)     # CSource: .text, .header, ...
    path = build_shared(source, options)               # cached gcc -shared build
    fn = CompiledFunction(kernel, path, source.function_name)
    (C,) = fn([A, B])                                  # numpy in, numpy out

:func:`compile_kernel` runs all three.

A whole model (:class:`polyc.program.Program`) becomes one translation unit: ``model.py``
(kernels as ``static`` functions from :func:`generate_function`, deduplicated; the
``init``/``run``/``free`` API, printed by ``model_c.py``), ``memplan.py`` (the arena),
``weights.py`` (the weights file), ``model_runtime.py`` (build, load and call it).
"""
from __future__ import annotations

import islpy as isl

from polyc.ir import Kernel
from polyc.options import Options

from .c_expr import sanitize
from .c_family import CDialect, CFunction, CSource, OpenMPDialect, generate_c, generate_function
from .runtime import CompiledFunction, bind_sizes, load_library, output_shapes
from .toolchain import build_shared

__all__ = ["CDialect", "CFunction", "CSource", "CompiledFunction", "OpenMPDialect", "bind_sizes",
           "build_shared", "compile_kernel", "generate_c", "generate_function", "load_library",
           "output_shapes", "sanitize"]


def compile_kernel(kernel: Kernel, schedule: isl.Schedule,
                   options: Options | None = None) -> CompiledFunction:
    """Generate, build and load ``kernel`` scheduled by ``schedule``."""
    options = options or Options()
    source = generate_c(kernel, schedule, options)
    return CompiledFunction(kernel, build_shared(source, options), source.function_name, source)
