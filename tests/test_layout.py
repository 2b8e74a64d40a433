"""docs/DESIGN.md's layout section is the tree of the code: every module of reder/, pipeline/ and cluster/ is
listed there under its folder, and everything listed exists. And no comment, docstring or Markdown heading of the
code, the benchmarks, the tests, CI or the top-level docs names a tracker's ticket by number or a numbered round
of work: what a line is about, in words; its history belongs to git (the dated pages of docs/results/ keep
theirs)."""
import ast
import io
import re
import tokenize
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


TAG = re.compile(r"\b[Ii]ssues? #?\d+|\bstop \d+\b")
SHELL_COMMENT = re.compile(r"(?:^|\s)(#.*)$")  # a # at the line's start or after a blank, to the line's end


def tags_in_python(source: str) -> list[tuple[int, str]]:
    """(line, tag) of each tag in a Python source's comments and its module, class and function docstrings;
    string literals that are not docstrings are code, and not looked at."""
    found = [(token.start[0], match.group())
             for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT
             for match in TAG.finditer(token.string)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                start = node.body[0].lineno
                found += [(start + docstring.count("\n", 0, match.start()), match.group())
                          for match in TAG.finditer(docstring)]
    return sorted(found)


def tags_in_shell(text: str) -> list[tuple[int, str]]:
    """(line, tag) of each tag in a shell script's `#` comments."""
    return [(number, match.group()) for number, line in enumerate(text.splitlines(), 1)
            for comment in SHELL_COMMENT.findall(line) for match in TAG.finditer(comment)]


def tags_in_headings(text: str) -> list[tuple[int, str]]:
    """(line, tag) of each tag in a Markdown file's headings (its lines that start with #)."""
    return [(number, match.group()) for number, line in enumerate(text.splitlines(), 1) if line.startswith("#")
            for match in TAG.finditer(line)]


def tagged_places() -> list[str]:
    """`path:line: tag` for every tag in the Python files of the code, bench/ and tests/, the shell scripts of CI
    and bench/, and the headings of the READMEs and the top-level docs."""
    python = [ROOT / "run_pipeline.py", *(path for part in (*PARTS, "bench", "tests")
                                          for path in sorted((ROOT / part).rglob("*.py")))]
    shell = [ROOT / ".ci" / "run", *sorted((ROOT / "bench").rglob("*.sh"))]
    markdown = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    places = []
    for paths, finder in ((python, tags_in_python), (shell, tags_in_shell), (markdown, tags_in_headings)):
        for path in paths:
            places += [f"{path.relative_to(ROOT)}:{line}: {tag}"
                       for line, tag in finder(path.read_text(encoding="utf-8"))]
    return places


def test_no_comment_docstring_or_heading_names_an_issue_or_a_round_of_work():
    places = tagged_places()
    assert not places, ("a ticket or round-of-work number in a comment, docstring or heading (say what it refers "
                        "to in words; history belongs to git):\n" + "\n".join(places))


def test_the_tag_finder_sees_comments_docstrings_and_headings_but_not_string_literals():
    tag, stop = "issue" + " 42", "stop" + " 69"
    source = (f'"""A module (see {tag})."""\n'
              f'x = "{tag} and {stop} in a string literal are code"\n'
              f'y = 1  # set in {stop}\n'
              f'class Thing:\n'
              f'    """A class,\n    {tag.capitalize()}s and more."""\n'
              f'    def method(self):\n'
              f'        """A method, first line.\n\n        Then #{tag}."""\n'
              f'        return "{tag}"  # plain comment\n')
    assert tags_in_python(source) == [(1, tag), (3, stop), (6, tag.capitalize()), (10, tag)], tags_in_python(source)
    assert tags_in_python(f'x = "{tag}"\nprint(f"{stop}", x)\n') == []
    assert tags_in_shell(f'set -e\n# why ({tag})\necho "$#" ${{#a[@]}}  # see {stop}\necho "{tag}"\n') == \
        [(2, tag), (3, stop)]
    assert tags_in_headings(f"# Title\n\n## Part two ({tag})\n\nBody text, {tag}.\n### {stop}\n") == \
        [(3, tag), (6, stop)]
    assert tags_in_headings(f"## T{tag} and non{stop}\n") == []  # inside a word: not a tag
