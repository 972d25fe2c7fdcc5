"""The layers of the code base, read from the import statements of every module (no import runs).

Every import counts: at the top of a module, inside a function, under ``if TYPE_CHECKING``. A
deferred import still ties the two modules together, and a circle of them still decides which
one is half-initialised when the other asks for a name. So:

- no circle of modules, at any depth;
- no import runs back up :data:`LAYERS`: a module imports modules of its own layer and of the
  layers below it, never of one above.

An import through ``importlib`` (a registry loading a user's module by name) is not read.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "workers", "webapp")

# The layers, top first: (what the layer is, the modules in it by prefix). A module belongs to
# the layer of the longest prefix that names it or a package above it. The configuration sits
# low, under everything that takes a typed config, so it reads only the name lists below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bridge: the Celery tasks and the run driver, between studio and engine", ("workers",)),
    ("studio: the Django apps, their services and views, the API", ("webapp",)),
    (
        "entry points: main_ppo, evaluation, the checkpoint merger, verl's names",
        ("engine", "engine.main_ppo", "engine.eval", "engine.model_merger", "engine.utils"),
    ),
    ("trainer: the PPO loop, its metrics, checkpoints and records", ("engine.trainer",)),
    ("distributed: Ray worker groups, one FSDP rank per actor", ("engine.distributed",)),
    ("roles: actor, critic, rollout-reference, loading their models", ("engine.roles",)),
    ("rollout: the generation backends, multi-turn with tools", ("engine.rollout",)),
    ("tools: what a policy may call, and the calculator task", ("engine.tools",)),
    ("tiny: the embedded tiny model, tokenizer and arithmetic task", ("engine.tiny",)),
    ("rewards: scorers by data source, composites, reward managers", ("engine.rewards",)),
    ("algorithms: advantages, policy losses, KL, pure tensor functions", ("engine.algorithms",)),
    (
        "tensors and models: DataProto and datasets, the lean forward, LoRA, the device, its "
        "system metrics",
        ("engine.data", "engine.llama_forward", "engine.lora", "engine.device_info", "engine.perf"),
    ),
    ("configuration: verl's keys as typed dataclasses and their rules", ("engine.config",)),
    (
        "names: the torch-free name lists, the registry reader they use, the process environment "
        "(the reward services an administrator allows among it), loading a Python file a key "
        "names",
        (
            "engine.algorithms.names",
            "engine.algorithms.registry",
            "engine.rewards.names",
            "engine.rewards.endpoints",
            "engine.rewards.judge_prompt",
            "engine.rollout.names",
            "engine.tools.names",
            "engine.env",
            "engine.python_files",
        ),
    ),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Return every module of ``packages`` under ``root`` (migrations aside) by its name."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_name(path, root)] = path
    return found


def imports(path: Path, root: Path) -> Iterator[tuple[str, int]]:
    """Yield (imported name, line) for each import anywhere in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from a import b`` names module a.b when there is one, else a name in a.
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """Return the project module ``name`` refers to (a module, or the package it is in)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


Graph = dict[str, dict[str, int]]  # module -> {imported module: line of its first import}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Return which project modules each module imports, at any depth, and on which line."""
    known = modules(root, packages)
    graph: Graph = {}
    for module, path in known.items():
        targets = graph.setdefault(module, {})
        for name, line in imports(path, root):
            target = resolve(name, known)
            if target is not None and target != module:
                targets.setdefault(target, line)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def circle_offences(graph: Graph) -> list[str]:
    """Return one line per circle: its modules, and each import that ties two of them."""
    offences = []
    for component in cycles(graph):
        members = set(component)
        ties = [
            f"{module}:{line} -> {target}"
            for module in component
            for target, line in sorted(graph[module].items())
            if target in members
        ]
        offences.append(f"circle of {len(component)} modules: {'; '.join(ties)}")
    return offences


def layer_of(module: str) -> int:
    """Return the index in LAYERS (0 is the top) of the layer ``module`` belongs to."""
    best, depth = len(LAYERS), -1
    for position, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = position, len(prefix)
    return best


def layer_name(module: str) -> str:
    """Return the short name of ``module``'s layer (the words before the colon)."""
    return LAYERS[layer_of(module)][0].split(":")[0]


def upward_offences(graph: Graph) -> list[str]:
    """Return one line per import of a module in a layer above the importer's."""
    return [
        f"{module}:{line} ({layer_name(module)}) imports {target} ({layer_name(target)})"
        for module, targets in sorted(graph.items())
        for target, line in sorted(targets.items(), key=lambda item: item[1])
        if layer_of(target) < layer_of(module)
    ]


def test_every_layer_names_modules_of_the_tree():
    known = modules()
    stale = [prefix for _, prefixes in LAYERS for prefix in prefixes if prefix not in known]
    assert stale == [], "a module was moved or renamed: put its new name in LAYERS"


def test_no_import_at_any_depth_runs_back_up_the_layers():
    offences = upward_offences(import_graph())
    assert offences == [], "\n".join(offences)


def test_imports_at_any_depth_form_no_circle():
    offences = circle_offences(import_graph())
    assert offences == [], "\n".join(offences)


def plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_planted_circle_through_a_function_level_import_fails_the_check(tmp_path):
    plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import helper\n",
            "pkg/b.py": "def helper():\n    from . import c\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "import pkg.a\n",  # imports into the circle, not part of it
        },
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert circle_offences(graph) == [
        "circle of 3 modules: pkg.a:1 -> pkg.b; pkg.b:2 -> pkg.c; pkg.c:1 -> pkg.a"
    ]


def test_a_planted_import_up_the_layers_fails_the_check(tmp_path):
    plant(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/algorithms/__init__.py": "",
            "engine/algorithms/names.py": "",
            "engine/algorithms/loss.py": "def loss():\n    from engine.trainer.loop import step\n",
            "engine/config/__init__.py": "",
            "engine/config/schema.py": (
                "from engine.algorithms import names\nfrom ..algorithms.loss import loss\n"
            ),
            "engine/trainer/__init__.py": "",
            "engine/trainer/loop.py": "import engine.config.schema\n",
        },
    )
    graph = import_graph(tmp_path, ("engine",))
    # The name list sits below the configuration, the rest of its package above it.
    assert upward_offences(graph) == [
        "engine.algorithms.loss:2 (algorithms) imports engine.trainer.loop (trainer)",
        "engine.config.schema:2 (configuration) imports engine.algorithms.loss (algorithms)",
    ]
    assert cycles(graph) == [
        ["engine.algorithms.loss", "engine.config.schema", "engine.trainer.loop"]
    ]
