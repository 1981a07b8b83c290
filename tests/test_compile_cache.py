"""fa4kernel's on-disk SASS cache (fa4kernel/compile_cache.py): a hit returns the text the build
made, the key follows the configuration, the sources and the toolchain, FA4LAB_CACHE=off
bypasses it, a corrupt entry is compiled again, parallel writers leave one whole entry.

The builds here are stand-ins (functions that count their calls and return a text), so these
tests run without the CuTe DSL; the last one compiles a real kernel twice when the DSL is here.
"""
import multiprocessing
import os
import time

import pytest

from fa4kernel import compile_cache as cc
from fa4kernel.sm90.bwd_config import make_bwd_config
from fa4kernel.sm90.config import make_config

TOOLS = {"nvidia-cutlass-dsl": "test", "nvdisasm": "test"}  # no subprocess: the DSL may be missing


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "sass"
    monkeypatch.setenv("FA4LAB_CACHE", str(folder))
    monkeypatch.setattr(cc, "_TOOLCHAIN", dict(TOOLS))
    return folder


class Build:
    """A stand-in compile: returns `text`, counts its calls."""

    def __init__(self, text="        /*0000*/  MOV R1, c[0x0][0x28] ;\n"):
        self.text, self.calls = text, 0

    def __call__(self):
        self.calls += 1
        return self.text


CFG = make_config("bfloat16", 128, False, False, {})


def test_a_hit_returns_the_same_text_without_compiling(cache):
    build = Build()
    first = cc.cached("sm90_fwd", "sm_90a", CFG, build)
    again = cc.cached("sm90_fwd", "sm_90a", CFG, build)
    assert first == again == build.text and build.calls == 1
    assert len(cc.entries(cache)) == 1


def test_the_key_follows_the_configuration_arch_kind_and_toolchain(cache):
    key = lambda *a, **k: cc.make_key(*a, package="p", tools=k.pop("tools", TOOLS), **k)  # noqa: E731
    base = key("sm90_fwd", "sm_90a", CFG)
    assert base == key("sm90_fwd", "sm_90a", make_config("bfloat16", 128, False, False, {}))
    others = {key("sm90_fwd", "sm_90a", make_config("bfloat16", 128, True, False, {})),
              key("sm90_fwd", "sm_90a", make_config("bfloat16", 128, False, False, {"kv_stages": 3})),
              key("sm90_fwd", "sm_90a", make_config("float16", 128, False, False, {})),
              key("sm90_fwd", "sm_100a", CFG),
              key("sm90_bwd", "sm_90a", CFG),
              key("sm90_fwd", "sm_90a", (CFG, "diagnostics")),
              key("sm90_fwd", "sm_90a", CFG, tools={**TOOLS, "nvidia-cutlass-dsl": "other"}),
              cc.make_key("sm90_fwd", "sm_90a", CFG, package="q", tools=TOOLS)}
    assert base not in others and len(others) == 8
    bwd = key("sm90_bwd", "sm_90a", make_bwd_config("bfloat16", 128, False))
    assert bwd != key("sm90_bwd", "sm_90a", make_bwd_config("bfloat16", 128, False, deterministic=True))


def test_the_key_follows_the_dsl_environment(cache, monkeypatch):
    base = cc.make_key("sm90_fwd", "sm_90a", CFG, package="p", tools=TOOLS)
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")  # sass_for sets it itself: not keyed
    assert cc.make_key("sm90_fwd", "sm_90a", CFG, package="p", tools=TOOLS) == base
    monkeypatch.setenv("CUTE_DSL_SOME_OPTION", "1")
    assert cc.make_key("sm90_fwd", "sm_90a", CFG, package="p", tools=TOOLS) != base


def test_the_key_follows_the_sources(cache, tmp_path):
    """A change to any source file (here a temporary copy of fa4kernel's) is another key."""
    copy = tmp_path / "pkg"
    files = []
    for f in cc.package_files():
        dest = copy / f.relative_to(cc.PACKAGE_DIR)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
        files.append(dest)
    assert len(files) > 10 and any(f.name == "bwd.py" for f in files)
    before = cc.source_digest(files)
    assert cc.source_digest(files) == before
    bwd = next(f for f in files if f.name == "bwd.py")
    bwd.write_text(bwd.read_text() + "\n# a comment\n")
    after = cc.source_digest(files)
    assert after != before
    keys = {cc.make_key("sm90_bwd", "sm_90a", CFG, package=d, tools=TOOLS) for d in (before, after)}
    assert len(keys) == 2
    # a benchmark kernel's own module is keyed as a source too
    extra = tmp_path / "bench_x.py"
    extra.write_text("X = 1\n")
    one = cc.make_key("bench", "sm_90a", "case", [extra], package="p", tools=TOOLS)
    extra.write_text("X = 2\n")
    assert cc.make_key("bench", "sm_90a", "case", [extra], package="p", tools=TOOLS) != one


def test_a_package_source_changed_after_import_turns_the_cache_off(cache, monkeypatch):
    """If fa4kernel's files are not those this process imported, the cache is bypassed."""
    build = Build()
    stats = dict(cc._IMPORT_STATS)
    some = next(iter(stats))
    monkeypatch.setattr(cc, "_IMPORT_STATS", {**stats, some: (0, 0)})
    monkeypatch.setattr(cc, "_WARNED", False)
    with pytest.warns(RuntimeWarning, match="sources changed"):
        cc.cached("sm90_fwd", "sm_90a", CFG, build)
    cc.cached("sm90_fwd", "sm_90a", CFG, build)
    assert build.calls == 2 and not cc.entries(cache)


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", "no"])
def test_fa4lab_cache_off_bypasses(tmp_path, monkeypatch, value):
    monkeypatch.setenv("FA4LAB_CACHE", value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.cache_dir() is None
    build = Build()
    cc.cached("sm90_fwd", "sm_90a", CFG, build)
    cc.cached("sm90_fwd", "sm_90a", CFG, build)
    assert build.calls == 2 and not list(tmp_path.rglob("*.sass"))
    assert "off" in cc.info()


def test_the_default_folder_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("FA4LAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.cache_dir() == tmp_path / "fa4lab" / "sass"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cc.cache_dir() == cc.Path(os.path.expanduser("~")) / ".cache" / "fa4lab" / "sass"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "checksum", "other_key"])
def test_a_corrupt_entry_is_compiled_again(cache, damage):
    build = Build()
    cc.cached("sm90_fwd", "sm_90a", CFG, build)
    (path,) = cc.entries(cache)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:len(data) - 7])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "checksum":  # a whole entry whose text is not the one its header names
        magic, head, _ = data.split(b"\n", 2)
        path.write_bytes(magic + b"\n" + head + b"\n" + cc.zlib.compress(b"something else"))
    else:  # a whole entry of another key under this name
        other = cc.entry_path("0" * 64, cache)
        cc.write_entry(other, build.text, {})
        os.replace(other, path)
    assert cc.read_entry(path) is None
    assert cc.cached("sm90_fwd", "sm_90a", CFG, build) == build.text and build.calls == 2
    assert cc.read_entry(path) == build.text  # rewritten whole
    assert cc.cached("sm90_fwd", "sm_90a", CFG, build) == build.text and build.calls == 2


def test_refresh_compiles_and_rewrites(cache):
    build = Build()
    cc.cached("sm90_fwd", "sm_90a", CFG, build)
    build.text = build.text + "// again\n"
    assert cc.cached("sm90_fwd", "sm_90a", CFG, build, refresh=True) == build.text and build.calls == 2
    assert cc.cached("sm90_fwd", "sm_90a", CFG, Build("unused")) == build.text


def test_a_failed_build_leaves_no_entry(cache):
    def broken():
        raise RuntimeError("ptxas said no")

    with pytest.raises(RuntimeError, match="ptxas said no"):
        cc.cached("sm90_fwd", "sm_90a", CFG, broken)
    assert not cc.entries(cache) and not list(cache.glob("*.tmp"))


def test_clear_and_info(cache):
    for hd in (64, 128):
        cc.cached("sm90_fwd", "sm_90a", make_config("bfloat16", hd, False, False, {}), Build())
    assert "2 entries" in cc.info() and "sm90_fwd 2" in cc.info()
    assert cc.clear() == 2 and not cc.entries(cache) and not list(cache.iterdir())
    assert cc.main(["--info"]) == 0


def _worker(args):
    folder, text, log = args
    os.environ["FA4LAB_CACHE"] = folder
    cc._TOOLCHAIN = dict(TOOLS)

    def build():
        time.sleep(0.2)  # the others ask meanwhile (the assertions hold however they interleave)
        with open(log, "a") as f:
            f.write("compiled\n")
        return text

    return cc.cached("sm90_fwd", "sm_90a", CFG, build)


def test_concurrent_writers_leave_one_whole_entry(cache, tmp_path):
    """Processes asking for one build at once: each gets the whole text, one of them compiles it
    (the others wait on its lock and read its entry), one entry is left, no temporary file."""
    text = "".join(f"        /*{i:04x}*/  FFMA R{i % 200}, R1, R2, R3 ;\n" for i in range(20000))
    log = tmp_path / "compiles.log"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        got = pool.map(_worker, [(str(cache), text, str(log))] * 8)
    assert got == [text] * 8
    assert log.read_text().count("compiled") == 1
    (path,) = cc.entries(cache)
    assert cc.read_entry(path) == text and not list(cache.glob("*.tmp"))


def test_a_real_compile_is_read_back(cache, monkeypatch):
    """With the DSL: the backward's preprocess kernel (a small build) through sass_for twice, the
    second from the cache: the same text, and the compile really ran once."""
    pytest.importorskip("cutlass")
    monkeypatch.setattr(cc, "_TOOLCHAIN", None)  # the real toolchain's versions
    from fa4kernel import sass as sass_mod
    from fa4kernel.sm90.bwd_preprocess import compile_preprocess

    calls = []
    real = sass_mod._compile_and_disassemble
    monkeypatch.setattr(sass_mod, "_compile_and_disassemble", lambda *a: calls.append(1) or real(*a))
    cfg = make_bwd_config("bfloat16", 64, False)
    texts = [sass_mod.sass_for(lambda opts: compile_preprocess(cfg, opts), "sm_90a", cache=("sm90_bwd_pre", cfg))
             for _ in range(2)]
    assert texts[0] == texts[1] and "SHFL.BFLY" in texts[0] and len(calls) == 1
    assert len(cc.entries(cache)) == 1
    assert "nvidia-cutlass-dsl" in cc.toolchain() and cc.toolchain()["nvdisasm"]
