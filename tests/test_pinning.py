"""App pinning without processes: the allow-list, the FAB hash, the refusal, the commands that take it."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest

from hetfed.federation import silo_host
from hetfed.runtime.pinning import approve, fab_hash, read_approved, reason_for, refused, revoke
from hetfed.runtime.supernode import split_options, split_runtime
from tests.conftest import REPO, hetfed_cli


def app_copy(dest: Path) -> Path:
    """The hetfed app as ``flwr run`` ships it (its FAB, unpacked): a stable folder to hash."""
    from flwr.cli.build import build_fab_from_disk

    zipfile.ZipFile(io.BytesIO(build_fab_from_disk(REPO))).extractall(dest)
    (dest / ".info" / "CONTENT").unlink()
    return dest


def test_the_hash_is_flowers_fab_hash_and_one_line_changes_it(tmp_path: Path) -> None:
    from flwr.cli.build import build_fab_from_disk

    app = app_copy(tmp_path / "app")
    digest = fab_hash(app)
    assert digest == hashlib.sha256(build_fab_from_disk(app)).hexdigest() == fab_hash(app)
    client = app / "client" / "app.py"
    client.write_text(client.read_text() + "\nCANARY = 1\n")
    assert fab_hash(app) != digest
    with pytest.raises(FileNotFoundError, match="not a Flower app folder"):
        fab_hash(tmp_path)


def test_allow_list_approve_revoke_and_refusals(tmp_path: Path) -> None:
    allow, a, b = tmp_path / "approved-apps", "a" * 64, "b" * 64
    assert read_approved(allow) == [] and refused(allow, a).startswith(f"refused app build {a}: not approved")
    assert approve(allow, a, note="v1") and not approve(allow, a)
    assert read_approved(allow) == [a] and refused(allow, a) == ""
    assert "(approved: aaaaaaaaaaaa)" in refused(allow, b)
    with pytest.raises(ValueError, match="not a FAB hash"):
        approve(allow, "abc")
    content = b"the FAB"
    digest = hashlib.sha256(content).hexdigest()
    approve(allow, digest)
    assert refused(allow, digest, content) == ""
    assert "hashes to" in refused(allow, digest, b"other code")  # a substituted FAB
    assert revoke(allow, a) and not revoke(allow, a) and read_approved(allow) == [digest]
    allow.write_text(allow.read_text() + "not-a-hash\n")
    assert "unreadable" in refused(allow, digest) and ":2:" in refused(allow, digest)
    why = refused(allow, b)
    assert reason_for({"partition-id": 1, "num-partitions": 3}, why) == f"partition 1 of 3: {why}"
    assert reason_for({}, why) == why


def test_the_server_names_the_refusing_partition() -> None:
    from hetfed.server.pool import _claim

    why = refused(Path("/nonexistent"), "c" * 64)
    assert _claim(reason_for({"partition-id": 2, "num-partitions": 4}, why)) == (2, 4, why)


def test_the_supernode_flags() -> None:
    # That the SuperNode's check can be installed on Flower 1.42.0: tests/test_runtime_check.py.
    argv = ["--runtime", "stock", "--approved-apps", "/x/allow", "--insecure"]
    assert split_options(argv) == ("stock", Path("/x/allow"), ["--insecure"])
    assert split_runtime(argv) == ("stock", ["--insecure"])
    assert split_options(["--insecure"]) == ("warm", None, ["--insecure"])


def test_a_silo_needs_an_approved_build_unless_it_runs_any_app(tmp_path: Path) -> None:
    allow = tmp_path / "state" / "approved-apps"
    kwargs = dict(superlink="127.0.0.1:8000", ca=None, key=None, partition_id=0, num_partitions=2)
    with pytest.raises(FileNotFoundError, match="no approved app build in"):
        silo_host(**kwargs, state_dir=tmp_path / "state", approved_apps=allow)
    approve(allow, "d" * 64)
    cmd = silo_host(**kwargs, state_dir=tmp_path / "state", approved_apps=allow)
    assert cmd.argv[1:5] == ["--runtime", "warm", "--approved-apps", str(allow.resolve())]
    assert f'approved-apps="{allow.resolve()}"' in cmd.argv[-1]  # the ClientApp reports it
    assert "--approved-apps" not in silo_host(**kwargs, state_dir=tmp_path / "s2").argv


def test_approve_command_builds_the_hash_and_the_silo_command_takes_the_file(tmp_path: Path) -> None:
    app = app_copy(tmp_path / "app")
    state = tmp_path / "state"
    out = hetfed_cli("federation", "approve", str(app), "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    assert read_approved(state / "approved-apps") == [fab_hash(app)]
    assert fab_hash(app) in out.stdout
    printed = hetfed_cli("federation", "approve", str(app), "--print")
    assert printed.stdout.strip() == fab_hash(app)
    silo = hetfed_cli(
        "federation", "silo", "--superlink", "127.0.0.1:8000", "--insecure", "--partition-id", "0",
        "--num-partitions", "1", "--state-dir", str(state), "--print",
    )  # fmt: skip
    assert silo.returncode == 0 and f"--approved-apps {state / 'approved-apps'}" in silo.stdout
    bare = hetfed_cli(
        "federation", "silo", "--superlink", "127.0.0.1:8000", "--insecure", "--partition-id", "0",
        "--num-partitions", "1", "--state-dir", str(tmp_path / "empty"), "--print",
    )  # fmt: skip
    assert bare.returncode != 0 and "no approved app build in" in bare.stderr
    assert len(bare.stderr.strip().splitlines()) == 1


def test_status_prints_what_the_silos_reported(tmp_path: Path) -> None:
    import json

    from hetfed.federation_cli import silo_report_lines

    assert "not reported yet" in silo_report_lines([tmp_path / "results", tmp_path / "none"])
    for name, digest, when in (("old", "1" * 64, 1_000), ("new", "2" * 64, 2_000)):
        run = tmp_path / "results" / name
        run.mkdir(parents=True)
        silos = {"partition-0": {"approved-apps": [digest], "reported-by": "ClientApp query.info"}}
        (run / "silos.json").write_text(json.dumps({"run-name": name, "time": str(when), "silos": silos}))
        os.utime(run / "silos.json", (when, when))
    out = silo_report_lines([tmp_path / "results"])
    assert "reported them in run new" in out
    assert "partition-0: 222222222222 (by its ClientApp query.info)" in out
