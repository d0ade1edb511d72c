"""The package imports without its optional extras, exports what it says, and installs as a
wheel that can create a database on its own."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_works_without_torch_psycopg_pyarrow_and_pillow() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'psycopg', 'pyarrow', 'PIL', 'starlette',"
        " 'jinja2', 'uvicorn'):\n"
        "            raise ImportError(f'blocked {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numpy as np\n"
        "import expstore\n"
        "from expstore import ReplayBuffer, DataRow, ExpMeta, Experience\n"
        "b = ReplayBuffer()\n"
        "b.store(DataRow(exp_meta=ExpMeta(task_id='t', agent_id='a', step=0),"
        " exp_data=Experience(state=np.ones(3))))\n"
        "assert len(b) == 1 and 'torch' not in sys.modules and 'PIL' not in sys.modules\n"
        "assert expstore.ImageConverter('state.x', output='hwc_uint8')\n"
        "try:\n"
        "    ReplayBuffer('postgresql+psycopg://u@127.0.0.1/db')\n"
        "except expstore.MissingDependencyError as e:\n"
        "    assert \"pip install 'expstore[postgres]'\" in str(e), e\n"
        "else:\n"
        "    raise SystemExit('expected MissingDependencyError')\n"
        "from expstore.ui import make_app\n"
        "try:\n"
        "    make_app('sqlite://')\n"
        "except expstore.MissingDependencyError as e:\n"
        "    assert \"pip install 'expstore[ui]'\" in str(e), e\n"
        "else:\n"
        "    raise SystemExit('expected MissingDependencyError for the viewer')\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.slow
def test_wheel_carries_migrations_and_creates_a_database(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(dist.glob("expstore-*.whl"))
    # A fresh venv holding only the wheel; its dependencies come from this environment
    # through a .pth path line (so the test needs no network), which does not bring this
    # checkout's expstore along.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site_dir = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site_dir / "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            "--target",
            str(site_dir),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    db = tmp_path / "fresh.db"
    code = (
        "import expstore, sys\n"
        "from expstore.db import migrate\n"
        f"assert expstore.__file__.startswith({str(site_dir)!r}), expstore.__file__\n"
        "assert migrate.script_location().name == '_migrations', migrate.script_location()\n"
        f"b = expstore.ReplayBuffer('sqlite:///{db}')\n"
        "b.store(expstore.DataRow(exp_meta=expstore.ExpMeta(task_id='t', agent_id='a', step=0),"
        " exp_data=expstore.Experience()))\n"
        "from pathlib import Path\n"
        "ui = Path(expstore.__file__).parent / 'ui'\n"
        "assert (ui / 'templates' / 'rows.html').is_file()\n"
        "assert (ui / 'static' / 'live.js').is_file()\n"
        "print(len(b))\n"
    )
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
