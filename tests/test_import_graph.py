"""Dependencies point one way (magics -> run -> controller -> services/actors/rl -> weights -> system), with
no import cycle anywhere in the package; the package root holds only its public front; no module below the Run
takes or reads a Run; modules stay at 450 lines or fewer, folders at 12 modules; imports have no side effects;
the README draws the floors the imports keep."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "forge_nb"

# The floors: each top-level part of forge_nb with its layer. A module may import only from its own layer or
# lower ones. Keep it in step with the README's "Architecture".
LAYERS = {
    "system": 0,                                   # processes, meshes, hosts, files of the machine
    "models": 0, "rl": 1, "data": 1,               # model sources; RL's data types, losses, tasks; datasets
    "metrics": 1, "rundir": 1, "weights": 1,        # a run's records, its directory, weight versions
    "config": 2,                                   # RunConfig, the YAML, the trainer's schema
    "service": 3, "actors": 4,                     # services of actor replicas; the actors on them
    "controller": 5, "envs": 5, "agents": 5, "apps": 5, "tinker": 5,  # loops, assembly, environments, fronts
    "run": 6,                                      # the user's handle: forge_nb.spawn / resume / Run
    "recipes": 7, "widgets": 8, "magics": 9,       # ready configs; the dashboard; the %forge_* front
}
# parts that must not reach some lower ones: the widgets, data and the metrics read records, never processes
_PROCESSES = {"system.runtime", "service", "actors", "weights"}  # system.runtime: meshes, their pids, the probe
FORBIDDEN = {"widgets": _PROCESSES, "data": _PROCESSES, "rl": _PROCESSES, "metrics": _PROCESSES}
#: The TorchForge documents' wing: modules that exist because the documents import these paths (``forge.X`` is
#: ``forge_nb.X``, ``tests/seeds``), with the documents' shapes and meanings, on top of the native modules. Nothing
#: native imports them: only the wing itself and the package's lazy front (``forge_nb/__init__.py``).
COMPAT = ("apps", "data.rewards", "rl.loss", "rl.grading",
          "actors.advantages", "actors.dataset", "actors.reward", "actors.replay_buffer")
#: what the package root holds: the public front (``forge_nb``'s lazy names, the Run) and the floors' folders
ROOT_MODULES = ["__init__.py", "run.py"]


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "forge_nb" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    """The forge_nb modules (and ``module.name`` for each ``from module import name``) ``path`` imports."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module.startswith("forge_nb"):
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.parts == ("__init__",):
            continue
        out.append((rel.parts[0], path))
    return out


@pytest.mark.parametrize(("part", "path"), _modules(), ids=lambda x: str(x) if isinstance(x, str) else x.name)
def test_dependencies_point_one_way(part, path):
    assert part in LAYERS, f"new top-level part {part!r}: give it a layer in this test (and a floor in the README)"
    for module in _imports(path):
        target = _part(module)
        if target is None or target == part or target not in LAYERS:
            continue
        assert LAYERS[target] <= LAYERS[part], f"{path.name} ({part}) imports {module} from a higher layer"
        bad = [f for f in FORBIDDEN.get(part, ()) if module == f"forge_nb.{f}" or module.startswith(f"forge_nb.{f}.")]
        assert not bad, f"{path.name} ({part}) must not import {module}"


def _compat(module: str) -> bool:
    return any(module == f"forge_nb.{c}" or module.startswith(f"forge_nb.{c}.") for c in COMPAT)


def test_native_code_does_not_import_the_documents_wing():
    for name in COMPAT:
        assert (PACKAGE / f"{name.replace('.', '/')}.py").exists() or (PACKAGE / name.replace(".", "/")).is_dir(), name
    native = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if module == "forge_nb" or _compat(module):
            continue
        if reached := sorted(m for m in _imports(path) if _compat(m)):
            native[module] = reached
    assert not native, (f"native modules import the TorchForge documents' wing: {native}; import the native module "
                        "the wing is built on (forge_nb.rl.losses.ops for the ops, forge_nb.rl for the losses, ...)")


def test_the_package_root_holds_only_the_public_front():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ROOT_MODULES, (f"forge_nb/ holds {modules}: a module belongs in the folder of its floor "
                                     f"(system/, weights/, controller/...), only {ROOT_MODULES} stay at the root")
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(k for k in LAYERS if k != "run"), "every folder is a floor with a layer above"
    for folder in folders:
        init = PACKAGE / folder / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), \
            f"forge_nb/{folder}/__init__.py says what this floor holds (a docstring)"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """forge_nb module -> the forge_nb modules it imports anywhere in its file (inside functions and under
    TYPE_CHECKING too: an import back up there still means two modules share one responsibility)."""
    names = {_module_name(p): p for p in PACKAGE.rglob("*.py")}

    def resolve(module: str) -> str:
        while module not in names and "." in module:
            module = module.rsplit(".", 1)[0]
        return module

    graph = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {resolve(a.name) for a in node.names if a.name.startswith("forge_nb")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("forge_nb"):
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else resolve(node.module)
                            for a in node.names}
        graph[name] = targets - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    cycles = _cycles(_import_graph())
    assert not cycles, f"import cycles (each a set of modules that import one another): {cycles}"


MAX_LINES = 450
MAX_MODULES = 12  # .py files a folder holds, its __init__ included


def test_no_folder_over_12_modules():
    counts = {str(d.relative_to(PACKAGE.parent)): len(list(d.glob("*.py"))) for d in [PACKAGE, *PACKAGE.rglob("*")]
              if d.is_dir() and d.name != "__pycache__"}
    crowded = {name: n for name, n in counts.items() if n > MAX_MODULES}
    assert not crowded, f"split these folders by what their modules serve: {crowded}"


def test_no_module_over_450_lines():
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not long, f"split these modules (one concept per module): {long}"


def _fresh_import(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_importing_forge_nb_loads_nothing_heavy_and_changes_no_environment():
    loaded = _fresh_import("import os; before = dict(os.environ); import forge_nb; assert dict(os.environ) == before")
    assert not {"monarch", "torch", "vllm", "torchstore", "IPython"} & loaded


def test_a_run_config_is_built_and_checked_without_torch():
    """The kernel's path to its first spawn imports no torch (~2 s on two cores, which the trainer's processes
    would wait for): the quickstart's config, a loss built from its settings to check them, a bad one refused,
    and ``forge_nb.spawn`` itself, which starts the trainer's processes before it imports the run's modules."""
    loaded = _fresh_import(
        "import forge_nb\n"
        "forge_nb.spawn\n"
        "from forge_nb.config import RunConfig, TrainerConfig\n"
        "forge_nb.quickstart()\n"
        "RunConfig(trainer=TrainerConfig(loss='dapo', loss_config={'clip_high': 0.3}), advantage='rloo')\n"
        "try:\n"
        "    RunConfig(trainer=TrainerConfig(loss='grpo', loss_config={'clip_eps': -1.0}))\n"
        "except ValueError as e:\n"
        "    assert 'clip_eps must be > 0' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('a negative clip was accepted')\n")
    assert not {"torch", "vllm", "transformers"} & loaded  # monarch: the spawn starts processes


def test_rl_imports_neither_monarch_nor_ipython():
    loaded = _fresh_import("import forge_nb.rl; [getattr(forge_nb.rl, name) for name in forge_nb.rl.__all__]")
    assert not {"monarch", "IPython", "vllm"} & loaded


def _writes_of_a_run(path: Path) -> list[str]:
    """Where ``path`` writes a run's step, state or version: an assignment to ``<not self>.step|state|version``
    (``run._ctl.step = ...``) or a call of a ``set_state``. A class's own ``self.state`` (a mesh's, a
    replica's, the trainer's ``self.step``) is its own business, and so is a mesh's ``mesh.state`` that the
    runtime sets from outside the class (a kept mesh parked or adopted again)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]:
            if isinstance(target, ast.Attribute) and target.attr in ("step", "state", "version") \
                    and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "mesh")):
                found.append(f"line {node.lineno}: {ast.unparse(target)} = ...")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "set_state":
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_controller_writes_a_run_s_step_state_and_version():
    planted = PACKAGE.parent / "tests" / "test_import_graph.py"  # this file's own example below is found
    assert any("run._ctl.step = ..." in w for w in _writes_of_a_run(planted))
    outside = {str(p.relative_to(PACKAGE)): w for p in sorted(PACKAGE.rglob("*.py"))
               if p.relative_to(PACKAGE).parts[0] != "controller" and (w := _writes_of_a_run(p))}
    assert not outside, f"a run's step, state and version are the controller's to write: {outside}"


def _example_of_what_the_check_above_refuses(run) -> None:  # never called: the check's own test reads it
    run._ctl.step = 0


# -- the Run stays on its floor: episode functions and the code below get a RolloutContext, never the Run ---------

#: the parts below the Run's front (``forge_nb/run.py``): they never hold the Run, whose floor is above theirs
BELOW_THE_RUN = {part for part, layer in LAYERS.items() if layer < LAYERS["run"]}
#: ``run: Any`` parameters the package may keep: a Run (or what stands for one) passed untyped hides a climb
MAX_UNTYPED_RUNS = 5


def _reaches_a_run(path: Path) -> list[str]:
    """Where ``path`` reaches for a Run: a ``handle`` attribute read or written (a Controller's Run, handed to
    episode functions), or a call of ``.serve_openai(...)`` (the Run's method that starts its endpoint). A method
    called ``handle`` (logging's ``Logger.handle(record)``) is not a Run."""
    tree = ast.parse(path.read_text())
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "handle" and id(node) not in called:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "serve_openai":
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _untyped_runs(path: Path) -> list[str]:
    """The parameters called ``run`` annotated ``Any`` in ``path``."""
    return [f"line {node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.arg) and node.arg == "run" and node.annotation is not None
            and ast.unparse(node.annotation) == "Any"]


def test_no_module_below_the_run_reads_a_run():
    planted = _reaches_a_run(Path(__file__))  # this file's own example below is found, logging's handle() is not
    assert [w.split(": ", 1)[1] for w in planted] == ["ctl.handle", "run.serve_openai()"], planted
    below = {str(p.relative_to(PACKAGE)): w for p in sorted(PACKAGE.rglob("*.py"))
             if p.relative_to(PACKAGE).parts[0] in BELOW_THE_RUN and (w := _reaches_a_run(p))}
    assert not below, (f"code below the Run reaches for it: {below}; read what a rollout needs off its "
                       "RolloutContext (forge_nb.controller.context): the episode function's first argument")


def test_at_most_a_few_untyped_run_parameters():
    assert len(_untyped_runs(Path(__file__))) == 1  # this file's own example below
    found = {str(p.relative_to(PACKAGE)): w for p in sorted(PACKAGE.rglob("*.py")) if (w := _untyped_runs(p))}
    count = sum(map(len, found.values()))
    assert count <= MAX_UNTYPED_RUNS, (f"{count} parameters `run: Any` (at most {MAX_UNTYPED_RUNS}): {found}; type "
                                       "each as what it gets: a RolloutContext below the Run, the Run above it")


async def _example_of_what_the_checks_above_refuse(ctl, log, run: Any) -> Any:  # never called: read by the checks
    log.handle(None)
    episode = ctl.handle
    await run.serve_openai()
    return episode


def _readme_floors(readme: str) -> dict[str, int]:
    """The floors as the README's Architecture section draws them: ``floor N  part/ part/ ...  what they hold``
    (a part's sub-folders, in parentheses, live on its floor; ``run.py`` is the part ``run``)."""
    found: dict[str, int] = {}
    for floor, names in re.findall(r"^floor (\d+)  (.+?)  ", readme, flags=re.MULTILINE):
        for name in re.sub(r"\(.*?\)", "", names).split():
            found[name.removesuffix("/").removesuffix(".py")] = int(floor)
    return found


def test_the_readme_draws_the_floors_the_imports_keep():
    readme = (PACKAGE.parent / "README.md").read_text()
    drawn = _readme_floors(readme)
    differ = {k: (drawn.get(k), LAYERS.get(k)) for k in drawn.keys() | LAYERS.keys() if drawn.get(k) != LAYERS.get(k)}
    assert not differ, f"the README's floors and this test's LAYERS differ (README, LAYERS): {differ}"
    folders = sorted(f"{d.name}/" for d in PACKAGE.glob("*/*/") if (d / "__init__.py").exists())
    missing = [f for f in folders if not re.search(rf"^floor \d+  .*\b{re.escape(f)}", readme, flags=re.MULTILINE)]
    assert not missing, f"sub-folders the README's floors do not name: {missing}"
