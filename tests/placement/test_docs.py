"""docs/placement.md is a tutorial: its Python blocks run, in order, in one namespace."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(ROOT, "docs", "placement.md")


@pytest.mark.skipif(not os.path.exists(GUIDE), reason="docs/ is not in this test's runfiles")
def test_placement_guide_examples_run(tmp_path, monkeypatch, capsys):
    with open(GUIDE, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/placement.md", "exec"), namespace)  # pylint: disable=exec-used
    printed = capsys.readouterr().out
    assert printed.startswith("max ") and "x over random, gap" in printed
    assert (tmp_path / "plan.json").exists()
    assert namespace["v"].devices == namespace["plan"].devices_for(namespace["second"])
    assert namespace["wide"].columns == {"ad_id": [32] * 4}   # the column-wise example
