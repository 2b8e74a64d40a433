"""docs/DESIGN.md's layout section is the tree of the code: every module of reder/, pipeline/ and cluster/ is
listed there under its folder, and everything listed exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("reder", "pipeline", "cluster")


def listed_tree(text: str) -> set[str]:
    """The paths of the fenced tree in DESIGN.md's "Layout and import direction" section: each line's first word,
    nested by its indent (two spaces a level; a name ending in / is a folder)."""
    section = text.split("## Layout and import direction", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    paths, folders = set(), []
    for line in block.splitlines():
        if not line.strip() or line.startswith(" " * 20):  # a description's continuation
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        folders = folders[:depth]
        path = "/".join([*folders, name.rstrip("/")])
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        paths.add(path)
    return paths


def modules() -> set[str]:
    """Every Python module of the product's folders, with the folders themselves, and run_pipeline.py."""
    found = {"run_pipeline.py", "bench"}
    for part in PARTS:
        for path in (ROOT / part).rglob("*.py"):
            relative = path.relative_to(ROOT)
            found.add(str(relative))
            found.update(str(parent) for parent in relative.parents if str(parent) != ".")
    return found


def test_the_design_docs_tree_lists_every_module_and_nothing_that_is_not_there():
    listed = listed_tree((ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8"))
    present = modules()
    assert not present - listed, f"modules missing from DESIGN.md's layout: {sorted(present - listed)}"
    assert not listed - present, f"listed in DESIGN.md's layout but not in the tree: {sorted(listed - present)}"


def test_the_tree_reader_sees_a_missing_and_a_made_up_module():
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    listed = listed_tree(text)
    assert "pipeline/stages/ingest/sword.py" in listed and "reder/runtime/onednn.py" in listed
    assert "pipeline/training/harness.py" in listed and "cluster/connect.py" in listed
    broken = text.replace("    harness.py ", "    harnesses.py ", 1)
    assert "pipeline/training/harness.py" not in listed_tree(broken)
    assert "pipeline/training/harnesses.py" in listed_tree(broken)
