"""``workbench export --parquet URI``: a dataset where it lies (a real S3 API on loopback: moto's
server mode; and a local folder), shipped idempotently, a session visible only with its manifest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
from dataset_rig import BUCKET, S3, moto_s3, run_wb, sample_db, wb

from workbench.cli import main
from workbench.export.dataset import SESSIONS_DIR, committed_sessions, open_dataset
from workbench.store.db import Store

pytestmark = pytest.mark.slow  # moto_server and workbench subprocesses

CLOSED = {"sess-a1": "complete", "sess-a2": "incomplete", "sess-a3": "complete"}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with moto_s3() as server:
        server.fs().create_dir(BUCKET)
        yield server


@pytest.fixture
def aws(s3: S3, monkeypatch: pytest.MonkeyPatch) -> S3:
    """This process's AWS variables point at the loopback S3."""
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    return s3


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_db(tmp_path_factory.mktemp("dataset") / "team.duckdb", CLOSED)


def _export(target: str, db: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    code = main(["export", "--parquet", target, "--db", str(db), "--json", *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def test_export_lands_in_the_bucket_with_the_layout_and_is_idempotent(aws: S3, db: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"s3://{BUCKET}/once"
    code, res, err = _export(uri, db, capsys=capsys)
    assert code == 0, err
    assert sorted(res["sessions"]) == sorted(CLOSED)
    assert res["skipped_open"] == []
    objects = aws.objects(f"{BUCKET}/once")
    rel = {p[len(f"{BUCKET}/once/"):] for p in objects}
    assert "_workbench.json" in rel
    for sid in CLOSED:
        assert f"{SESSIONS_DIR}/session_id={sid}.json" in rel
        frames = [r for r in rel if r.startswith("frames/date=") and f"/session_id={sid}/" in r]
        assert len(frames) == 1 and frames[0].endswith("/part-0.parquet")
    assert not [r for r in rel if r.startswith("s3:")]
    # the manifest says what the session is and where it came from
    manifest = json.loads(aws.fs().open_input_stream(f"{BUCKET}/once/{SESSIONS_DIR}/session_id=sess-a1.json").read())
    assert manifest["rows"]["frames"] > 0 and manifest["content_hash"]
    assert {f["path"] for f in manifest["files"]} <= rel
    assert manifest["origin"]["database"] == str(db)
    assert manifest["origin"]["client_version"] == "2.1.0" and manifest["origin"]["model"] == "claude-x"
    assert manifest["origin"]["hostname"] and manifest["workbench_version"] and manifest["schema_version"]

    # a second export of the same sessions writes nothing new
    code, again, err = _export(uri, db, capsys=capsys)
    assert code == 0, err
    assert again["sessions"] == [] and sorted(again["unchanged"]) == sorted(CLOSED)
    assert aws.objects(f"{BUCKET}/once") == objects
    manifest_again = json.loads(aws.fs().open_input_stream(
        f"{BUCKET}/once/{SESSIONS_DIR}/session_id=sess-a1.json").read())
    assert manifest_again == manifest
    assert main(["export", "--parquet", uri, "--db", str(db)]) == 0
    assert "0 session(s); 3 already there, unchanged" in capsys.readouterr().out


def test_a_session_a_capture_is_still_recording_is_not_shipped(aws: S3, db: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.store.reader import LiveService

    live = tmp_path / "live.duckdb"
    live.write_bytes(db.read_bytes())
    sample_db(live, {"sess-open": "open"})
    uri = f"s3://{BUCKET}/live"
    store = Store(live)  # a capture holds the file; export reads through its live read service
    service = LiveService(store.con, live)
    service.start()
    try:
        code, res, err = _export(uri, live, capsys=capsys)
        assert code == 0, err
        assert res["skipped_open"] == ["sess-open"] and sorted(res["sessions"]) == sorted(CLOSED)
        assert not [p for p in aws.objects(f"{BUCKET}/live") if "sess-open" in p]
        assert main(["export", "--parquet", uri, "--db", str(live)]) == 0
        assert "1 still open, not shipped" in capsys.readouterr().out
        store.con.execute("UPDATE sessions SET status = 'complete' WHERE session_id = 'sess-open'")
        code, res, err = _export(uri, live, capsys=capsys)
        assert code == 0 and res["sessions"] == ["sess-open"] and res["skipped_open"] == []
    finally:
        service.stop()
        store.close()
    assert "sess-open" in committed_sessions(open_dataset(uri))


def test_a_reader_counts_only_sessions_with_a_manifest(aws: S3, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"s3://{BUCKET}/killed"
    assert _export(uri, db, capsys=capsys)[0] == 0
    # a killed export: the files of sess-a2 are there, its manifest never was
    aws.fs().delete_file(f"{BUCKET}/killed/{SESSIONS_DIR}/session_id=sess-a2.json")
    dataset = open_dataset(uri)
    committed = committed_sessions(dataset)
    assert sorted(committed) == ["sess-a1", "sess-a3"]
    # what docs/notebooks.md tells a reader to do, with pyarrow over the bucket
    frames = ds.dataset(f"{BUCKET}/killed/frames", filesystem=aws.fs(), format="parquet", partitioning="hive")
    every = set(frames.to_table(columns=["session_id"]).column("session_id").to_pylist())
    assert "sess-a2" in every
    counted = frames.to_table(columns=["session_id"], filter=ds.field("session_id").isin(list(committed)))
    assert set(counted.column("session_id").to_pylist()) == {"sess-a1", "sess-a3"}
    assert counted.num_rows == sum(committed[s]["rows"]["frames"] for s in committed)
    # exporting again completes the killed session
    code, res, _ = _export(uri, db, capsys=capsys)
    assert code == 0 and res["sessions"] == ["sess-a2"]
    assert sorted(committed_sessions(dataset)) == sorted(CLOSED)


def test_two_hosts_export_into_one_prefix_at_once(s3: S3, tmp_path: Path) -> None:
    host_a = sample_db(tmp_path / "a.duckdb", {"host-a-1": "complete", "host-a-2": "complete"})
    host_b = sample_db(tmp_path / "b.duckdb", {"host-b-1": "complete", "host-b-2": "complete"})
    uri = f"s3://{BUCKET}/fleet"
    procs = [wb("export", "--parquet", uri, "--db", str(d), "--json", env=s3.env) for d in (host_a, host_b)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert len(json.loads(out)["sessions"]) == 2
    dataset = open_dataset_with(s3, uri)
    committed = committed_sessions(dataset)
    assert sorted(committed) == ["host-a-1", "host-a-2", "host-b-1", "host-b-2"]
    objects = s3.objects(f"{BUCKET}/fleet")
    for sid, manifest in committed.items():
        for f in manifest["files"]:
            assert objects[f"{BUCKET}/fleet/{f['path']}"] == f["bytes"], (sid, f["path"])
    assert {m["origin"]["database"] for m in committed.values()} == {str(host_a), str(host_b)}
    frames = ds.dataset(f"{BUCKET}/fleet/frames", filesystem=s3.fs(), format="parquet", partitioning="hive")
    assert frames.count_rows() == sum(m["rows"]["frames"] for m in committed.values())


def open_dataset_with(s3: S3, uri: str) -> object:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3.env.items():
            mp.setenv(k, v)
        return open_dataset(uri)


def test_bad_targets_are_exit_2_naming_them_and_write_nothing(aws: S3, db: Path, tmp_path: Path) -> None:
    before = aws.objects(BUCKET)
    code, _, err = run_wb("export", "--parquet", "s3://no-such-bucket/x", "--db", str(db), env=aws.env)
    assert code == 2 and "s3://no-such-bucket/x" in err and "does not exist" in err
    assert "Traceback" not in err
    # a newer workbench wrote this dataset
    aws.fs().open_output_stream(f"{BUCKET}/newer/_workbench.json").write(json.dumps(
        {"format": "workbench-parquet", "version": 99, "schema_version": 1}).encode())
    before = aws.objects(BUCKET)
    code, _, err = run_wb("export", "--parquet", f"s3://{BUCKET}/newer", "--db", str(db), env=aws.env)
    assert code == 2 and f"s3://{BUCKET}/newer" in err and "newer workbench" in err
    assert aws.objects(BUCKET) == before
    # nothing listens there
    from support import free_port

    dead = {**aws.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    code, _, err = run_wb("export", "--parquet", f"s3://{BUCKET}/x", "--db", str(db), env=dead)
    assert code == 2 and f"s3://{BUCKET}/x" in err and "Traceback" not in err
    # a scheme typo is not a folder named "s3:"
    code, _, err = run_wb("export", "--parquet", f"s3:/{BUCKET}/x", "--db", str(db), env=aws.env)
    assert code == 2 and f"s3:/{BUCKET}/x" in err
    assert not (Path.cwd() / "s3:").exists()


def test_a_bucket_without_rights_is_exit_2(db: Path) -> None:
    # moto refuses unknown credentials once its first requests (the bucket's creation) are spent
    with moto_s3(no_auth_actions=5) as s3:
        s3.fs().create_dir("locked")
        for _ in range(5):  # spend what is left of the allowance, until our keys are refused
            try:
                s3.fs().get_file_info(pafs.FileSelector("locked", allow_not_found=True))
            except OSError as exc:
                assert "Access" in str(exc) or "ACCESS" in str(exc)
                break
        else:
            pytest.fail("moto never checked the credentials")
        code, _, err = run_wb("export", "--parquet", "s3://locked/x", "--db", str(db), env=s3.env)
        assert code == 2 and "s3://locked/x" in err and "Traceback" not in err


def test_local_folder_dataset_round_trips_and_import_counts_only_committed(db: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds"
    code, res, err = _export(str(out), db, capsys=capsys)
    assert code == 0, err
    assert sorted(res["sessions"]) == sorted(CLOSED)
    files = {p.relative_to(out).as_posix(): p.stat().st_size for p in out.rglob("*") if p.is_file()}
    assert f"{SESSIONS_DIR}/session_id=sess-a1.json" in files and "_workbench.json" in files
    assert not [p for p in out.iterdir() if p.name.startswith(".workbench-staging")]
    code, again, _ = _export(str(out), db, capsys=capsys)
    assert code == 0 and again["sessions"] == []
    assert {p.relative_to(out).as_posix(): p.stat().st_size for p in out.rglob("*") if p.is_file()} == files
    # DuckDB over the folder with the reader's rule
    con = duckdb.connect()
    n = con.execute(
        f"SELECT count(DISTINCT session_id) FROM read_parquet('{out}/frames/**/*.parquet', hive_partitioning = true) "
        f"WHERE session_id IN (SELECT session_id FROM read_json('{out}/_sessions/*.json'))").fetchone()
    assert n == (3,)
    # a killed export of sess-a3: import skips it
    (out / SESSIONS_DIR / "session_id=sess-a3.json").unlink()
    fresh = tmp_path / "fresh.duckdb"
    assert main(["import", str(out), "--db", str(fresh)]) == 0
    con = duckdb.connect(str(fresh), read_only=True)
    assert sorted(r[0] for r in con.execute("SELECT session_id FROM sessions").fetchall()) == ["sess-a1", "sess-a2"]
    con.close()


def test_local_folder_named_like_a_uri_file_scheme(db: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, res, err = _export(f"file://{tmp_path}/viafile", db, capsys=capsys)
    assert code == 0, err
    assert (tmp_path / "viafile" / "_workbench.json").exists()
    assert sorted(res["sessions"]) == sorted(CLOSED)


def test_a_changed_session_is_replaced_whole(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine.duckdb"
    mine.write_bytes(db.read_bytes())
    out = tmp_path / "ds"
    assert _export(str(out), mine, capsys=capsys)[0] == 0
    con = duckdb.connect(str(mine))
    con.execute("INSERT INTO findings (session_id, code, severity, message, first_seq, last_seq) "
                "VALUES ('sess-a1', 'heartbeat_loop', 'warning', 'new rule', 1, 2)")
    con.close()
    code, res, _ = _export(str(out), mine, capsys=capsys)
    assert code == 0 and res["sessions"] == ["sess-a1"] and res["rows"]["findings"] == 1
    manifest = committed_sessions(open_dataset(str(out)))["sess-a1"]
    finding_files = [f["path"] for f in manifest["files"] if f["table"] == "findings"]
    assert len(finding_files) == 1 and (out / finding_files[0]).exists()
    # the finding goes away again (a rule withdrawn): so does its file, not left for a glob to count
    con = duckdb.connect(str(mine))
    con.execute("DELETE FROM findings WHERE session_id = 'sess-a1'")
    con.close()
    code, res, _ = _export(str(out), mine, capsys=capsys)
    assert code == 0 and res["sessions"] == ["sess-a1"]
    assert not (out / finding_files[0]).exists()
    assert not [f for f in committed_sessions(open_dataset(str(out)))["sess-a1"]["files"] if f["table"] == "findings"]


def test_nothing_leaves_the_host_in_clear(aws: S3, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    canary = "sk-canary-SHIP-7c2f91"
    secret = sample_db(tmp_path / "secret.duckdb", {"sess-key": "complete"}, canary=canary)
    uri = f"s3://{BUCKET}/canary"
    code, res, err = _export(uri, secret, capsys=capsys)
    assert code == 0 and res["sessions"] == ["sess-key"], err
    objects = aws.objects(f"{BUCKET}/canary")
    assert any("/frames/" in p for p in objects)
    for path in objects:
        data = aws.fs().open_input_stream(path).read()
        assert canary.encode() not in data, path
    # the export read what the gate stored: the run request is there, its key redacted
    frames = ds.dataset(f"{BUCKET}/canary/frames", filesystem=aws.fs(), format="parquet", partitioning="hive")
    payloads = frames.to_table(columns=["kind", "payload"]).to_pylist()
    assert any(r["kind"] == "run_request" and b"[redacted" in (r["payload"] or b"") for r in payloads)
