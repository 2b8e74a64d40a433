"""No import cycle among the project's modules: every import counts, at the top of a file, inside a function
or under `if TYPE_CHECKING:` (a lazy import still ties two modules, and one under TYPE_CHECKING is a cycle
waiting for the first real use)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("reder", "pipeline", "cluster", "bench", "run_pipeline")


def module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every name an import anywhere in `tree` may bind to a module: `import a.b` → a.b; `from a import b` → a
    and a.b; relative imports resolved against `module`."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(part for part in [*package, base] if part)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path, parts: tuple[str, ...] = PARTS) -> dict[str, set[str]]:
    """Module → the project modules it imports (itself left out)."""
    files = [p for part in parts for p in [*root.glob(f"{part}/**/*.py"), *root.glob(f"{part}.py")]]
    names = {module_name(p, root): p for p in files}
    return {name: {d for d in imported(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py")
                   if d in names and d != name} for name, path in names.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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


def test_the_project_has_no_import_cycle():
    graph = import_graph(ROOT)
    assert {"reder.model", "reder.objectives.duplex", "pipeline.training.trainloop"} <= set(graph)  # the files were found
    assert "reder.model" in graph["reder.objectives.duplex"]  # and their imports read
    assert cycles(graph) == []


def test_a_cycle_through_a_lazy_or_type_checking_import_is_found(tmp_path):
    package = tmp_path / "reder"
    (package / "objectives").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "objectives" / "__init__.py").write_text("")
    (package / "model.py").write_text("def loss():\n    from reder.objectives.duplex import total\n")
    (package / "objectives" / "duplex.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..model import REDER\n")
    (package / "heads.py").write_text("from reder import model\n")
    graph = import_graph(tmp_path, ("reder",))
    assert graph["reder.objectives.duplex"] == {"reder.model"}  # the relative import, resolved
    assert cycles(graph) == [["reder.model", "reder.objectives.duplex"]]
    (package / "model.py").write_text("")
    assert cycles(import_graph(tmp_path, ("reder",))) == []


def test_every_public_name_of_reder_resolves_and_an_unknown_one_is_an_attribute_error():
    """reder's torch names load on first use (its module `__getattr__`): each of `__all__` is there, once."""
    import reder

    for name in reder.__all__:
        assert getattr(reder, name) is getattr(reder, name), name
    from reder import REDER, load
    from reder.api import load as api_load
    from reder.model import REDER as model_reder

    assert (REDER, load) == (model_reder, api_load)
    try:
        reder.Decoder
    except AttributeError as error:
        assert "no attribute 'Decoder'" in str(error)
    else:
        raise AssertionError("reder.Decoder resolved")


def test_the_pipelines_driver_loads_torch_only_for_a_stage_that_trains_or_decodes():
    """`run_pipeline`, the graph, every stage module and the config import without torch (its ~180 MB are the
    driver's during the data stages otherwise); tests/faults/test_dependencies.py runs the data stages with torch
    unimportable."""
    import subprocess
    import sys

    probe = ("import sys, run_pipeline, pipeline.graph, pipeline.stagekeys, pipeline.stages.tune; "
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout
