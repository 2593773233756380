"""Compile generated C into a shared library with the system C compiler.

Libraries are cached in ``options.cache_dir`` under the sha256 of (source text, compiler
flags, compiler version): ``<cache>/<function>-<hash>.so`` with the source kept beside it
as ``.c`` (a function name longer than :data:`MAX_STEM` characters is cut and hashed,
:func:`file_stem`, so file names stay short whatever the names in the source).
Concurrent builds of the same source are safe: each process compiles into a private
temporary name in the cache directory, then ``os.replace`` publishes the result
atomically (the last writer wins, and every writer wrote the same bytes).

A model's library may come from several translation units
(:func:`build_model_library`): they are compiled to objects in parallel in a private
build directory, linked, and the library published the same way; its key hashes every
unit, and the ``.c`` beside it is the whole library as one unit.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from polyc.errors import ToolchainError
from polyc.host import cpu_description, write_atomically
from polyc.options import Options

from .c_family import CSource

T = TypeVar("T")

BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
#: ``-fno-sanitize-recover``: undefined behaviour aborts instead of printing and going on
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-g")
LIBS = ("-lm",)


def compiler_flags(options: Options) -> list[str]:
    """The flags of every compilation with ``options`` (no file names)."""
    flags = list(BASE_FLAGS) + list(options.cflags)
    if options.sanitize:
        flags += SANITIZE_FLAGS
    return flags


@functools.cache
def asan_runtime(cc: str = "gcc") -> str | None:
    """The path of ``cc``'s ASan runtime (``libasan.so``), or None if it has none."""
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                         text=True, check=False)
    path = out.stdout.strip()
    return path if out.returncode == 0 and os.path.isabs(path) else None


def sanitizer_environment(base: dict[str, str] | None = None) -> dict[str, str] | None:
    """The environment of a child process that may load libraries built with
    ``Options(sanitize=True)``: the ASan runtime preloaded (it must be the process's
    first library) with the C++ runtime beside it (ASan's ``__cxa_throw`` interceptor
    needs a libstdc++ loaded at start-up, or a C++ exception thrown by onnx or
    onnxruntime aborts the process), leak checks off (CPython keeps memory at exit by
    design), the first report ending the process. None when there is no ASan runtime."""
    runtime = asan_runtime()
    if runtime is None:
        return None
    preload = [runtime]
    cxx = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True,
                         text=True, check=False).stdout.strip() if shutil.which("g++") else ""
    if os.path.isabs(cxx):
        preload.append(cxx)
    return dict(os.environ if base is None else base, LD_PRELOAD=" ".join(preload),
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")


def compile_command(options: Options, source_path: str, output_path: str) -> list[str]:
    return [options.cc, *compiler_flags(options), "-o", output_path, source_path, *LIBS]


@functools.cache
def compiler_version(cc: str) -> str:
    """``cc --version`` (part of the cache key: a new compiler rebuilds everything)."""
    command = [cc, "--version"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        raise ToolchainError(command, 127, f"cannot run the C compiler: {err}", "") from err
    if done.returncode != 0:
        raise ToolchainError(command, done.returncode, done.stderr, "")
    return done.stdout.strip()


def cache_key(text: str, options: Options) -> str:
    payload = [text, compiler_flags(options), list(LIBS), compiler_version(options.cc),
               cpu_description()]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


#: the longest stem kept as it is in a cache file name (file names have at most 255 bytes)
MAX_STEM = 64


def file_stem(name: str) -> str:
    """``name`` made safe and short for a file name in the cache: kept as it is when it is
    short and plain, else its first characters and a hash of the whole (names in the
    source may be up to :data:`polyc.limits.MAX_NAME_LENGTH` characters long)."""
    plain = "".join(c if c.isalnum() or c in "_-." else "_" for c in name).lstrip(".")
    if plain == name and 0 < len(name) <= MAX_STEM:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{plain[:MAX_STEM - 17] or 'polyc'}_{digest}"


def build_shared(source: CSource | str, options: Options, stem: str | None = None) -> str:
    """Compile ``source`` (cached) and return the path of the shared library
    (``<cache>/<stem>-<hash>.so``; ``stem`` defaults to the function's name).

    Raises :class:`polyc.errors.ToolchainError` with the command, its stderr and the path
    of the kept source when the compiler fails.
    """
    text = source.text if isinstance(source, CSource) else source
    if stem is None:
        stem = source.function_name if isinstance(source, CSource) else "polyc"
    os.makedirs(options.cache_dir, exist_ok=True)
    base = os.path.join(options.cache_dir, f"{file_stem(stem)}-{cache_key(text, options)[:32]}")
    library, source_path = base + ".so", base + ".c"
    if os.path.exists(library):
        return library
    write_atomically(source_path, text)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(base) + ".", suffix=".so.tmp",
                               dir=options.cache_dir)
    os.close(fd)
    command = compile_command(options, source_path, tmp)
    try:
        done = _run_compiler(command)
        if isinstance(done, OSError):
            raise ToolchainError(command, 127, f"cannot run the C compiler: {done}",
                                 source_path) from done
        if done.returncode != 0:
            raise ToolchainError(command, done.returncode, done.stderr, source_path)
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return library


def build_model_library(text: str, name: str, options: Options,
                        units: Sequence[str] | None = None) -> str:
    """Compile a model's library (cached like :func:`build_shared`).

    ``units``, when there are several, are translation units compiled in parallel
    (:func:`build_units`) and linked into the one library; ``text`` (the whole library
    as one unit) is then kept beside it as its ``.c``. The cache key covers every unit.
    """
    if not units or len(units) <= 1:
        return build_shared(text if not units else units[0], options, stem=name)
    os.makedirs(options.cache_dir, exist_ok=True)
    key = cache_key(json.dumps(["polyc-units", list(units)]), options)
    base = os.path.join(options.cache_dir, f"{file_stem(name)}-{key[:32]}")
    library = base + ".so"
    if os.path.exists(library):
        return library
    write_atomically(base + ".c", text)
    build_units(list(units), options, base)
    return library


def link_command(options: Options, objects: Sequence[str], output_path: str) -> list[str]:
    return [options.cc, *compiler_flags(options), "-o", output_path, *objects, *LIBS]


def build_units(units: list[str], options: Options, base: str,
                jobs: int | None = None) -> None:
    """Compile each of ``units`` to an object (``jobs`` compilers at a time, default one
    per unit), link them into ``<base>.so`` (published atomically). A unit the
    compiler refuses is kept as ``<base>.u<i>.c`` for the error."""
    work = tempfile.mkdtemp(prefix=os.path.basename(base) + ".", suffix=".build",
                            dir=os.path.dirname(base))
    try:
        sources = [os.path.join(work, f"u{i}.c") for i in range(len(units))]
        objects = [os.path.join(work, f"u{i}.o") for i in range(len(units))]
        for path, unit in zip(sources, units):
            with open(path, "w") as f:
                f.write(unit)
        commands = [[options.cc, *compiler_flags(options), "-c", "-o", obj, src]
                    for src, obj in zip(sources, objects)]
        with ThreadPoolExecutor(max_workers=jobs or len(units)) as pool:
            results = list(pool.map(_run_compiler, commands))
        for i, (command, result) in enumerate(zip(commands, results)):
            if isinstance(result, OSError):
                raise ToolchainError(command, 127, f"cannot run the C compiler: {result}",
                                     _keep(sources[i], f"{base}.u{i}.c")) from result
            if result.returncode != 0:
                raise ToolchainError(command, result.returncode, result.stderr,
                                     _keep(sources[i], f"{base}.u{i}.c"))
        tmp = os.path.join(work, "lib.so")
        command = link_command(options, objects, tmp)
        result = _run_compiler(command)
        if isinstance(result, OSError):
            raise ToolchainError(command, 127, f"cannot run the C compiler: {result}",
                                 base + ".c") from result
        if result.returncode != 0:
            raise ToolchainError(command, result.returncode, result.stderr, base + ".c")
        os.replace(tmp, base + ".so")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _process_cpus() -> set[int] | None:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


#: the CPUs this process may use, read at import -- before libgomp, running a polyc
#: library under ``OMP_PROC_BIND``, pins the calling thread to one CPU
_CPUS = _process_cpus()


def restore_cpus() -> None:
    """Give the calling thread the process's original CPU set back (see :data:`_CPUS`)."""
    if _CPUS is not None and _process_cpus() != _CPUS:
        try:
            os.sched_setaffinity(0, _CPUS)
        except OSError:
            pass


def build_jobs() -> int:
    """How many C compilers to run at once: the CPUs this process may use."""
    return max(1, len(_CPUS)) if _CPUS is not None else max(1, os.cpu_count() or 1)


def on_original_cpus(fn: Callable[[], T], name: str = "polyc-helper") -> T:
    """``fn()`` run in a helper thread whose CPU set is the process's original one, its
    result returned (its exception raised here). A thread pinned by OpenMP passes its
    pin on to the processes and threads it starts: every compiler of a parallel build
    would run on one CPU, and so would the thread pool of an onnxruntime session. The
    calling thread keeps its own CPU set."""
    out: list[T] = []
    err: list[BaseException] = []

    def work() -> None:
        try:
            restore_cpus()  # this helper thread only
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread
            err.append(e)
    helper = threading.Thread(target=work, name=name)
    helper.start()
    helper.join()
    if err:
        raise err[0]
    return out[0]


def _run_compiler(command: list[str]) -> subprocess.CompletedProcess[str] | OSError:
    """Run ``command`` with the process's original CPU set (:func:`on_original_cpus`)."""
    try:
        return on_original_cpus(lambda: subprocess.run(command, capture_output=True,
                                                       text=True, check=False), "polyc-cc")
    except (TimeoutError, InterruptedError):  # OSErrors, but the caller's, not the compiler's
        raise
    except OSError as err:
        return err


def _keep(path: str, kept: str) -> str:
    shutil.copyfile(path, kept)
    return kept
