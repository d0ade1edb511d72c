"""CLI conveniences: --version, listing buffers, a bare file path for --db, and a reader
that goes away early (``| head``) is not an error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from expstore import ReplayBuffer
from expstore._version import __version__
from expstore.db import migrate
from tests.helpers import make_rows

ROOT = Path(__file__).resolve().parents[2]


def test_version_option(invoke: Any) -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == (
        f"expstore {__version__} (schema revision {migrate.head_revision()})"
    )


def test_buffers_lists_each_buffer_with_its_rows(invoke: Any, tmp_path: Path) -> None:
    path = tmp_path / "many.db"
    with ReplayBuffer(f"sqlite:///{path}", name="a") as a:
        a.store_batch(make_rows(3))
        a.set_policy_version(7)
    with ReplayBuffer(f"sqlite:///{path}", name="b", capacity=10, eviction="max_reward") as b:
        b.store_batch(make_rows(12))
    table = invoke("buffers", "--db", str(path)).stdout.splitlines()  # a bare path
    assert table[0].split() == ["buffer", "rows", "capacity", "eviction", "version"]
    assert table[2].split() == ["a", "3", "unlimited", "fifo", "7"]
    assert table[3].split() == ["b", "10", "10", "max_reward"]
    listed = json.loads(invoke("buffers", "--db", str(path), "--json").stdout)["buffers"]
    assert [(b["name"], b["rows"]) for b in listed] == [("a", 3), ("b", 10)]


def test_a_bare_path_names_a_sqlite_file(invoke: Any, tmp_path: Path) -> None:
    with ReplayBuffer(f"sqlite:///{tmp_path / 'plain.db'}") as buffer:
        buffer.store_batch(make_rows(4))
    result = invoke("stats", "--db", str(tmp_path / "plain.db"), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["rows"] == 4


@pytest.mark.parametrize(
    "command",
    [
        ["stats", "--json"],
        ["buffers", "--json"],
        ["query", "--json", "--limit", "2"],
        ["sample", "--json", "--batch-size", "2"],
        ["version"],
    ],
)
def test_the_database_can_be_given_as_a_positional_argument(
    invoke: Any, tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "agents.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(4))
    positional = invoke(command[0], str(path), *command[1:])
    assert positional.exit_code == 0, positional.stderr
    by_option = invoke(command[0], "--db", str(path), *command[1:])
    if command[0] in ("stats", "buffers", "version"):
        assert positional.stdout == by_option.stdout
    # it wins over --db (and so over EXPSTORE_URL)
    other = invoke(command[0], str(path), "--db", str(tmp_path / "absent.db"), *command[1:])
    assert other.exit_code == 0, other.stderr


def test_export_into_a_closed_pipe_is_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(3000))
    command = f"{sys.executable} -m expstore export --db {path} - | head -1"
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Broken pipe" not in done.stderr and "Error" not in done.stderr
    assert json.loads(done.stdout)["id"]


def test_upgrade_sql_starts_from_the_database_revision(invoke: Any, tmp_path: Path) -> None:
    from expstore.db.engine import create_sql_engine

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with ReplayBuffer(url):
        pass
    engine = create_sql_engine(url).execution_options(expstore_begin="IMMEDIATE")
    migrate.downgrade(engine, "0004")
    engine.dispose()
    sql = invoke("upgrade", "--sql", "--db", url).stdout
    assert "policy_version" in sql and "CREATE TABLE expstore_rows" not in sql
    assert "UPDATE expstore_alembic_version SET version_num='0005'" in sql
    fresh = invoke("upgrade", "--sql", "--db", f"sqlite:///{tmp_path / 'none.db'}").stdout
    assert "CREATE TABLE expstore_rows" in fresh  # no database yet: everything
    invoke("upgrade", "--db", url)
    done = invoke("upgrade", "--sql", "--db", url).stdout
    assert "nothing to upgrade" in done


def test_delete_where_asks_first_and_says_what_went(invoke: Any, tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(20))
    asked = invoke("delete", "--db", str(path), "--where", "step >= 3")
    assert asked.exit_code == 1 and "add --yes" in asked.stderr
    assert invoke("delete", "--db", str(path)).exit_code == 1  # --where is required
    done = invoke("delete", "--db", str(path), "--where", "step >= 3", "--yes")
    assert done.exit_code == 0 and "Deleted 8 rows; buffer 'default' now holds 12" in done.stdout
    none = invoke("delete", "--db", str(path), "--where", "step >= 3", "--yes")
    assert "nothing deleted" in none.stdout
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        assert len(buffer) == 12


def test_retention_shows_and_changes_the_buffers_retention(invoke: Any, tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(20))
    shown = invoke("retention", "--db", str(path)).stdout
    assert "holds 20 rows; capacity unlimited, eviction fifo" in shown
    refused = invoke("retention", "--db", str(path), "--capacity", "5")
    assert refused.exit_code == 1 and "add --yes" in refused.stderr
    done = invoke(
        "retention", "--db", str(path), "--capacity", "5", "--eviction", "max_reward", "-y"
    )
    assert done.exit_code == 0 and "15 rows went, 5 remain" in done.stdout
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        assert sorted(r.exp_data.reward_t for r in buffer.query()) == [15.0, 16.0, 17.0, 18.0, 19.0]
    loose = invoke("retention", "--db", str(path), "--unlimited")
    assert loose.exit_code == 0 and "capacity unlimited" in loose.stdout
    bad = invoke("retention", "--db", str(path), "--eviction", "lifo", "-y")
    assert bad.exit_code == 1 and "eviction must be one of" in bad.stderr


def test_a_filter_path_no_row_has_gets_a_warning(invoke: Any, tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(5))
    typo = invoke("query", "--db", str(path), "-w", "exp_data.state.nosuch = 1")
    assert typo.exit_code == 0 and typo.stdout.startswith("0 of 0 matching rows")
    assert "Warning: no row of buffer 'default' has exp_data.state.nosuch" in typo.stderr
    exported = invoke("export", "--db", str(path), "-w", "exp_data.state.nosuch = 1", "o.jsonl")
    assert "has exp_data.state.nosuch" in exported.stderr
    fine = invoke("query", "--db", str(path), "-w", "exp_data.state.i = 99")  # a real path
    assert fine.exit_code == 0 and "Warning" not in fine.stderr


def test_tables_align_wide_characters_by_display_width(invoke: Any, tmp_path: Path) -> None:
    from rich.cells import cell_len

    from tests.helpers import make_row

    path = tmp_path / "cjk.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(
            [make_row("任务一号", "智能体"), make_row("ab", "a"), make_row("😀x", "b")]
        )
    lines = invoke("query", "--db", str(path)).stdout.splitlines()[1:]
    header, rows = lines[0], [lines[i] for i in (2, 3, 4)]
    at = header.index("agent_id")
    for line in rows:  # the second column starts at the same display column in every row
        first, _, rest = line.partition("  ")
        assert cell_len(first + "  " + rest[: len(rest) - len(rest.lstrip())]) == at


def test_query_and_sample_print_csv(invoke: Any, tmp_path: Path) -> None:
    import csv
    import io

    path = tmp_path / "c.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(6, tensor=True))
    out = invoke("query", "--db", str(path), "--csv", "-w", "step = 0").stdout
    table = list(csv.DictReader(io.StringIO(out)))
    assert len(table) == 4 and table[0]["task_id"] == "task0" and table[0]["reward_t"] == "0.0"
    assert json.loads(table[0]["state"])["obs"] == [0.0] * 8  # payload fields as JSON text
    assert list(table[0])[:3] == ["id", "task_id", "task_name"]
    sampled = invoke("sample", "--db", str(path), "--csv", "--batch-size", "3", "--seed", "1")
    assert sampled.exit_code == 0 and len(list(csv.DictReader(io.StringIO(sampled.stdout)))) == 3
    both = invoke("query", "--db", str(path), "--csv", "--json")
    assert both.exit_code == 1 and "either --json or --csv" in both.stderr


def test_summary_creates_shows_and_drops_task_summaries(invoke: Any, tmp_path: Path) -> None:
    path = tmp_path / "sum.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(30))
    before = invoke("stats", str(path), "--json").stdout
    assert "keeps no task summaries" in invoke("summary", str(path)).stdout
    made = invoke("summary", str(path), "--create")
    assert made.exit_code == 0
    assert "keeps task summaries (4 tasks, 30 rows; built)" in made.stdout
    after = invoke("stats", str(path), "--json").stdout  # now read from the summaries
    assert json.loads(after)["tasks"] == json.loads(before)["tasks"] == 4
    assert json.loads(after)["reward"]["sum"] == json.loads(before)["reward"]["sum"]
    assert "task summaries dropped" in invoke("summary", str(path), "--drop").stdout
    assert "nothing to drop" in invoke("summary", str(path), "--drop").stdout
    both = invoke("summary", str(path), "--create", "--drop")
    assert both.exit_code != 0 and "either --create or --drop" in both.output


def test_slow_whole_buffer_stats_say_how_to_make_them_fast(invoke: Any, tmp_path: Path) -> None:
    from expstore.cli.stats import compute_stats, slow_read_note

    path = tmp_path / "slow.db"
    with ReplayBuffer(f"sqlite:///{path}") as buffer:
        buffer.store_batch(make_rows(5))
        rows = compute_stats(buffer)["rows"]
        said = slow_read_note(buffer, rows, 0.0, slow_s=-1.0) or ""  # every read is slow
        assert "read every row of 5" in said and "`expstore summary --create`" in said
        invoke("summary", str(path), "--create")
        kept = slow_read_note(buffer, rows, 0.0, slow_s=-1.0) or ""
        assert "expstore summary" not in kept  # summaries kept
