"""An on-disk cache of the CPU compiles' SASS (fa4kernel.compile_sass, compile_bwd_sass, and every
build that goes through sass.sass_for with a cache key).

A compile for sm_90a / sm_100a on the CPU takes seconds (the DSL traces the kernel, ptxas builds
it, nvdisasm prints it); its SASS depends only on what goes in, so the text is kept on disk and
read back the next time the same build is asked for, by this process or any other (pytest-xdist
workers, the lessons, a second run).

Key: sha256 of (the build's kind and arch, the repr of its configuration -- a frozen dataclass
such as KernelConfig / BwdConfig / Sm100Config, with the diagnostics -- the contents of every .py
under fa4kernel/ plus any source file the caller names (a benchmark kernel's own module), the
versions of nvidia-cutlass-dsl and its libraries (ptxas is built into them) and of nvdisasm, the
Python version, and the CUTE_DSL_* environment variables the compile reads). Any change to one of
them is another key: an entry is never stale, only unused.

Where: $FA4LAB_CACHE if set to a folder, else $XDG_CACHE_HOME/fa4lab/sass, else
~/.cache/fa4lab/sass. FA4LAB_CACHE=off (or 0, no, false) turns the cache off. Clear it by
deleting that folder, or `python -m fa4kernel.compile_cache --clear` (`--info`: where it is and
what it holds).

One file per entry, <key>.sass: a header line (JSON: the key, the kind, the config, the text's
sha256) and the zlib-compressed SASS. It is written to a temporary file in the same folder and
moved into place (os.replace), so a reader sees a whole entry or none; builders of the same key
take a lock on <key>.lock first (POSIX flock), so parallel workers compile a build once: the
second waits and reads the first's entry. An entry that does not read back (truncated, another
format, wrong checksum) is a miss: the build is compiled again and the entry rewritten.

If fa4kernel's own sources change while this process runs (edited after import), the code that
runs may not be the code on disk: the cache is then bypassed for the rest of the process (a
warning says so once). It keys on source files, not on objects patched at run time: set
FA4LAB_CACHE=off when monkeypatching a kernel module.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import Callable, Iterable, Optional

FORMAT = "fa4lab-sass-1"  # the entry format, also part of the key
ENV = "FA4LAB_CACHE"
OFF = ("off", "0", "no", "false", "none", "disable", "disabled")
PACKAGE_DIR = Path(__file__).resolve().parent
# the DSL's own settings the compile reads; sass_for sets these three itself
_SET_BY_SASS_FOR = ("CUTE_DSL_ARCH", "CUTE_DSL_KEEP", "CUTE_DSL_DUMP_DIR")

# what happened in this process: "hit", "miss" (compiled and stored), "bypass" (cache off or not
# usable, compiled only), "wait" (another process was compiling it: waited, then read its entry)
STATS = {"hit": 0, "miss": 0, "bypass": 0, "wait": 0}


def cache_dir() -> Optional[Path]:
    """The cache's folder, or None when FA4LAB_CACHE turns it off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in OFF:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fa4lab" / "sass"


def package_files(root: Path = PACKAGE_DIR) -> list[Path]:
    """Every .py under the fa4kernel package (the sources any build may import)."""
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _stat(path: Path):
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def source_digest(files: Iterable) -> str:
    """sha256 of the files' names (relative to the package or as given) and contents."""
    h = hashlib.sha256()
    for f in sorted(Path(f).resolve() for f in files):
        try:
            name = f.relative_to(PACKAGE_DIR).as_posix()
        except ValueError:
            name = f.as_posix()
        h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# fa4kernel's sources as this process imported them: stats taken at import, contents hashed at
# the first compile (if the stats still agree)
_IMPORT_STATS = {p: _stat(p) for p in package_files()}
_PACKAGE_DIGEST: Optional[str] = None
_WARNED = False


def package_digest() -> Optional[str]:
    """source_digest of fa4kernel's .py files, or None if they changed since this process
    imported fa4kernel (then the cache is not used: the running code may not be the files')."""
    global _PACKAGE_DIGEST, _WARNED
    try:
        now = {p: _stat(p) for p in package_files()}
    except OSError:
        now = None
    if now != _IMPORT_STATS:
        if not _WARNED:
            _WARNED = True
            warnings.warn("fa4kernel's sources changed since it was imported: the SASS compile cache is off "
                          "for the rest of this process", RuntimeWarning, stacklevel=3)
        return None
    if _PACKAGE_DIGEST is None:
        _PACKAGE_DIGEST = source_digest(_IMPORT_STATS)
    return _PACKAGE_DIGEST


_TOOLCHAIN: Optional[dict] = None


def toolchain() -> dict:
    """The versions a compile's output depends on: nvidia-cutlass-dsl and its libraries (the DSL
    and the ptxas built into them), nvdisasm (the wheel's version and the binary's own), Python."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        from importlib import metadata

        tc = {"python": "%d.%d" % sys.version_info[:2]}
        for dist in metadata.distributions():
            name = (dist.metadata["Name"] or "").lower().replace("_", "-")
            if name.startswith("nvidia-cutlass-dsl") or name.startswith("nvidia-cuda-nvdisasm"):
                tc[name] = dist.version
        try:
            import subprocess

            from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

            tc["nvdisasm"] = subprocess.run([_find_nvdisasm_binary(), "--version"], capture_output=True,
                                            text=True).stdout.strip()
        except Exception as e:  # no DSL: the compile itself will say so
            tc["nvdisasm"] = f"unknown ({type(e).__name__})"
        _TOOLCHAIN = tc
    return dict(_TOOLCHAIN)


def _dsl_env() -> dict:
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(("CUTE_DSL_", "CUTLASS_")) and k not in _SET_BY_SASS_FOR}


def make_key(kind: str, arch: str, config, sources: Iterable = (), *, package: Optional[str] = None,
             tools: Optional[dict] = None) -> str:
    """The entry's key (64 hex digits). config: the build's configuration (its repr is keyed: a
    frozen dataclass, or a tuple of them); sources: source files besides fa4kernel's (a benchmark
    kernel's module). package / tools: fa4kernel's source digest and toolchain() (looked up when
    None)."""
    parts = {"format": FORMAT, "kind": kind, "arch": arch, "config": repr(config),
             "package": package if package is not None else package_digest(),
             "sources": source_digest(sources) if sources else "",
             "tools": tools if tools is not None else toolchain(), "env": _dsl_env()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def entry_path(key: str, folder: Optional[Path] = None) -> Path:
    return (folder or cache_dir()) / f"{key}.sass"


def read_entry(path: Path) -> Optional[str]:
    """The SASS of an entry, or None if it is missing or does not read back whole."""
    try:
        data = path.read_bytes()
        magic, header, body = data.split(b"\n", 2)
        if magic.decode() != FORMAT:
            return None
        head = json.loads(header)
        text = zlib.decompress(body).decode()
        if hashlib.sha256(text.encode()).hexdigest() != head["sha256"] or head["key"] != path.stem:
            return None
        return text
    except (OSError, ValueError, KeyError, TypeError, zlib.error, UnicodeDecodeError):
        return None


def write_entry(path: Path, text: str, meta: dict) -> None:
    """Write an entry atomically: a temporary file in the same folder, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"key": path.stem, "sha256": hashlib.sha256(text.encode()).hexdigest(), "created": time.time(), **meta}
    data = FORMAT.encode() + b"\n" + json.dumps(head, sort_keys=True).encode() + b"\n" + zlib.compress(text.encode(), 6)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _Lock:
    """An exclusive flock on <key>.lock (a no-op where fcntl is missing); waited: whether another
    process held it when asked."""

    def __init__(self, path: Path):
        self.path, self.fd, self.waited = path, None, False

    def __enter__(self):
        try:
            import fcntl
        except ImportError:
            return self
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return self
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.waited = True
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
        return False


def cached(kind: str, arch: str, config, build: Callable[[], str], sources: Iterable = (),
           refresh: bool = False) -> str:
    """The SASS of a build: from the cache if it holds the key, else build() (which compiles and
    returns the text), stored. refresh: compile even on a hit (and rewrite the entry)."""
    folder = cache_dir()
    package = package_digest() if folder is not None else None
    if folder is None or package is None:
        return _done("bypass", kind, config, None, *_timed(build))
    sources = tuple(sources)
    key = make_key(kind, arch, config, sources, package=package)
    path = entry_path(key, folder)
    if not refresh:
        text = read_entry(path)
        if text is not None:
            return _done("hit", kind, config, key, text)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # an unwritable place: compile without the cache
        return _done("bypass", kind, config, key, *_timed(build))
    with _Lock(folder / f"{key}.lock") as lock:
        if not refresh:
            text = read_entry(path)  # another process may have built it while we waited
            if text is not None:
                return _done("wait" if lock.waited else "hit", kind, config, key, text)
        text, seconds = _timed(build)
        try:
            write_entry(path, text, {"kind": kind, "arch": arch, "config": repr(config)[:2000]})
        except OSError as e:
            warnings.warn(f"SASS compile cache: could not write {path}: {e}", RuntimeWarning, stacklevel=2)
    return _done("miss", kind, config, key, text, seconds)


def _timed(build: Callable[[], str]) -> tuple[str, float]:
    t0 = time.perf_counter()
    text = build()
    return text, time.perf_counter() - t0


def _done(outcome: str, kind: str, config, key: Optional[str], text: str, seconds: Optional[float] = None) -> str:
    """Count the outcome; FA4LAB_CACHE_LOG=path appends one JSON line per request (outcome, kind,
    key, config, pid, and the compile's seconds where it compiled): to count the compiles of a
    test run (each configuration should compile once: one "miss" per key)."""
    STATS[outcome] += 1
    log = os.environ.get("FA4LAB_CACHE_LOG")
    if log:
        line = json.dumps({"outcome": outcome, "kind": kind, "key": key, "config": repr(config), "pid": os.getpid(),
                           "seconds": None if seconds is None else round(seconds, 3)})
        with open(log, "a") as f:
            f.write(line + "\n")
    return text


def entries(folder: Optional[Path] = None) -> list[Path]:
    folder = folder or cache_dir()
    return sorted(folder.glob("*.sass")) if folder is not None and folder.is_dir() else []


def clear(folder: Optional[Path] = None) -> int:
    """Delete every entry (and lock, and left-over temporary file); returns the entries removed."""
    folder = folder or cache_dir()
    if folder is None or not folder.is_dir():
        return 0
    n = 0
    for p in folder.iterdir():
        if p.suffix in (".sass", ".lock", ".tmp"):
            try:
                p.unlink()
                n += p.suffix == ".sass"
            except OSError:
                pass
    return n


def info(folder: Optional[Path] = None) -> str:
    folder = folder or cache_dir()
    if folder is None:
        return f"SASS compile cache: off ({ENV}={os.environ.get(ENV)})"
    found = entries(folder)
    kinds: dict = {}
    for p in found:
        try:
            kind = json.loads(p.read_bytes().split(b"\n", 2)[1]).get("kind", "?")
        except (OSError, ValueError, IndexError):
            kind = "unreadable"
        kinds[kind] = kinds.get(kind, 0) + 1
    size = sum(p.stat().st_size for p in found)
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    return (f"SASS compile cache: {folder}\n{len(found)} entries, {size / 1e6:.1f} MB"
            + (f" ({by_kind})" if by_kind else ""))


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fa4kernel.compile_cache",
                                 description="fa4kernel's on-disk cache of CPU-compiled SASS "
                                             f"({ENV}=folder or off; default $XDG_CACHE_HOME/fa4lab/sass)")
    ap.add_argument("--clear", action="store_true", help="delete every entry")
    ap.add_argument("--info", action="store_true", help="where the cache is and what it holds (the default)")
    args = ap.parse_args(argv)
    if args.clear:
        print(f"removed {clear()} entries from {cache_dir()}")
    print(info())
    return 0


if __name__ == "__main__":
    sys.exit(main())
