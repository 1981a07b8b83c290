"""fa4sim's architecture, checked from its source: imports point one way (no cycle among its
modules, function-level imports included), the simulator and the kernel never reach into the
lab's or the benchmarks' code, and no module takes another module's private (_name) names.

The import graph is read with ast, so nothing here is imported or run."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fa4sim", "fa4kernel")
OUTSIDE = ("lab", "benchmarks")  # what the simulator and the kernel must not import

# (importing module, imported module, name): private names taken across modules that cannot move
# today. Empty: keep it so; a name another module needs is public.
PRIVATE_ALLOWED: set = set()


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> its file, for every .py under the package (a package is its __init__)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, relative imports resolved against module `name`."""
    if not node.level:
        return node.module
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    return ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))


def _imports(name: str, path: Path, known: set) -> list[tuple[str, str | None, int]]:
    """(imported module, the name taken from it or None, line) for every import in the file,
    at any depth (function-level imports too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _base(name, path, node)
            for a in node.names:
                sub = f"{mod}.{a.name}"
                # `from pkg import mod` imports the module; `from mod import name` a name of it
                out.append((sub, None, node.lineno) if sub in known else (mod, a.name, node.lineno))
    return out


def _graph(package: str = "fa4sim") -> tuple[dict, dict]:
    mods = _modules(package)
    known = set(mods)
    edges = {m: set() for m in mods}
    taken = {}
    for m, path in mods.items():
        taken[m] = _imports(m, path, known)
        for target, _, _ in taken[m]:
            if target in known and target != m:
                edges[m].add(target)
    return edges, taken


def _cycle(edges: dict) -> list | None:
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == "open":
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_sees_function_level_imports():
    # a guard on the guard: cli imports model inside its commands only
    edges, _ = _graph()
    assert "fa4sim.model" in edges["fa4sim.cli"]
    assert "fa4sim.schedules.fa3_sm90" in edges["fa4sim.schedules"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    cycle = _cycle(_graph(package)[0])
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_kernels_never_import_the_api_layer():
    # the kernels and their configs sit below fa4kernel's host API (interface, autograd, the package)
    edges, _ = _graph("fa4kernel")
    api = {"fa4kernel", "fa4kernel.interface", "fa4kernel.autograd"}
    for m, targets in edges.items():
        if m.startswith(("fa4kernel.sm90", "fa4kernel.sm100")):
            assert not targets & api, f"{m} imports {sorted(targets & api)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_of_lab_or_benchmarks(package):
    bad = [f"{m}:{line} imports {target}" for m, path in _modules(package).items()
           for target, _, line in _imports(m, path, set())
           if target.split(".")[0] in OUTSIDE]
    assert not bad, "\n".join(bad)


def test_data_never_imports_schedules_or_the_model():
    # the implementations and the hardware profiles are data the model reads, not the other way round
    edges, _ = _graph()
    for data in ("fa4sim.implementation", "fa4sim.hardware", "fa4sim.params"):
        bad = {t for t in edges[data] if t.startswith(("fa4sim.schedules", "fa4sim.model"))}
        assert not bad, f"{data} imports {sorted(bad)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_taken_across_modules(package):
    edges, taken = _graph(package)
    known = set(edges)
    bad = []
    for m, imports in taken.items():
        for target, name, line in imports:
            if (target in known and target != m and name and name.startswith("_") and not name.startswith("__")
                    and (m, target, name) not in PRIVATE_ALLOWED):
                bad.append(f"{m}:{line} imports {target}.{name}")
    assert not bad, "\n".join(bad)


def test_no_private_attribute_of_another_module():
    # `from . import power` then `power._x`: the same reach by attribute
    mods = _modules("fa4sim")
    known = set(mods)
    bad = []
    for m, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = _base(m, path, node)
                aliases.update({a.asname or a.name: f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known})
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.name in known and a.asname})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id] != m):
                bad.append(f"{m}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_the_solver_needs_no_driver():
    # modulo (CP-SAT) replays its programs in the engine and measures them as steady_state does
    edges, _ = _graph()
    assert not {t for t in edges["fa4sim.modulo"] if t in ("fa4sim.model", "fa4sim.cli", "fa4sim.sweep")}


# A user's pages speak in the present tense: no dates, no names of measurement campaigns (those
# live in lab/campaigns). Result-file paths in commands are not prose: a path is left out first.
PAGES = ("README.md", "fa4kernel/README.md", "docs/model.md")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
CAMPAIGN_WORDS = re.compile(r"\b(holdout|unseen|untried|blind|novel)\b", re.I)
PATH = re.compile(r"[\w./*-]+\.(json|gz|md|py|png)\b|[\w-]+/[\w./*-]+")


@pytest.mark.parametrize("page", PAGES)
def test_user_pages_carry_no_dates_or_campaigns(page):
    bad = []
    for n, line in enumerate((ROOT / page).read_text().splitlines(), 1):
        prose = PATH.sub("", line)
        if DATE.search(prose) or CAMPAIGN_WORDS.search(prose):
            bad.append(f"{page}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


# The product and the teaching carry no dated record: fa4sim, fa4kernel, the lessons (their
# notebooks too), the figures' script, docs/model.md and the two READMEs name no date and no
# measurement campaign, not even inside a path. Dated records live in lab/ (lab/campaigns/<topic>/
# and lab/findings/); code and lessons find recorded results through lab/results.json by kind,
# device and campaign (lab/tools/index.py, lessons/lessonkit), and cite evidence by campaign folder
# or findings page.
UNDATED_TREES = ("fa4sim", "fa4kernel", "lessons", "figures")
UNDATED_FILES = ("docs/model.md", "README.md", "fa4kernel/README.md")
ANY_DATE = re.compile(r"20\d\d-\d\d-\d\d")
# as a name (after "_", before "_", "." or a word's end) and the three words at all
CAMPAIGN_NAMES = re.compile(r"_(holdout|unseen|asked|again|fresh|novel|untried|blind)(?![a-z])"
                            r"|(?<![a-z])(holdout|unseen|untried)(?![a-z])", re.I)


def _tracked(*paths: str) -> list[Path]:
    """The tracked files under `paths` (git ls-files; without git, every file but caches)."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, capture_output=True, check=True)
        files = [ROOT / f for f in out.stdout.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = [f for p in paths for f in ((ROOT / p).rglob("*") if (ROOT / p).is_dir() else [ROOT / p])]
    return [f for f in files if f.is_file() and "__pycache__" not in f.parts]


def _text(path: Path) -> str | None:
    raw = path.read_bytes()
    if b"\0" in raw[:8192]:
        return None  # a binary file (a figure)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_the_undated_trees_carry_no_dates_or_campaign_names():
    files = _tracked(*UNDATED_TREES, *UNDATED_FILES)
    assert any(f.suffix == ".ipynb" for f in files) and any(f.name == "h100.json" for f in files)
    bad = []
    for f in files:
        text = _text(f)
        for n, line in enumerate((text or "").splitlines(), 1):
            m = ANY_DATE.search(line) or CAMPAIGN_NAMES.search(line)
            if m:
                bad.append(f"{f.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()[:100]}")
    assert not bad, "dated records belong in lab/ (cite the campaign folder or findings page):\n" + "\n".join(bad)


def test_the_date_check_sees_a_date_and_a_campaign_name():
    # a guard on the guard
    assert ANY_DATE.search("lab/campaigns/x/power_h100_2026-11-24.json")
    assert CAMPAIGN_NAMES.search("sustained_holdout_h100.json") and CAMPAIGN_NAMES.search("the _again run")
    assert CAMPAIGN_NAMES.search("an untried problem") and not CAMPAIGN_NAMES.search("a fresh atom, asked once")
