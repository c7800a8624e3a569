"""docs/integration.md stays true: every C++ block is a region of examples/engine_loop.cpp
(between example-begin / example-end, indentation aside), and every Python block runs."""

import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "integration.md").read_text()
EXAMPLE = (ROOT / "examples" / "engine_loop.cpp").read_text()


def blocks(lang):
    return re.findall(r"```" + lang + r"\n(.*?)```", DOC, re.S)


def regions():
    found = re.findall(r"// example-begin (\S+)\n(.*?)\n\s*// example-end \1", EXAMPLE, re.S)
    return {name: textwrap.dedent(body).strip() for name, body in found}


def test_cpp_snippets_are_regions_of_the_example():
    cpp = blocks("cpp")
    assert len(cpp) == 3
    bodies = set(regions().values())
    for block in cpp:
        assert block.strip() in bodies, block[:200]


def test_python_snippets_run(capsys):
    python = blocks("python")
    assert python
    for block in python:
        exec(compile(block, "docs/integration.md", "exec"), {})
    assert "rollback floor" in capsys.readouterr().out
