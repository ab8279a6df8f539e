"""``hetfed runtime check`` and the per-feature fallback: on the Flower the runtime was read in every
feature applies; a feature whose pinned source differs falls back alone (and what comes with it),
said in one line; app pinning falls back to the warm worker's check, and refuses only where nothing
can check. The mismatches are made by giving each feature's own check another hash, as a Flower
whose source changed would (tests/test_superlink_gate.py runs the SuperLink so)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import flwr
import pytest

from hetfed import versions
from hetfed.runtime import internals
from hetfed.runtime.features import FEATURES, Feature, report, verdicts
from hetfed.runtime.supernode import pinning_checks
from tests.conftest import REPO, hetfed_cli

READ_IN = flwr.__version__ == internals.FLOWER_VERSION
STATES = ("applies", "falls back", "refuses")


def changed(feature: Feature, path: str | None = None) -> Feature:
    """``feature`` checked against a Flower whose source at ``path`` (default: its first) differs."""
    path = path or next(iter(feature.pinned))
    return dataclasses.replace(feature, pinned={**feature.pinned, path: "0" * 64})


def named(process: str, name: str, in_: tuple[Feature, ...] = FEATURES) -> Feature:
    return next(f for f in in_ if (f.process, f.name) == (process, name))


def swapped(*replacements: Feature) -> tuple[Feature, ...]:
    by_key = {(f.process, f.name): f for f in replacements}
    return tuple(by_key.get((f.process, f.name), f) for f in FEATURES)


def lines_by_feature(lines: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """(process, name) -> (state, text) of a report's feature lines."""
    out = {}
    for line in lines[1:]:
        process, name, rest = line.split(maxsplit=2)
        state = next(s for s in STATES if rest.startswith(s))
        out[process, name] = (state, rest[len(state) :].strip())
    return out


def test_versions_are_found_by_the_distribution_that_provides_the_package() -> None:
    dist = versions.distribution("flwr")
    files = {str(f) for f in metadata.distribution(dist).files or ()}
    assert "flwr/__init__.py" in files  # flwr, or flwr-nightly: whichever installed the package
    assert versions.flower() == flwr.__version__ == metadata.version(dist)
    with pytest.raises(metadata.PackageNotFoundError):
        versions.version("no_such_package_anywhere")


def test_the_command_prints_one_line_per_feature_with_its_verdict() -> None:
    done = hetfed_cli("runtime", "check", timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"Flower {flwr.__version__} ({versions.distribution('flwr')}); hetfed's runtime was read in "
        f"Flower {internals.FLOWER_VERSION}"
    )
    by_feature = lines_by_feature(lines)
    assert list(by_feature) == [*((f.process, f.name) for f in FEATURES), ("SuperNode", "app-pinning")]
    for (process, name), (state, text) in by_feature.items():
        assert text, f"{process} {name}: no reason or description"
        if (process, name) != ("SuperNode", "app-pinning"):
            feature = named(process, name)
            assert text == (feature.does if state == "applies" else verdicts()[process, name])


@pytest.mark.skipif(not READ_IN, reason=f"Flower {flwr.__version__} is not the one the runtime was read in")
def test_on_the_flower_it_was_read_in_every_feature_applies() -> None:
    by_feature = lines_by_feature(report())
    assert {state for state, _ in by_feature.values()} == {"applies"}
    assert "by the SuperNode" in by_feature["SuperNode", "app-pinning"][1]
    assert all(why == "" for why in verdicts().values())


@pytest.mark.skipif(not READ_IN, reason=f"Flower {flwr.__version__} is not the one the runtime was read in")
def test_a_feature_whose_source_changed_falls_back_alone_in_one_line() -> None:
    grid = named("ServerApp", "batched-grid")
    path = next(iter(grid.pinned))
    by_feature = lines_by_feature(report(swapped(changed(grid))))
    assert by_feature["ServerApp", "batched-grid"] == (
        "falls back",
        f"this Flower lacks the source of {path} as read in Flower {internals.FLOWER_VERSION}",
    )
    assert [k for k, (state, _) in by_feature.items() if state != "applies"] == [
        ("ServerApp", "batched-grid")
    ]
    # The same check the ServerApp runs before it batches its grid (hetfed.runtime.seam).
    assert grid.check(grid.pinned) == "" and path in grid.check(changed(grid).pinned)


@pytest.mark.skipif(not READ_IN, reason=f"Flower {flwr.__version__} is not the one the runtime was read in")
def test_what_comes_with_the_warm_runtime_falls_back_with_it_and_pinning_moves_to_the_supernode() -> None:
    warm = named("SuperNode", "warm-runtime")
    path = "flwr.supernode.runtime.run_clientapp:run_clientapp"
    by_feature = lines_by_feature(report(swapped(changed(warm, path))))
    assert (
        by_feature["SuperNode", "warm-runtime"][0] == "falls back"
        and path in by_feature["SuperNode", "warm-runtime"][1]
    )
    for name in ("node-key", "fast-path", "batched-objects", "held-pull-client"):
        assert by_feature["SuperNode", name] == ("falls back", "it comes with warm-runtime, which falls back")
    assert by_feature["SuperLink", "batched-objects"][0] == "applies"  # another process's feature
    assert by_feature["SuperNode", "app-pinning"] == (
        "applies",
        "checked by the SuperNode before a FAB is fetched, and by the warm worker",
    )


@pytest.mark.skipif(not READ_IN, reason=f"Flower {flwr.__version__} is not the one the runtime was read in")
def test_pinning_falls_back_to_the_warm_worker_and_refuses_only_where_nothing_checks() -> None:
    check = named("SuperNode", "pinning-check")
    warm = named("SuperNode", "warm-runtime")
    worker_alone = lines_by_feature(report(swapped(changed(check))))
    assert worker_alone["SuperNode", "pinning-check"][0] == "falls back"
    assert worker_alone["SuperNode", "app-pinning"] == (
        "applies",
        "checked by the warm worker alone, before installing a build (--runtime warm)",
    )
    pull_step = next(iter(internals.PULL_STEP))  # what both rely on: neither can check
    nothing = lines_by_feature(report(swapped(changed(check, pull_step), changed(warm, pull_step))))
    assert nothing["SuperNode", "app-pinning"][0] == "refuses"
    # hetfed-supernode decides with the same function.
    assert pinning_checks("", True) == ["supernode", "worker"]
    assert pinning_checks("", False) == ["supernode"]
    assert pinning_checks("the source of x", True) == ["worker"]
    assert pinning_checks("the source of x", False) == []


@pytest.mark.skipif(not READ_IN, reason=f"Flower {flwr.__version__} is not the one the runtime was read in")
@pytest.mark.parametrize("runtime", ["stock", "warm"])
def test_a_pinned_supernode_that_cannot_check_refuses_to_start_in_one_line(
    tmp_path: Path, runtime: str
) -> None:
    """hetfed-supernode itself, on a Flower whose pull step differs from the one read (the nightly
    1.43 changed it): neither its own check nor a warm worker can run, so it does not start."""
    allow = tmp_path / "approved-apps"
    allow.write_text("a" * 64 + "\n")
    key = next(iter(internals.PULL_STEP))
    script = (
        "import sys, hetfed.runtime.internals as i, hetfed.runtime.supernode as s; "
        f"i.PULL_STEP[{key!r}] = i.WARM_PINNED[{key!r}] = '0' * 64; s.main(sys.argv[1:])"
    )
    argv = ["--runtime", runtime, "--approved-apps", str(allow), "--insecure", "--superlink", "127.0.0.1:9"]
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    refusal = [line for line in lines if "app pinning" in line]
    changed_step = f"the source of {key} as read in Flower {internals.FLOWER_VERSION}"
    no_worker = "--runtime stock" if runtime == "stock" else f"the warm runtime lacks {changed_step}"
    assert len(refusal) == 1 and refusal[0] == lines[-1]
    assert refusal[0].startswith(
        f"hetfed-supernode: app pinning cannot be checked on this Flower (the SuperNode's check needs "
        f"{changed_step}; no warm worker of this SuperNode: {no_worker}"
    )
    assert refusal[0].endswith("); not starting an unpinned SuperNode")


def test_every_feature_names_sources_that_exist_in_flower() -> None:
    """A pinned path that names nothing would fall back for a typo, not for a change in Flower."""
    for feature in FEATURES:
        for path in feature.pinned:
            assert internals.attr(path) is not None, f"{feature.name}: {path}"
