"""Compile generated C into a shared library with the system C compiler.

Libraries are cached in ``options.cache_dir`` under the sha256 of (source text, compiler
flags, compiler version): ``<cache>/<function>-<hash>.so`` with the source kept beside it
as ``.c``. Concurrent builds of the same source are safe: each process compiles into a
private temporary name in the cache directory, then ``os.replace`` publishes the result
atomically (the last writer wins, and every writer wrote the same bytes).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import tempfile

from polyc.errors import ToolchainError
from polyc.options import Options

from .c_family import CSource

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


@functools.cache
def host_cpu() -> str:
    """The CPU model and feature flags: ``-march=native`` builds differ between CPUs."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def cache_key(text: str, options: Options) -> str:
    payload = [text, compiler_flags(options), list(LIBS), compiler_version(options.cc),
               host_cpu()]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


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
    base = os.path.join(options.cache_dir, f"{stem}-{cache_key(text, options)[:32]}")
    library, source_path = base + ".so", base + ".c"
    if os.path.exists(library):
        return library
    _write_atomically(source_path, text)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(base) + ".", suffix=".so.tmp",
                               dir=options.cache_dir)
    os.close(fd)
    command = compile_command(options, source_path, tmp)
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as err:
            raise ToolchainError(command, 127, f"cannot run the C compiler: {err}",
                                 source_path) from err
        if done.returncode != 0:
            raise ToolchainError(command, done.returncode, done.stderr, source_path)
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return library


def _write_atomically(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                               dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def build_model_library(text: str, name: str, options: Options) -> str:
    """Compile a model's translation unit (cached like :func:`build_shared`)."""
    return build_shared(text, options, stem=name)
