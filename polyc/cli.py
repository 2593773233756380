"""``polyc`` on the command line.

    polyc compile examples/matmul.tc -o build/         # build/matmul.so + build/matmul.h (+ .c)
    polyc compile examples/matmul.tc --emit c          # print the C
    polyc compile examples/matmul.tc --emit schedule   # print the schedule tree
    polyc compile FILE --name NAME --fusion min --tile 32,64,512 --sizes M=128,N=64
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from .errors import PolycError, ToolchainError
from .options import FUSION_MODES, Options

EMITS = ("lib", "c", "header", "schedule", "ir", "deps")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyc", description="polyc: a polyhedral compiler for "
                                "tensor operators (TC language, einsum) to C/OpenMP.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a .tc file into a shared library and a header")
    c.add_argument("file", help="a TC-language source file")
    c.add_argument("-o", "--output", default="build", help="output directory (default: build/)")
    c.add_argument("--name", help="the def to compile when the file has several")
    c.add_argument("--emit", choices=EMITS, default="lib",
                   help="what to produce: the library (default) or print c/header/schedule/ir/deps")
    c.add_argument("--fusion", choices=FUSION_MODES, default="smart")
    c.add_argument("--tile", default="auto",
                   help="'auto', 'none', or comma-separated tile sizes (e.g. 32,64,512)")
    c.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: runtime's)")
    c.add_argument("--no-parallel", action="store_true", help="no OpenMP parallel loops")
    c.add_argument("--no-simd", action="store_true", help="no omp simd loops")
    c.add_argument("--sizes", default="",
                   help="specialise to sizes, e.g. M=128,N=64 (default: sizes are parameters)")
    c.add_argument("--schedule", help="a schedule (isl union map) to use instead of isl's")
    return p


def _tile(text: str) -> bool | tuple[int, ...]:
    if text == "auto":
        return True
    if text == "none":
        return False
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"polyc: error: --tile expects 'auto', 'none' or integers, got {text!r}")


def _sizes(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if not value.strip().isdigit() or not 1 <= int(value) < 2**63:  # sizes are int64_t
            raise SystemExit(f"polyc: error: --sizes expects NAME=INT with INT >= 1, "
                             f"got {item!r}")
        out[name.strip()] = int(value)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _compile(args)
    except ToolchainError as e:
        print(f"polyc: toolchain error: {e}", file=sys.stderr)
        return 3
    except PolycError as e:
        where = f"{args.file}:" if getattr(e, "line", None) else f"{args.file}: "
        print(f"polyc: error: {where}{e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `polyc ... --emit c | head`
        sys.stderr.close()
        return 0
    except OSError as e:
        print(f"polyc: error: {e}", file=sys.stderr)
        return 1


def _compile(args: argparse.Namespace) -> int:
    from . import pipeline
    from .frontend import from_tc

    with open(args.file) as f:
        source = f.read()
    options = Options(fusion=args.fusion, tile=_tile(args.tile), threads=args.threads,
                      parallel=not args.no_parallel, vectorize=not args.no_simd,
                      specialize=bool(args.sizes), schedule=args.schedule)
    kernel = from_tc(source, args.name)
    sizes = _sizes(args.sizes)
    unknown = set(sizes) - set(kernel.sizes)
    if unknown:
        raise SystemExit(f"polyc: error: --sizes names unknown sizes {sorted(unknown)}; "
                         f"{kernel.name} has {list(kernel.sizes)}")
    if sizes:
        kernel = kernel.specialize(sizes)
    emit = args.emit
    compiled = pipeline.compile_kernel(kernel, options, build=emit == "lib")
    if emit == "c":
        print(compiled.c_source)
    elif emit == "header":
        print(compiled.header)
    elif emit == "schedule":
        print(compiled.schedule)
    elif emit == "ir":
        print(compiled.ir_text)
    elif emit == "deps":
        print(compiled.deps_text)
    else:
        os.makedirs(args.output, exist_ok=True)
        base = os.path.join(args.output, kernel.name)
        shutil.copyfile(compiled.library_path, base + ".so")
        with open(base + ".h", "w") as f:
            f.write(compiled.header)
        with open(base + ".c", "w") as f:
            f.write(compiled.c_source)
        print(f"wrote {base}.so {base}.h {base}.c")
    return 0


if __name__ == "__main__":
    sys.exit(main())
