"""The executable blocks of the docs: a page's text between ``<!-- NAME:start -->`` and
``<!-- NAME:end -->``, which tests run as written (so the docs cannot drift from the code)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: where each marked block lives (README.md repeats the first tour: test_docs checks they agree)
BLOCKS = {
    "tour": DOCS / "getting-started" / "tour.md",
    "nvkectl-tour": DOCS / "tenant" / "nvkectl.md",
    "faults": DOCS / "operator" / "health-and-repair.md",
}


def marked_block(name: str, path: Path | None = None) -> str:
    """The raw text between the markers ``name`` in ``path`` (default: :data:`BLOCKS`)."""
    text = (path or BLOCKS[name]).read_text()
    found = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert found, f"{path or BLOCKS[name]} lost its {name} block"
    return found.group(1)


def bash_block(name: str, path: Path | None = None) -> str:
    """The ```` ```bash ```` code inside the block ``name``."""
    found = re.search(r"```bash\n(.*?)```", marked_block(name, path), re.S)
    assert found, f"the {name} block has no bash code"
    return found.group(1)
