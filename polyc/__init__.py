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
from .codegen.cuda_runtime import to_device
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

__all__ = ["compare", "knob", "load_search_log", "search", "CallError", "CompileError", "CompiledModel", "DeviceArray", "ScheduleSpace",
           "ScheduleTrace", "load_schedule", "InternalError", "Operator", "Options",
           "ParseError", "PolycError", "RangeInferenceError", "RunError", "ScheduleError", "SemanticError",
           "ToolchainError", "UnsupportedError", "build_model", "compile_onnx", "define",
           "einsum", "scop", "to_device"]
__version__ = "0.1.0"
