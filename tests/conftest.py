import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# ---- pytest-xdist (the dev extra): `python -m pytest` runs on every core
#
# With xdist installed and no --dist given, a run takes `-n auto` (unless -n says otherwise; -n 0:
# one process, as before) and the scheduler below. It is not in pyproject's addopts, so that
# `-p no:xdist`, a run without xdist and a run of lessons/ alone (which does not load this file:
# serial) all work as before.
#
# The scheduler hands out work units (xdist's LoadScopeScheduling): a whole test file (its
# module-level memos and module-scoped fixtures are computed once), a whole notebook (nbval runs
# its cells in order in one kernel), except in SPLIT_FILES, whose tests share nothing but compiled
# SASS: the on-disk compile cache (fa4kernel/compile_cache.py) shares that between workers, so
# each of their tests is a unit of its own; the backward's two layout probes of one build (its
# thread layouts' and its bulk fragment order's, which share that build's dQ coordinates: a
# module-level memo) are one unit per build. The files with GPU tests are one unit (one GPU,
# timed measurements).
# (xdist's own --dist loadgroup does not group under pytest 9: it renames item._nodeid, which
# pytest 9 no longer reads.)
SPLIT_FILES = {"test_kernel_sm90_bwd_compile.py", "test_kernel_sm90_compile.py", "test_kernel_sm100_compile.py",
               "test_sass_tables_compile.py"}
# tests of a SPLIT file that share a module-level memo (tests/test_kernel_sm90_bwd_compile.py's
# dq_coords, per build): one unit per build, named by the test's parameters ("[hd-tile_m]"; the
# kv_split probes take "[hd]" and tile_m 64)
TOGETHER = {"test_bwd_thread_layouts_cover_the_tiles": "sm90_bwd_probe", "test_bwd_bulk_fragment_order": "sm90_bwd_probe",
            "test_bwd_kv_split_thread_layouts_cover_the_tiles": "sm90_bwd_probe",
            "test_bwd_kv_split_bulk_fragment_order": "sm90_bwd_probe"}
GPU_FILES = {"test_kernel_sm90_gpu.py", "test_kernel_sm90_bwd_gpu.py", "test_calibrate_bwd_units.py",
             "test_calibrate_mem_power.py", "test_bench_needs_gpu.py", "test_torch_op_gpu.py",
             "test_transformers_integration_gpu.py", "test_kvcache_gpu.py"}
# handed out first (units go in collection order): the longest, so that no worker is left alone
# with one of them at the end
FIRST = ("09_backward.ipynb", "test_kernel_sm90_bwd_compile.py", "06_what_ifs.ipynb",
         "07_hopper_forward_advanced.ipynb", "08_power_wall.ipynb")


def work_unit(nodeid: str) -> str:
    """The scheduler's unit of a test: its file, its own id in SPLIT_FILES, "gpu" for GPU_FILES."""
    path, _, name = nodeid.partition("::")
    base = os.path.basename(path)
    if base in SPLIT_FILES:
        func, _, params = name.partition("[")
        if func in TOGETHER:
            params = params.rstrip("]")
            return f"{TOGETHER[func]}[{params if '-' in params else params + '-64'}]"
        return nodeid
    if base in GPU_FILES:
        return "gpu"
    return path


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads -n
def pytest_cmdline_main(config):
    if not config.pluginmanager.has_plugin("xdist") or hasattr(config, "workerinput"):
        return
    if config.option.dist == "no" and not config.option.collectonly:
        if config.option.numprocesses is None:
            config.option.numprocesses = "auto"  # one worker per core (PYTEST_XDIST_AUTO_NUM_WORKERS)
        config.option.dist = "loadfile"  # a scope scheduler; _Xdist replaces it by work_unit's
        config._fa4lab_units = True


class _Xdist:
    """xdist's hooks (registered only where xdist is)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        if not getattr(config, "_fa4lab_units", False):
            return None
        from xdist.scheduler import LoadScopeScheduling

        class Units(LoadScopeScheduling):
            def _split_scope(self, nodeid):
                return work_unit(nodeid)

        config.option.loadscopereorder = False  # keep the order below (FIRST), not by test count
        return Units(config, log)

    @staticmethod
    def pytest_configure_node(node):
        if getattr(node.config, "_fa4lab_units", False):
            node.workerinput["fa4lab_units"] = True  # the workers order their collection (FIRST)


def pytest_configure(config):
    if config.pluginmanager.has_plugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Xdist(), "fa4lab-xdist")


def _no_sass_here():
    """Why the CuTe DSL cannot print SASS on this machine (None where it can): it accepts only an
    nvdisasm at least as new as its own CUDA (the pip wheel nvidia-cuda-nvdisasm, the dev extra);
    a GPU machine's older toolkit nvdisasm is refused."""
    try:
        from cutlass.base_dsl.env_manager import _find_nvdisasm_binary
    except ImportError:
        return None  # no DSL: the compile tests skip themselves (importorskip)
    try:
        _find_nvdisasm_binary()
    except Exception as e:  # DSLUserCodeError, with the version it found
        import re

        return re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()[0][:200]
    return None


def pytest_collection_modifyitems(config, items):
    compiled = [it for it in items if it.get_closest_marker("compile")]
    why = _no_sass_here() if compiled else None
    if why:
        skip = pytest.mark.skip(reason=f"compile tests read SASS, and this machine has no nvdisasm the CuTe DSL "
                                       f"accepts (pip install nvidia-cuda-nvdisasm): {why}")
        for it in compiled:
            it.add_marker(skip)
    if not getattr(config, "workerinput", {}).get("fa4lab_units"):
        return
    rank = {name: i for i, name in enumerate(FIRST)}
    # a stable sort (every worker collects the same list): the FIRST files' items first, each
    # file's items in their order, then the rest as collected
    items.sort(key=lambda it: rank.get(os.path.basename(str(getattr(it, "path", None) or it.fspath)), len(FIRST)))
