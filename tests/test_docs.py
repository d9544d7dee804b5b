"""docs/guide.md is a tutorial: its Python blocks run, in order, and print what it says."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guide.md")


@pytest.mark.skipif(not os.path.exists(GUIDE), reason="docs/ is not in this test's runfiles")
def test_guide_examples_print_what_the_guide_says(capsys):
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 12
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/guide.md", "exec"), namespace)  # pylint: disable=exec-used
    printed = capsys.readouterr().out.splitlines()
    # every `print(...)   # expected` comment in the guide is what that line printed
    expected = [c.strip() for c in re.findall(r"print\(.*\)\s+# (.*)", text)]
    assert [p.strip() for p in printed] == [e.split(":")[0].strip() for e in expected]
