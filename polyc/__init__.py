"""polyc: a polyhedral loop-optimization compiler.

    import polyc
    matmul = polyc.define('''
    def matmul(float(M,K) A, float(K,N) B) -> (C) {
        C(m,n) +=! A(m,k) * B(k,n)
    }''')
    C = matmul(A, B)
    D = polyc.einsum("bij,bjk->bik", X, Y)

    m = polyc.compile_onnx("model.onnx")          # a whole model -> one C library
    outputs = m.run(None, {"input": x})
"""
from .api import Operator, define, einsum, scop
from .compare import compare
from .search import load_search_log, search
from .codegen.device_array import DeviceArray
from .errors import (
                     CallError,
                     CompileError,
                     InternalError,
                     ParseError,
                     PolycError,
                     RangeInferenceError,
                     RunError,
                     ScheduleError,
                     SemanticError,
                     ToolchainError,
                     UnsupportedError,
)
from .model import CompiledModel, build_model, compile_onnx
from .options import Options
from .schedule.space import ScheduleSpace, ScheduleTrace, knob, load_schedule

__all__ = ["CallError", "CompileError", "CompiledModel", "DeviceArray", "InternalError",
           "Operator", "Options", "ParseError", "PolycError", "RangeInferenceError", "RunError",
           "ScheduleError", "ScheduleSpace", "ScheduleTrace", "SemanticError", "ToolchainError",
           "UnsupportedError", "build_model", "compare", "compile_onnx", "define", "einsum",
           "knob", "load_schedule", "load_search_log", "scop", "search", "to_device"]
__version__ = "0.1.0"


def to_device(array, emulate=False, options=None):  # noqa: ANN001, ANN201
    """A :class:`DeviceArray` copy of ``array`` on the GPU (or the CPU emulation's
    device): :func:`polyc.codegen.cuda_runtime.to_device`, imported on first use."""
    from .codegen.cuda_runtime import to_device as copy
    return copy(array, emulate=emulate, options=options)

