"""``polyc`` on the command line.

    polyc compile examples/matmul.tc -o build/         # build/matmul.so + build/matmul.h (+ .c)
    polyc compile examples/matmul.tc --emit c          # print the C
    polyc compile examples/matmul.tc --emit schedule   # print the schedule tree
    polyc compile FILE --name NAME --fusion min --tile 32,64,512 --sizes M=128,N=64
    polyc compile model.onnx -o build/ --shape input=1,3,224,224
                               # build/model.so, .h, .c and .weights (the model's weights)
    polyc compile model.onnx --tune [SECONDS]    # auto-tune each kernel (cached per machine)
    polyc tune model.onnx [--budget SECONDS]     # tune only, a line per kernel
    polyc machine                                # what polyc reads of this CPU
    polyc compile examples/matmul.tc --target cuda -o build/   # build/matmul.cu, .h, .so (nvcc)
    polyc compile examples/matmul.tc --target cuda --emulate   # the .so built for the CPU emulation
    polyc compile examples/matmul.tc --target cuda --emit cuda  # print the .cu
    polyc compile examples/matmul.tc --target cuda --emit report --sizes M=1024,N=1024,K=1024

    polyc compile stencil.c --emit c      # the C file, its #pragma scop region optimised
    polyc compile stencil.c -o build/     # + build/<function>.so/.h and stencil.polyc.c

The language comes from the extension: ``.tc`` is the TC language, ``.onnx`` an ONNX
model, ``.c`` C with a ``#pragma scop`` region (``--name`` picks the function); any
other extension is refused unless ``--lang tc|onnx|c`` says which it is. A file
that is not what its extension (or ``--lang``) says is refused with a message saying so.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import replace

from .errors import ParseError, PolycError, ToolchainError
from .options import FUSION_MODES, Options

EMITS = ("lib", "c", "header", "schedule", "ir", "deps", "cuda", "report")
#: what only the CUDA target emits
CUDA_EMITS = ("cuda", "report")
#: the language of each accepted file extension
LANGUAGES = {".tc": "tc", ".onnx": "onnx", ".c": "c"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyc", description="polyc: a polyhedral compiler for "
                                "tensor operators (TC language, einsum) to C/OpenMP.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a .tc file or an .onnx model into a shared "
                       "library and a header")
    c.add_argument("file", help="a TC-language source file (.tc), or an ONNX model (.onnx)")
    c.add_argument("--lang", choices=sorted(set(LANGUAGES.values())),
                   help="the language of FILE (default: from its extension)")
    c.add_argument("-o", "--output", default="build", help="output directory (default: build/)")
    c.add_argument("--name", help="the def to compile when the file has several (a .c file: "
                   "the function); for a model, the C prefix and file name (default: the "
                   "file's stem)")
    c.add_argument("--shape", action="append", default=[], metavar="INPUT=D0,D1,...",
                   help="(.onnx) the static shape of an input with symbolic dimensions; "
                   "may be repeated")
    c.add_argument("--value", action="append", default=[], metavar="INPUT=V0,V1,...",
                   help="(.onnx) fix a graph input the model uses as a parameter (a "
                   "Reduce's axes, a Slice's bounds, Pad's pads, a Reshape's shape...) to "
                   "these values; a one-element list is a scalar; may be repeated")
    c.add_argument("-q", "--quiet", action="store_true",
                   help="(.onnx) no progress messages on stderr")
    c.add_argument("--emit", choices=EMITS, default="lib",
                   help="what to produce: the library (default) or print c/header/schedule/ir/"
                   "deps; with --target cuda also cuda (the .cu) or report (the static GPU "
                   "report: coalescing, bank conflicts, ptxas figures, occupancy)")
    c.add_argument("--target", choices=("c", "cuda"), default="c",
                   help="c (C with OpenMP, default) or cuda (CUDA C built by nvcc)")
    c.add_argument("--emulate", action="store_true",
                   help="(--target cuda) build the .cu with g++ and the CPU emulation header "
                   "instead of nvcc")
    c.add_argument("--gpu-arch", default=None, metavar="SM",
                   help="(--target cuda) the SM architecture, e.g. sm_80 (default)")
    c.add_argument("--gpu-block", default=None, metavar="X[,Y[,Z]]",
                   help="(--target cuda) CUDA threads per block along x, y, z")
    c.add_argument("--fusion", choices=FUSION_MODES, default="smart")
    c.add_argument("--tile", default="auto",
                   help="'auto', 'none', or comma-separated tile sizes (e.g. 32,64,512)")
    c.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: runtime's)")
    c.add_argument("--no-parallel", action="store_true", help="no OpenMP parallel loops")
    c.add_argument("--no-simd", action="store_true", help="no omp simd loops")
    c.add_argument("--no-winograd", action="store_true",
                   help="(ONNX) direct 3x3 convolutions, not Winograd's F(m x m, 3x3)")
    c.add_argument("--sizes", default="",
                   help="specialise to sizes, e.g. M=128,N=64 (default: sizes are parameters)")
    c.add_argument("--schedule", help="a schedule (isl union map) to use instead of isl's")
    c.add_argument("--tune", nargs="?", const=True, default=False, type=_seconds,
                   metavar="SECONDS", help="auto-tune tile sizes, register tiles and fusion "
                   "of each kernel with fixed sizes (SECONDS of search per kernel; results "
                   "cached per machine in the cache directory)")
    t = sub.add_parser("tune", help="auto-tune the kernels of a model (or of a .tc def with "
                       "--sizes) into the tuning cache; prints a line per kernel")
    t.add_argument("file", help="an ONNX model (.onnx) or a TC-language source file (.tc)")
    t.add_argument("--lang", choices=sorted(set(LANGUAGES.values())),
                   help="the language of FILE (default: from its extension)")
    t.add_argument("--name", help="the def to tune when a .tc file has several")
    t.add_argument("--shape", action="append", default=[], metavar="INPUT=D0,D1,...")
    t.add_argument("--sizes", default="", help="(.tc) the sizes, e.g. M=128,N=64")
    t.add_argument("--budget", type=_seconds, default=None,
                   help="seconds of search per kernel (default: polyc.tune.DEFAULT_BUDGET)")
    t.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: runtime's)")
    sub.add_parser("machine", help="print what polyc reads of this CPU (vector width, "
                   "caches, threads, the strided-panel probe) and plans with")
    return p


def _machine() -> int:
    """``polyc machine``: the CPU facts the tile, register-tile and packing rules use."""
    from . import host, pack
    from .schedule import machine, register_tile
    model = next((ln.split(":", 1)[1].strip() for ln in host.cpu_description().splitlines()
                  if ln.startswith("model name")), "unknown")
    flags = sorted(host.cpu_flags() & {"avx2", "fma", "avx512f", "avx512_vnni",
                                       "avx_vnni", "avx512_fp16", "avx512_bf16", "amx_tile"})
    cost = pack.strided_cost()
    print(f"cpu: {model}")
    print(f"vector features: {' '.join(flags) or 'none'}")
    print(f"vector width: {register_tile.vector_bits()} bits, "
          f"{register_tile.vector_registers()} registers")
    print(f"L1d: {machine.l1d_bytes() // 1024} KiB, L2: {machine.l2_bytes() // 1024} KiB "
          f"(per core)")
    print(f"threads: {machine.threads()}")
    for dtype in ("float32", "float64"):
        shape = register_tile.machine_shape(dtype, Options())
        print(f"register tile {dtype}: {shape[0]} x {shape[1]}" if shape else
              f"register tile {dtype}: none")
    print(f"strided panel cost: {cost:.2f} (packing from "
          f"{'fewer rows' if cost > pack.STRIDED_PANEL_SLOW else 'the default rows'})")
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _tile(text: str) -> bool | tuple[int, ...]:
    if text == "auto":
        return True
    if text == "none":
        return False
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"polyc: error: --tile expects 'auto', 'none' or integers, "
                         f"got {text!r}") from None


def _sizes(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if not value.strip().isdigit() or not 1 <= int(value) < 2**63:  # sizes are int64_t
            raise SystemExit(f"polyc: error: --sizes expects NAME=INT with INT >= 1, "
                             f"got {item!r}")
        out[name.strip()] = int(value)
    return out


def _language(args: argparse.Namespace) -> str:
    """``tc`` or ``onnx``: ``--lang``, else from the extension (others are refused)."""
    if args.lang:
        return args.lang
    ext = os.path.splitext(args.file)[1]
    if ext.lower() in LANGUAGES:
        return LANGUAGES[ext.lower()]
    shown = f"the extension {ext!r}" if ext else "a file name without an extension"
    what = {"tc": "TC language", "onnx": "ONNX model", "c": "C with #pragma scop"}
    accepted = ", ".join(f"{e} ({what[lang]})" for e, lang in LANGUAGES.items())
    raise SystemExit(f"polyc: error: {args.file}: cannot tell the language from {shown}: "
                     f"polyc reads {accepted} files; rename the file or pass --lang tc, "
                     f"--lang onnx or --lang c")


def _looks_binary(data: bytes) -> bool:
    if b"\0" in data[:4096]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _read_tc(path: str) -> str:
    """The text of a TC source; a binary file (an ONNX model?) is refused clearly."""
    with open(path, "rb") as f:
        data = f.read()
    if _looks_binary(data):
        hint = " (it looks like an ONNX model: name it .onnx or pass --lang onnx)" \
            if data[:1] == b"\x08" else ""
        raise ParseError(f"not a TC-language source: the file is binary, not UTF-8 "
                         f"text{hint}")
    return data.decode("utf-8")


def _check_onnx(path: str) -> None:
    """An ONNX model is binary protobuf; TC-language text is refused clearly (anything
    else is left to the ONNX reader, which says what is wrong)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not _looks_binary(head):
        text = "\n".join(ln for ln in head.decode("utf-8").splitlines()
                         if not ln.lstrip().startswith("#"))
        if text.lstrip().startswith("def"):
            raise ParseError("not an ONNX model: the file is TC-language text (name it .tc "
                             "or pass --lang tc)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "machine":
            return _machine()
        return _tune(args) if args.command == "tune" else _compile(args)
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


def _shapes(items: list[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        name, eq, dims = item.rpartition("=")
        try:
            values = [int(d) for d in dims.split(",")]
        except ValueError:
            values = []
        if not eq or not name or not values or any(v < 1 for v in values):
            raise SystemExit(f"polyc: error: --shape expects INPUT=D0,D1,... with every D >= 1, "
                             f"got {item!r}")
        out[name] = values
    return out


def _options(args: argparse.Namespace, specialize: bool) -> Options:
    target = getattr(args, "target", "c")
    if target != "cuda":
        for flag, value in (("--emulate", getattr(args, "emulate", False)),
                            ("--gpu-arch", getattr(args, "gpu_arch", None)),
                            ("--gpu-block", getattr(args, "gpu_block", None))):
            if value:
                raise SystemExit(f"polyc: error: {flag} is for --target cuda")
        if getattr(args, "emit", None) in CUDA_EMITS:
            raise SystemExit(f"polyc: error: --emit {args.emit} needs --target cuda")
        return Options(fusion=args.fusion, tile=_tile(args.tile), threads=args.threads,
                       parallel=not args.no_parallel, vectorize=not args.no_simd,
                       specialize=specialize, schedule=args.schedule, tune=args.tune,
                       winograd=not getattr(args, "no_winograd", False))
    if args.emit == "c":
        raise SystemExit("polyc: error: --target cuda emits cuda (the .cu), not c")
    if args.tune:
        raise SystemExit("polyc: error: --tune is for the C target")
    extra: dict = {}
    if args.gpu_arch:
        extra["gpu_arch"] = args.gpu_arch
    if args.gpu_block:
        try:
            extra["gpu_block"] = tuple(int(x) for x in args.gpu_block.split(","))
        except ValueError:
            raise SystemExit(f"polyc: error: --gpu-block expects integers, got "
                             f"{args.gpu_block!r}") from None
    return Options(target="cuda", emulate=args.emulate, fusion=args.fusion,
                   specialize=specialize, schedule=args.schedule, **extra)


def _values(items: list[str]) -> dict[str, object]:
    """``--value axes=0,2`` -> {"axes": [0, 2]} (a single value: a scalar)."""
    out: dict[str, object] = {}
    for item in items:
        name, eq, text = item.rpartition("=")
        try:
            vals = [int(v) if v.strip().lstrip("-").isdigit() else float(v)
                    for v in text.split(",")]
        except ValueError:
            vals = []
        if not eq or not name or not vals:
            raise SystemExit(f"polyc: error: --value expects INPUT=V0,V1,... (numbers), got "
                             f"{item!r}")
        out[name] = vals[0] if len(vals) == 1 else vals
    return out


def _compile_onnx(args: argparse.Namespace) -> int:
    from . import model
    from .frontend.onnx_import import fix_inputs, parameter_inputs

    if args.emit not in ("lib", "c", "header", "cuda", "report"):
        raise SystemExit(f"polyc: error: --emit {args.emit} is for .tc files; a model emits "
                         "lib, c, cuda or report (with --target cuda), or header")
    if args.sizes or args.schedule:
        raise SystemExit("polyc: error: --sizes and --schedule are for .tc files "
                         "(give a model's input shapes with --shape)")
    options = _options(args, True)
    progress = False if args.quiet else True
    name = args.name or os.path.splitext(os.path.basename(args.file))[0]
    source = fix_inputs(args.file, _values(args.value)) if args.value else args.file
    params = parameter_inputs(source)
    if params:
        raise SystemExit(f"polyc: error: the model's inputs {', '.join(params)} are parameters "
                         "(axes, pads, bounds, sizes or shapes compiled in): give their values "
                         f"with --value, e.g. --value {params[0]}=0,1")
    program = model.lower_onnx(source, _shapes(args.shape) or None,
                               model.progress_printer(progress), options)
    if args.emit == "report":  # the static GPU report of every operator (nvcc, no GPU)
        from .codegen.gpu_report import model_report
        source = model.model_source(program, options, name=name, progress=progress)
        print(model_report(source, options))
        return 0
    if args.emit != "lib":
        source = model.model_source(program, options, name=name, progress=progress)
        print(source.header if args.emit == "header" else source.text)
        return 0
    if options.target == "cuda":  # written, not loaded: no GPU needed to build
        from .codegen.cuda_model import write_cuda_model_files
        from .codegen.weights import weights_bytes
        say = model.progress_printer(progress)
        source = model.model_source(program, options, name=name, progress=say)
        blob = weights_bytes(source.weights, [v for _, v in program.weights])
        files, _ = write_cuda_model_files(source, blob, options, args.output)
        print(f"wrote {files.library} {files.header} {files.source} {files.weights}")
        return 0
    built = model.build_model(program, options, name=name, output_dir=args.output,
                              progress=progress)
    built.close()
    files = (built.library_path, built.header_path, built.source_path, built.weights_path)
    print("wrote " + " ".join(files))
    return 0


def _compile(args: argparse.Namespace) -> int:
    from . import pipeline
    from .codegen.toolchain import file_stem
    from .errors import CompileError
    from .frontend import from_tc
    from .frontend.tc_parser import did_you_mean

    if _language(args) == "onnx":
        _check_onnx(args.file)
        return _compile_onnx(args)
    if args.shape or args.value:
        raise SystemExit("polyc: error: --shape and --value are for .onnx models (a .tc file "
                         "takes --sizes)")
    source = _read_tc(args.file)
    options = _options(args, bool(args.sizes))
    scop = None
    try:
        if _language(args) == "c":  # a function's #pragma scop region (--name: which)
            from .frontend.scop import from_scop
            scop = from_scop(source, args.name)
            kernel = scop.kernel
        else:
            kernel = from_tc(source, args.name)
    except CompileError as e:
        raise e.attach_source(source)
    sizes = _sizes(args.sizes)
    unknown = set(sizes) - set(kernel.sizes)
    if unknown:
        hints = "".join(f"; {n!r}{did_you_mean(n, kernel.sizes)}" for n in sorted(unknown)
                        if did_you_mean(n, kernel.sizes))
        raise SystemExit(f"polyc: error: --sizes names unknown sizes {sorted(unknown)}; "
                         f"{kernel.name} has {list(kernel.sizes)}{hints}")
    if sizes:
        kernel = kernel.specialize(sizes)
    emit = args.emit
    if scop is not None:  # the generated function must not take the C function's name
        kernel = replace(kernel, name=f"polyc_{kernel.name}")
    compiled = pipeline.compile_kernel(kernel, options, build=emit == "lib", progress=True)
    rewritten = None
    if scop is not None and options.target == "c":
        from .codegen.scop_rewrite import rewrite
        rewritten = rewrite(source, scop, compiled.c_source, compiled.source.function_name)
    if emit == "c" and rewritten is not None:
        print(rewritten)
    elif emit in ("c", "cuda"):
        print(compiled.c_source)
    elif emit == "report":
        print(compiled.gpu_report)
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
        base = os.path.join(args.output, file_stem(kernel.name))
        ext = ".cu" if options.target == "cuda" else ".c"
        shutil.copyfile(compiled.library_path, base + ".so")
        with open(base + ".h", "w") as f:
            f.write(compiled.header)
        with open(base + ext, "w") as f:
            f.write(compiled.c_source)
        written = f"{base}.so {base}.h {base}{ext}"
        if rewritten is not None:  # the input file with its region replaced
            stem = os.path.splitext(os.path.basename(args.file))[0]
            path = os.path.join(args.output, f"{stem}.polyc.c")
            with open(path, "w") as f:
                f.write(rewritten + "\n")
            written += f" {path}"
        print(f"wrote {written}")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from . import tune
    from .codegen.model import kernel_key
    from .errors import CompileError
    from .frontend import from_tc

    options = Options(threads=args.threads, tune=args.budget or True)
    if _language(args) == "onnx":
        from . import model
        _check_onnx(args.file)
        program = model.lower_onnx(args.file, _shapes(args.shape) or None, options=options)
        kernels = list({kernel_key(s.kernel): s.kernel for s in program.steps}.values())
    else:
        source = _read_tc(args.file)
        try:
            kernel = from_tc(source, args.name)
        except CompileError as e:
            raise e.attach_source(source)
        kernels = [kernel.specialize(_sizes(args.sizes))]
    skipped = 0
    for kernel in kernels:
        r = tune.tune_kernel(kernel, options, progress=True)
        if r.status.startswith("skipped") and len(kernels) > 1:
            skipped += 1
            continue
        chosen = tune.Candidate.of(r.options).describe()
        timing = (f" {r.default_s * 1e3:.3f} -> {r.best_s * 1e3:.3f} ms"
                  if r.best_s is not None and r.default_s is not None else "")
        print(f"{kernel.name}: {r.status}{timing} {chosen}", flush=True)
    if skipped:
        print(f"{skipped} of {len(kernels)} distinct kernels not searched (little work, "
              "no reduction, or not float)")
    print(f"tuning cache: {tune.cache_path(options)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
