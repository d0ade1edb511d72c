"""The integrations import their frameworks only when used: expstore imports without
them, and using one without its framework says which extra to install."""

from __future__ import annotations

import subprocess
import sys

USES = {
    "torchrl": ("torchrl", "import expstore.integrations.torchrl"),
    "gymnasium": ("minari", "import expstore.integrations.gymnasium"),
    "export_minari": ("minari", "expstore.export_minari(expstore.ReplayBuffer(), 'x/y-v0')"),
    "import_minari": ("minari", "expstore.import_minari(expstore.ReplayBuffer(), 'x/y-v0')"),
}


def test_expstore_imports_without_them_and_a_missing_one_names_its_extra() -> None:
    code = [
        "import sys",
        "for name in ('torchrl', 'minari', 'gymnasium'):",
        "    sys.modules[name] = None  # as if it were not installed",
        "import expstore",
        "from expstore import *",
        "print('loaded', [m for m in ('tensordict', 'torchrl', 'minari') if sys.modules.get(m)])",
    ]
    for label, (_, use) in USES.items():
        code += [
            "try:",
            f"    {use}",
            "except expstore.MissingDependencyError as exc:",
            f"    print({label!r}, exc)",
        ]
    done = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines.pop("loaded") == "[]"
    assert set(lines) == set(USES)
    for label, (extra, _) in USES.items():
        assert f"pip install 'expstore[{extra}]'" in lines[label], lines[label]
