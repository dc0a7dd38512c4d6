"""docs/architecture.md finds every module in one hop: a module it does not name fails here."""

import re

from tests.support.paths import REPO


def named_modules(text: str) -> set[str]:
    """Module paths the page names: ``drift/mmd.py`` and brace groups like ``drift/{mmd,ks}.py``."""
    names = set()
    for prefix, group in re.findall(r"([\w/]*)\{([\w,]+)\}\.py", text):
        names.update(f"{prefix}{name}.py" for name in group.split(","))
    names.update(re.findall(r"`([\w/]+\.py)`", text))
    return names


def test_every_module_is_on_the_architecture_page():
    named = named_modules((REPO / "docs" / "architecture.md").read_text())
    modules = {
        str(path.relative_to(REPO / "monitor"))
        for path in (REPO / "monitor").rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py", "_io.py")
    }
    assert sorted(modules - named) == []
