"""docs/architecture.md finds every module in one hop: a module it does not name fails here."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def named_modules(text: str) -> set[str]:
    """Module paths the page names: ``drift/mmd.py`` and brace groups like ``drift/{mmd,ks}.py``."""
    names = set()
    for prefix, group in re.findall(r"([\w/]*)\{([\w,]+)\}\.py", text):
        names.update(f"{prefix}{name}.py" for name in group.split(","))
    names.update(re.findall(r"`([\w/]+\.py)`", text))
    return names


def test_every_module_is_on_the_architecture_page():
    named = named_modules((ROOT / "docs" / "architecture.md").read_text())
    modules = {
        str(path.relative_to(ROOT / "monitor"))
        for path in (ROOT / "monitor").rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py", "_io.py")
    }
    assert sorted(modules - named) == []
