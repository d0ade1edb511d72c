"""Every command through Typer's CliRunner: the happy path and the ways it goes wrong."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from typer.testing import Result

from expstore import ReplayBuffer, UniformSampler
from expstore.db import migrate
from expstore.storage import create_sql_engine
from tests.cli.conftest import Invoke


def assert_one_line_error(result: Result, *words: str) -> str:
    """The command failed with exactly one line on stderr, naming ``words``, no traceback."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("Error: "), err
    assert "\n" not in err, err
    assert "Traceback" not in result.stdout + result.stderr
    for word in words:
        assert word in err, err
    return err


# -- init / upgrade / version ------------------------------------------------------------


def test_init_creates_a_sqlite_file_with_the_schema_and_a_default_buffer(
    invoke: Invoke, tmp_path: Path
) -> None:
    result = invoke("init", "--db", "sqlite:///new.db")
    assert result.exit_code == 0, result.stderr
    assert "Created the expstore schema" in result.stdout
    with ReplayBuffer("sqlite:///" + str(tmp_path / "new.db")) as buffer:
        assert len(buffer) == 0
    again = invoke("init", "--db", "sqlite:///new.db")
    assert again.exit_code == 0
    assert "nothing to do" in again.stdout


def test_init_uses_expstore_url_then_the_default_file(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert invoke("init").exit_code == 0
    assert (tmp_path / "expstore.db").exists()
    monkeypatch.setenv("EXPSTORE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    assert invoke("init").exit_code == 0
    assert (tmp_path / "env.db").exists()


def test_init_in_a_missing_folder_fails_in_one_line(invoke: Invoke) -> None:
    assert_one_line_error(invoke("init", "--db", "sqlite:///no/such/dir/x.db"), "does not exist")


def test_upgrade_sql_prints_the_sql_and_creates_nothing(invoke: Invoke, tmp_path: Path) -> None:
    result = invoke("upgrade", "--sql", "--db", "sqlite:///later.db")
    assert result.exit_code == 0, result.stderr
    assert "CREATE TABLE expstore_rows" in result.stdout
    assert not (tmp_path / "later.db").exists()


def test_upgrade_brings_an_older_database_to_the_head_revision(
    invoke: Invoke, tmp_path: Path
) -> None:
    engine = create_sql_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrate.upgrade(engine, "0001")
    engine.dispose()
    stats = invoke("stats", "--db", "sqlite:///old.db")
    assert_one_line_error(stats, "older", "expstore upgrade")
    result = invoke("upgrade", "--db", "sqlite:///old.db")
    assert result.exit_code == 0, result.stderr
    assert f"from revision 0001 to {migrate.head_revision()}" in result.stdout
    assert "nothing to do" in invoke("upgrade", "--db", "sqlite:///old.db").stdout


def test_version_names_library_and_database_revisions(invoke: Invoke) -> None:
    missing = invoke("version", "--db", "sqlite:///nothing.db", "--json")
    assert json.loads(missing.stdout)["database_state"] == "missing"
    invoke("init", "--db", "sqlite:///v.db")
    result = invoke("version", "--db", "sqlite:///v.db")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("expstore 0.1.0 (schema revision ")
    assert "(up to date)" in result.stdout
    data = json.loads(invoke("version", "--db", "sqlite:///v.db", "--json").stdout)
    assert data["database_revision"] == migrate.head_revision()
    assert data["database_state"] == "current"


# -- stats ------------------------------------------------------------------------------------


def test_stats_summarises_rows_tasks_agents_rewards(
    invoke: Invoke, seeded: tuple[str, str]
) -> None:
    url, name = seeded
    result = invoke("stats", "--db", url, "--buffer", name, "--json")
    assert result.exit_code == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["buffer"] == name
    assert (stats["rows"], stats["tasks"], stats["agents"]) == (40, 4, 2)
    assert stats["steps_per_task"] == {"mean": 10.0, "min": 10, "max": 10}
    assert stats["reward"]["mean"] == pytest.approx(19.5)
    assert stats["reward"]["max"] == 39.0
    assert stats["success_rate"] == 1.0
    table = invoke("stats", "--db", url, "--buffer", name)
    assert "rows            40" in table.stdout
    assert "success rate    100% of tasks" in table.stdout


def test_stats_show_the_claim_queue_per_consumer(invoke: Invoke, seeded: tuple[str, str]) -> None:
    url, name = seeded
    plain = invoke("stats", "--db", url, "--buffer", name)
    assert "claims" not in plain.stdout  # nothing claimed yet: no queue lines
    with ReplayBuffer(url, name=name) as buffer:
        buffer.claim(5, consumer="learner-0").ack(checkpoint={"step": 1})
        buffer.claim(3, consumer="learner-1")
    stats = json.loads(invoke("stats", "--db", url, "--buffer", name, "--json").stdout)
    held = stats["queue"].pop("in_flight")
    assert [(h["consumer"], h["needs"], h["progress_age_s"]) for h in held] == [
        ("learner-1", None, None)
    ] * 3
    assert stats["queue"] == {
        "unclaimed": 32,
        "leased": 3,
        "expired": 0,
        "consumed": 5,
        "consumers": {
            "learner-0": {"leased": 0, "expired": 0, "consumed": 5},
            "learner-1": {"leased": 3, "expired": 0, "consumed": 0},
        },
        "completions": None,
        "admission": None,
    }
    table = invoke("stats", "--db", url, "--buffer", name).stdout
    assert "claims          32 unclaimed, 3 leased, 0 expired, 5 consumed" in table
    assert "learner-1     3 leased, 0 expired, 0 consumed" in table


def test_stats_show_a_prompt_queue_its_actors_and_admission(
    invoke: Invoke, db_url: str, buffer_name: str
) -> None:
    from expstore import DataRow, Experience, ExpMeta

    with ReplayBuffer(db_url, name=buffer_name) as prompts:
        with ReplayBuffer(db_url, name=buffer_name + "_out") as rollouts:
            made = [
                DataRow(
                    id=f"q{i}",
                    exp_meta=ExpMeta(task_id=f"t{i}", agent_id="a", step=0),
                    exp_data=Experience(),
                )
                for i in range(3)
            ]
            prompts.store_prompts(made, group_size=4)
            prompts.set_admission(rollouts, batch_size=4, max_batches_ahead=1)
            prompts.claim(1, consumer="actor-0").save_progress({"tokens": [1, 2]})
    stats = json.loads(invoke("stats", "--db", db_url, "--buffer", buffer_name, "--json").stdout)
    queue = stats["queue"]
    assert queue["completions"] == {"prompts": 3, "done": 0, "target": 12, "stored": 0}
    [held] = queue["in_flight"]
    assert (held["id"], held["consumer"], held["needs"]) == ("q0", "actor-0", 4)
    assert held["progress_age_s"] >= 0
    assert queue["admission"]["in_flight"] == 4 and queue["admission"]["held_by"] is None
    table = invoke("stats", "--db", db_url, "--buffer", buffer_name).stdout
    assert "prompts         0 done, 3 not done (1 in flight); completions 0 of 12" in table
    assert "q0            held by actor-0, needs 4, progress saved" in table
    assert "admission       4 completions in flight, 0 stored unconsumed" in table


def test_stats_by_agent_and_by_task(invoke: Invoke, sqlite_seeded: tuple[str, str]) -> None:
    url, name = sqlite_seeded
    by_agent = json.loads(
        invoke("stats", "--db", url, "-b", name, "--by", "agent", "--json").stdout
    )["groups"]
    assert [(g["agent_id"], g["rows"], g["tasks"]) for g in by_agent] == [
        ("agent0", 20, 2),
        ("agent1", 20, 2),
    ]
    by_task = json.loads(
        invoke(
            "stats", "--db", url, "-b", name, "--by", "task", "--json", "--success-above", "37"
        ).stdout
    )["groups"]
    assert [(g["task_id"], g["steps"], g["final_reward"], g["success"]) for g in by_task] == [
        ("task0", 10, 36.0, False),
        ("task1", 10, 37.0, False),
        ("task2", 10, 38.0, True),
        ("task3", 10, 39.0, True),
    ]
    table = invoke("stats", "--db", url, "-b", name, "--by", "task", "--limit", "2").stdout
    assert "task0" in table and "task2" not in table and "(2 more" in table


def test_stats_where_restricts_the_rows(invoke: Invoke, sqlite_seeded: tuple[str, str]) -> None:
    url, name = sqlite_seeded
    result = invoke("stats", "--db", url, "-b", name, "--where", "agent_id = 'agent1'", "--json")
    stats = json.loads(result.stdout)
    assert (stats["rows"], stats["tasks"], stats["where"]) == (20, 2, "agent_id = 'agent1'")


def test_stats_plot_draws_a_png_or_is_skipped_without_matplotlib(
    invoke: Invoke, sqlite_seeded: tuple[str, str], tmp_path: Path
) -> None:
    url, name = sqlite_seeded
    result = invoke("stats", "--db", url, "-b", name, "--plot", "reward.png")
    assert result.exit_code == 0, result.stderr
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "skipped --plot" in result.stderr
        assert not (tmp_path / "reward.png").exists()
    else:
        assert (tmp_path / "reward.png").read_bytes().startswith(b"\x89PNG")


# -- query ------------------------------------------------------------------------------------


def test_query_where_returns_the_matching_rows(invoke: Invoke, seeded: tuple[str, str]) -> None:
    url, name = seeded
    where = (
        "task_id = 'task1' and (step in (0, 1) or reward_t >= 37) "
        "and exp_data.state.url like '%x/%'"
    )
    result = invoke("query", "--db", url, "-b", name, "--where", where, "--json")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["exp_meta"]["task_id"], r["exp_meta"]["step"]) for r in rows] == [
        ("task1", 0),
        ("task1", 1),
        ("task1", 9),
    ]
    assert rows[0]["exp_data"]["state"]["obs"] == [1.0] * 8  # tensors as lists


def test_query_prints_a_table_and_counts(invoke: Invoke, sqlite_seeded: tuple[str, str]) -> None:
    url, name = sqlite_seeded
    result = invoke("query", "--db", url, "-b", name, "-w", "agent_id = 'agent0'", "-n", "3")
    lines = result.stdout.splitlines()
    assert lines[0] == "3 of 20 matching rows where agent_id = 'agent0'"
    assert lines[1].split() == [
        "task_id",
        "agent_id",
        "step",
        "version",
        "reward",
        "done",
        "state",
        "/",
        "actions",
    ]
    assert lines[3].split()[:4] == ["task0", "agent0", "0", "0"]
    assert "float32[8]" in lines[3]
    count = invoke("query", "--db", url, "-b", name, "-w", "step >= 8", "--count")
    assert count.stdout.strip() == "8"
    newest = invoke("query", "--db", url, "-b", name, "--order", "-key", "-n", "1", "--json")
    assert json.loads(newest.stdout)["exp_data"]["reward_t"] == 39.0


def test_a_where_parse_error_points_at_the_column(
    invoke: Invoke, sqlite_seeded: tuple[str, str]
) -> None:
    url, name = sqlite_seeded
    result = invoke("query", "--db", url, "-b", name, "--where", "step >= 3 and task_id = ")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: --where: column 25: expected a value after '=', got the end of the text",
        "  step >= 3 and task_id = ",
        "                          ^",
    ]
    assert "Traceback" not in result.stderr


def test_query_rejects_an_unknown_order(invoke: Invoke, sqlite_seeded: tuple[str, str]) -> None:
    url, name = sqlite_seeded
    assert_one_line_error(invoke("query", "--db", url, "-b", name, "--order", "x"), "--order")


# -- sample -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampler",
    ["uniform", "recency", "prioritized", "reward", "stratified", "slice", "latest"],
)
def test_sample_draws_a_batch_with_each_sampler(
    invoke: Invoke, sqlite_seeded: tuple[str, str], sampler: str
) -> None:
    url, name = sqlite_seeded
    args = ["sample", "--db", url, "-b", name, "-s", sampler, "-n", "4", "--seed", "1", "--json"]
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4
    assert invoke(*args).stdout == result.stdout  # a seed repeats the draw


def test_sample_latest_with_a_filter_gives_the_newest_matching_rows(
    invoke: Invoke, seeded: tuple[str, str]
) -> None:
    url, name = seeded
    result = invoke(
        "sample",
        "--db",
        url,
        "-b",
        name,
        "-s",
        "latest",
        "-n",
        "2",
        "-w",
        "agent_id = 'agent0'",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    rewards = [json.loads(line)["exp_data"]["reward_t"] for line in result.stdout.splitlines()]
    assert rewards == [38.0, 36.0]


def test_sample_task_gives_whole_tasks(invoke: Invoke, sqlite_seeded: tuple[str, str]) -> None:
    url, name = sqlite_seeded
    result = invoke("sample", "--db", url, "-b", name, "-s", "task", "-n", "2", "--seed", "0")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("2 tasks, 20 rows, sampled with RandomTaskSampler")


def test_sample_options_reach_the_sampler(invoke: Invoke, sqlite_seeded: tuple[str, str]) -> None:
    url, name = sqlite_seeded
    ok = invoke("sample", "--db", url, "-b", name, "-s", "recency", "-o", "power=3", "-n", "2")
    assert ok.exit_code == 0, ok.stderr
    assert_one_line_error(
        invoke("sample", "--db", url, "-b", name, "-s", "recency", "-o", "temperature=1"),
        "--option temperature",
        "takes power",
    )
    assert_one_line_error(
        invoke("sample", "--db", url, "-b", name, "-s", "reward", "-o", "temperature=-1"),
        "temperature must be",
    )


def test_sampling_nothing_is_a_one_line_error(
    invoke: Invoke, sqlite_seeded: tuple[str, str]
) -> None:
    url, name = sqlite_seeded
    result = invoke("sample", "--db", url, "-b", name, "-w", "step > 100")
    assert_one_line_error(result, "no rows match")


# -- export / import --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_export_then_import_gives_back_equal_rows(
    invoke: Invoke, seeded: tuple[str, str], tmp_path: Path, suffix: str
) -> None:
    url, name = seeded
    out = tmp_path / f"rows.{suffix}"
    exported = invoke("export", "--db", url, "-b", name, "-w", "agent_id = 'agent1'", str(out))
    assert exported.exit_code == 0, exported.stderr
    assert f"Exported 20 rows of buffer '{name}' where agent_id = 'agent1' to {out}" in (
        exported.stderr
    )
    target = f"{name}_copy"
    imported = invoke("import", "--db", url, "-b", target, str(out))
    assert imported.exit_code == 0, imported.stderr
    assert "Imported 20 rows" in imported.stderr
    with ReplayBuffer(url, name=name) as source, ReplayBuffer(url, name=target) as copy:
        want = list(source.query({"field": "agent_id", "value": "agent1", "op": "eq"}))
        assert list(copy.query()) == want


def test_export_to_stdout_writes_json_lines(invoke: Invoke, sqlite_seeded: tuple[str, str]) -> None:
    url, name = sqlite_seeded
    result = invoke("export", "--db", url, "-b", name, "-w", "step = 0", "-")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["task_id"] for r in records] == ["task0", "task1", "task2", "task3"]
    assert "Exported 4 rows" in result.stderr


def test_import_refuses_rows_already_there_unless_told_to_skip(
    invoke: Invoke, sqlite_seeded: tuple[str, str], tmp_path: Path
) -> None:
    url, name = sqlite_seeded
    invoke("export", "--db", url, "-b", name, "all.parquet")
    assert_one_line_error(
        invoke("import", "--db", url, "-b", name, "all.parquet"),
        "already stored",
        "--skip-existing",
    )
    result = invoke("import", "--db", url, "-b", name, "--skip-existing", "all.parquet")
    assert result.exit_code == 0, result.stderr
    assert "Imported 0 rows (40 already there)" in result.stderr


def test_import_into_a_new_database_creates_it(
    invoke: Invoke, sqlite_seeded: tuple[str, str], tmp_path: Path
) -> None:
    url, name = sqlite_seeded
    invoke("export", "--db", url, "-b", name, "all.jsonl")
    result = invoke("import", "--db", "sqlite:///fresh.db", "all.jsonl")
    assert result.exit_code == 0, result.stderr
    assert "buffer 'default' of sqlite:///fresh.db; it now holds 40" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["export", "rows.csv"], ["cannot tell the format", "rows.csv"]),
        (["import", "missing.jsonl"], ["no such file", "missing.jsonl"]),
        (["export", "--format", "parquet", "-"], ["standard output"]),
    ],
)
def test_export_and_import_report_bad_files_in_one_line(
    invoke: Invoke, sqlite_seeded: tuple[str, str], args: list[str], words: list[str]
) -> None:
    url, name = sqlite_seeded
    assert_one_line_error(invoke(*args, "--db", url, "-b", name), *words)


def test_import_names_the_line_of_a_damaged_record(
    invoke: Invoke, sqlite_seeded: tuple[str, str], tmp_path: Path
) -> None:
    url, name = sqlite_seeded
    invoke("export", "--db", url, "-b", name, "all.jsonl")
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"step":', '"stepp":')
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    assert_one_line_error(
        invoke("import", "--db", "sqlite:///other.db", "bad.jsonl"), "bad.jsonl line 3", "step"
    )


# -- bad databases: every command -------------------------------------------------------------

READING = [
    ["stats"],
    ["query"],
    ["sample"],
    ["export", "out.jsonl"],
]
ALL = [*READING, ["init"], ["upgrade"], ["version"]]


@pytest.mark.parametrize("args", ALL, ids=lambda a: a[0])
def test_a_bad_url_is_a_one_line_error(invoke: Invoke, args: list[str]) -> None:
    assert_one_line_error(invoke(*args, "--db", "not a url"), "not a database URL")
    assert_one_line_error(invoke(*args, "--db", "mysql://u@h/db"), "SQLite or PostgreSQL")


@pytest.mark.parametrize("args", ALL, ids=lambda a: a[0])
def test_passwords_are_never_printed(invoke: Invoke, args: list[str]) -> None:
    url = "postgresql+psycopg://me:hunter2secret@127.0.0.1:1/nowhere"
    result = invoke(*args, "--db", url)
    err = assert_one_line_error(result, "me:***@127.0.0.1:1")
    assert "hunter2secret" not in result.stdout + err


@pytest.mark.parametrize("args", READING, ids=lambda a: a[0])
def test_reading_a_missing_database_creates_nothing(
    invoke: Invoke, tmp_path: Path, args: list[str]
) -> None:
    assert_one_line_error(invoke(*args, "--db", "sqlite:///absent.db"), "expstore init")
    assert not (tmp_path / "absent.db").exists()


@pytest.mark.parametrize("args", READING, ids=lambda a: a[0])
def test_a_database_without_expstore_tables_is_refused(
    invoke: Invoke, tmp_path: Path, args: list[str]
) -> None:
    with sqlite3.connect(tmp_path / "other.db") as conn:
        conn.execute("CREATE TABLE unrelated (x INTEGER)")
    assert_one_line_error(invoke(*args, "--db", "sqlite:///other.db"), "has no expstore tables")


@pytest.mark.parametrize("args", READING, ids=lambda a: a[0])
def test_a_missing_table_is_a_one_line_error(
    invoke: Invoke, sqlite_seeded: tuple[str, str], args: list[str]
) -> None:
    url, name = sqlite_seeded
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE expstore_rows"))
    engine.dispose()
    assert_one_line_error(invoke(*args, "--db", url, "-b", name), "no such table: expstore_rows")


@pytest.mark.parametrize(
    "args", [*READING, ["import", "in.jsonl"], ["init"], ["upgrade"]], ids=lambda a: a[0]
)
def test_a_database_newer_than_the_library_is_refused_untouched(
    invoke: Invoke, sqlite_seeded: tuple[str, str], tmp_path: Path, args: list[str]
) -> None:
    url, name = sqlite_seeded
    (tmp_path / "in.jsonl").write_text("")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE expstore_alembic_version SET version_num = '9999_future'"))
    engine.dispose()
    extra = [] if args[0] in ("init", "upgrade") else ["-b", name]
    assert_one_line_error(invoke(*args, "--db", url, *extra), "'9999_future'", "newer")
    version = json.loads(invoke("version", "--db", url, "--json").stdout)
    assert version["database_state"] == "newer"
    assert version["database_revision"] == "9999_future"


@pytest.mark.parametrize("args", READING, ids=lambda a: a[0])
def test_an_unknown_buffer_lists_the_ones_there(
    invoke: Invoke, sqlite_seeded: tuple[str, str], args: list[str]
) -> None:
    url, name = sqlite_seeded
    assert_one_line_error(
        invoke(*args, "--db", url, "-b", "nope"), "no buffer named 'nope'", f"buffers: {name}"
    )


def test_bad_options_are_usage_errors_with_status_2(invoke: Invoke) -> None:
    result = invoke("query", "--limit", "many")
    assert result.exit_code == 2
    assert "Invalid value for '--limit'" in result.stderr
    assert invoke("sample", "--sampler", "psychic").exit_code == 2


def test_python_dash_m_expstore_runs_the_same_command(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "expstore", "stats", "--db", "sqlite:///absent.db"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.returncode == 1
    assert out.stderr.startswith("Error: there is no database at absent.db")
    assert "Traceback" not in out.stderr


def test_export_lineage_writes_each_rows_consumption_record(
    invoke: Invoke, seeded: tuple[str, str], tmp_path: Path
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    url, name = seeded
    with ReplayBuffer(url, name=name) as buffer:
        acked = buffer.claim(5, consumer="learner-0")
        acked.ack(checkpoint={"step": 3})
        held = buffer.claim(2, consumer="learner-1")
        buffer.sample(UniformSampler(seed=0, consume_after=4), batch_size=3)
    out = tmp_path / "lineage.jsonl"
    result = invoke("export", "--db", url, "--buffer", name, "--lineage", str(out))
    assert result.exit_code == 0, result.stderr
    assert "Exported 40 lineage records" in result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 40
    by_id = {r["id"]: r for r in records}
    first = by_id[acked.ids[0]]
    assert (first["state"], first["consumer"], first["checkpoint"]) == (
        "consumed",
        "learner-0",
        {"step": 3},
    )
    assert first["acked_at"] >= first["claimed_at"] and first["times_claimed"] == 1
    assert by_id[held.ids[0]]["state"] == "leased"
    assert sum(r["times_sampled"] for r in records) == 3
    assert sum(r["state"] == "unclaimed" for r in records) == 33
    parquet = tmp_path / "lineage.parquet"
    where = ["--where", "task_id = 'task0'"]
    result = invoke("export", "--db", url, "--buffer", name, "--lineage", *where, str(parquet))
    assert result.exit_code == 0, result.stderr
    table = pq.read_table(parquet).to_pylist()
    assert len(table) == 10 and {r["task_id"] for r in table} == {"task0"}
    row = next(r for r in table if r["id"] == acked.ids[0])
    assert json.loads(row["checkpoint"]) == {"step": 3}


def test_stats_shows_the_policy_version_and_rate_limit(invoke: Invoke, tmp_path) -> None:
    from expstore import DataRow, Experience, ExpMeta, RateLimiter, ReplayBuffer

    url = f"sqlite:///{tmp_path / 'v.db'}"
    with ReplayBuffer(url) as buffer:
        buffer.store_batch(
            [
                DataRow(
                    exp_meta=ExpMeta(task_id="t", agent_id="a", step=i, policy_version=i),
                    exp_data=Experience(reward_t=1.0),
                )
                for i in range(4)
            ]
        )
        buffer.set_policy_version(3)
        buffer.set_rate_limiter(RateLimiter(min_size=2, samples_per_insert=2.0))
    out = invoke("stats", "--db", url).stdout
    assert "policy version  current 3; rows 0..3 (4 have one), staleness mean 1.5, max 3" in out
    assert "rate limit      min_size 2, 2 samples per insert; 4 inserted, 0 sampled" in out
    table = invoke("query", "--db", url, "-w", "policy_version >= 2").stdout
    assert table.splitlines()[0] == "2 of 2 matching rows where policy_version >= 2"


def test_a_deeply_parenthesised_where_is_a_clear_error(invoke: Invoke, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    invoke("init", "--db", url)
    result = invoke("query", "--db", url, "-w", "(" * 3000 + "step = 0" + ")" * 3000)
    assert result.exit_code != 0
    assert "parentheses nest more than 100 deep" in result.stderr
    assert "unexpected" not in result.stderr
