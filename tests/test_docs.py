"""The documentation cannot rot silently.

* ``docs/algorithms.md`` names, beside every equation, the ``path/file.py: name`` that computes
  it; every such reference must name a file of the repository and a function or class defined
  in it (``Class.method`` for a method), found by parsing the file with ``ast``.
* Every number the documentation's pages (docs/*.md) and docs/results/knapsack.md quote from a
  results JSON (knapsack, energy, shortest-path, np- and fair-classification, ...) is recomputed
  from that JSON, and the orderings they state (who is ahead, what holds on every row) are
  asserted on it. A claim names the page that holds its text: a passage that moves takes its
  claims along.
* Every relative link of README.md (which the site does not build) resolves, and so does every
  heading anchor it links; the site's own links are checked by ``make docs``.
* docs/config-reference.md lists every run-config key (docs/_ext/config_reference.py writes it
  from hetfed/config.py's ``SCHEMA`` when the site is built), and README.md stays a front page
  (at most 250 lines).
* docs/results/knapsack.md is exactly what its generator (``hetfed reproduce knapsack``) renders
  from the committed knapsack.json, so the document and the generator cannot drift apart.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hetfed.reproduce import knapsack

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = ROOT / "docs" / "algorithms.md"

# `client/losses.py: rspo_plus_loss`, `problems/polytope.py: KnapsackPolytope.radius`
REFERENCE = re.compile(r"([A-Za-z0-9_./-]+\.py): ([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")


@cache
def definitions(path: Path) -> frozenset[str]:
    """Every function and class of ``path``, dotted by nesting (``Class.method``)."""
    names: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                names.add(name)
                visit(child, name + ".")

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return frozenset(names)


def references(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in REFERENCE.finditer(text)]


def test_algorithms_md_references_name_existing_functions() -> None:
    refs = references(ALGORITHMS.read_text(encoding="utf-8"))
    assert len(refs) >= 80, (
        f"docs/algorithms.md should tie its equations to code; found {len(refs)} references"
    )
    broken = []
    for file, name in refs:
        path = ROOT / file
        if not path.is_file():
            broken.append(f"{file}: {name} (no file {file})")
        elif name not in definitions(path):
            broken.append(f"{file}: {name} (no function or class {name!r} in {file})")
    assert not broken, "docs/algorithms.md names code that does not exist:\n" + "\n".join(broken)


def test_algorithms_md_covers_the_three_methods_and_their_pieces() -> None:
    refs = {f"{file}: {name}" for file, name in references(ALGORITHMS.read_text(encoding="utf-8"))}
    for expected in (
        "client/losses.py: rspo_plus_loss",
        "client/losses.py: spo_plus_loss",
        "client/losses.py: mse_loss",
        "client/losses.py: pfyl_loss",
        "client/losses.py: dpo_loss",
        "client/losses.py: optnet_loss",
        "client/calibration.py: calibrate",
        "client/decision_client.py: DecisionClient.train_personalize",
        "problems/metrics.py: qp_lp_gap",
        "strategies/fedavg.py: FedAvg.aggregate_sum",
        "server/secure_aggregation.py: SecureRound.run",
        "server/privacy.py: Privacy.noised",
        "strategies/softmax_switching.py: masked_softmax",
        "strategies/softmax_switching.py: weighted_step",
        "client/lsa.py: PFLSAClient.step",
        "strategies/fedlsa.py: FedLSA",
        "client/lsa.py: SCAFFLSAClient",
    ):
        assert expected in refs, f"docs/algorithms.md does not point to {expected}"


def test_the_reference_checker_catches_a_stale_name(tmp_path: Path) -> None:
    """The checker itself: a renamed function or a missing file is reported."""
    (tmp_path / "m.py").write_text("class A:\n    def f(self):\n        pass\n\ndef g():\n    pass\n")
    assert definitions(tmp_path / "m.py") == {"A", "A.f", "g"}
    assert references("see `m.py: A.f` and (m.py: g), not m.py:g") == [("m.py", "A.f"), ("m.py", "g")]


PAGES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("doc", ["README.md", "docs/results/knapsack.md", *PAGES])
def test_no_link_to_a_missing_algorithms_file(doc: str) -> None:
    """The README once pointed to a specification file that is not in the repository; every relative
    link of the README and of the documentation's pages names a file that exists."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / Path(doc).parent / target).exists(), f"{doc} links to a missing {target}"
    if doc == "README.md":
        assert "docs/algorithms.md" in text


def heading_anchor(heading: str) -> str:
    """The anchor a Git host (and MyST's myst_heading_anchors) gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readmes_anchor_links_name_its_headings() -> None:
    """The site checks its pages' anchors (``make docs``); the README is not one of them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    anchors = {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links, "the README links its own sections"
    assert not set(links) - anchors, f"README.md links to no heading: {sorted(set(links) - anchors)}"
    assert heading_anchor("What is and is not protected`!") == "what-is-and-is-not-protected"


def test_the_readme_is_a_front_page() -> None:
    """What hetfed is, its two commands, one run, the engines and where the rest is: the manual is
    in docs/ (issue 50)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the reference text into docs/"
    for command in ("make demo", "make test", "hetfed run --engine inline"):
        assert any(command in line for line in lines), command


def config_reference() -> Any:
    """docs/_ext/config_reference.py, the Sphinx extension that writes the run-config reference."""
    path = ROOT / "docs" / "_ext" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_lists_every_run_config_key() -> None:
    from hetfed.config import SCHEMA

    reference = config_reference()
    assert reference.MARKER in (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `([^`]+)` \|.*$", reference.markdown(), re.M)}
    assert set(rows) == set(SCHEMA), sorted(set(SCHEMA) ^ set(rows))
    for name, key in SCHEMA.items():  # its default, as TOML writes it, and its help
        default = f"`{'true' if key.default is True else 'false' if key.default is False else ''}"
        assert reference.code(key.default) in rows[name] and default in rows[name], name
    assert "| `secagg-bits` | int | `32` | >= 8 and <= 48 |" in rows["secagg-bits"]
    assert "| `dp-delta` | float | `1e-05` | > 0 and <= 0.5 |" in rows["dp-delta"]
    assert '`"off"`, `"central"`, `"local"`' in rows["dp"]


def test_a_run_config_key_the_reference_does_not_group_fails_the_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hetfed.params import Key

    reference = config_reference()
    monkeypatch.setattr(reference, "SCHEMA", {**reference.SCHEMA, "new-key": Key(1, "a key of no group")})
    with pytest.raises(ValueError, match="new-key"):
        reference.markdown()


# ------------------------------------------------------------------------------------------------
# Numbers quoted in the write-ups, recomputed from the committed JSON beside each results page.
#
# A claim is the exact text of the document (whitespace-normalised) with every number rendered
# from the JSON at test time: if the JSON changes, the rendered text no longer appears; if the
# text changes, it no longer matches. Within the passages listed in PASSAGES, every decimal
# number, percentage and "<n>x" factor must lie inside some claim, so a new number in them cannot
# go unchecked. The knapsack tables and acceptance checks are re-rendered row by row by the
# report's own renderers (hetfed/reproduce/knapsack.py).
# ------------------------------------------------------------------------------------------------

RESULTS = ROOT / "docs" / "results"
# The pages whose text quotes the JSON (the README points to them).
REPRODUCTIONS, PILOT, SECURITY = "docs/reproductions.md", "docs/pilot.md", "docs/security.md"
RUNTIME, METHODS_GUIDE = "docs/runtime.md", "docs/running-the-methods.md"
PAPER_ROWS = ("(0,0,0)", "(1,0,0)", "(0,1,0)", "(0,0,1)")
LOSSES = ("mse", "pfyl", "dpo", "spo+", "rspo+")


@cache
def results(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


def normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def up(x: float, digits: int = 2) -> str:
    """A bound ("within x") rounded up, so that the stated bound is never below the truth."""
    return f"{math.ceil(x * 10**digits - 1e-9) / 10**digits:.{digits}f}"


class Knapsack:
    """Views of docs/results/knapsack.json."""

    def __init__(self) -> None:
        d = results("knapsack")
        self.t, self.paper, self.wall = d["tables"], d["paper"], d["wall-time-s"]

    def m(self, table: str, row: str, method: str, stage: str) -> float:
        return self.t[table][row][method][stage]["mean"]

    def t3(self, row: str, loss: str, stage: str) -> float:
        return self.m("t3", row, loss, stage)

    def t3_paper(self, row: str, loss: str, stage: str) -> float:
        return self.paper["t3"][row][loss][("fed", "per").index(stage)]

    def t3_diffs(self, loss: str) -> list[float]:
        """ours - paper over every Table 3 cell the paper reports."""
        return [
            self.t3(r, loss, s) - self.t3_paper(r, loss, s) for r in self.paper["t3"] for s in ("fed", "per")
        ]

    def interp(self, row: str) -> float:
        return self.m("t4", row, "interp-dffl", "interp")

    def optnet(self, row: str) -> float:
        return self.m("t4", row, "optnet", "per")

    def full(self, row: str) -> float:
        return self.t3(row, "rspo+", "per")

    def local(self, row: str) -> float:
        return self.m("t9", row, "local-only", "per")

    def t4_paper(self, row: str, column: str) -> float:
        return self.paper["t4"][row][("interp", "optnet", "full").index(column)]

    def t9_sources(self) -> dict[str, tuple[str, str, str]]:
        """Table 9's variants -> (table, method, stage) of knapsack.json (the report's own map)."""
        return knapsack.TABLE9

    def t9_diffs(self, variants: tuple[str, ...]) -> list[float]:
        out = []
        for label in variants:
            table, method, stage = self.t9_sources()[label]
            for i, row in enumerate(("(0,0,0)", "(1,0,0)", "(0,1,0)")):
                out.append(self.m(table, row, method, stage) - self.paper["t9"][label][i])
        return out


def knapsack_claims() -> list[tuple[str, str]]:
    k = Knapsack()
    dev = {loss: up(max(abs(x) for x in k.t3_diffs(loss))) for loss in LOSSES}
    below_i = [k.t4_paper(r, "interp") - k.interp(r) for r in PAPER_ROWS]
    below_o = [k.t4_paper(r, "optnet") - k.optnet(r) for r in PAPER_ROWS]
    r0, r1, r2, r3 = PAPER_ROWS

    def f(x: float) -> str:
        return f"{x:.2f}"

    def t3pair(loss: str) -> str:
        return f"{f(k.t3(r3, loss, 'fed'))} vs {k.t3_paper(r3, loss, 'fed')}"

    local3 = " / ".join(f(k.local(r)) for r in (r0, r1, r2))
    full3 = " / ".join(f(k.full(r)) for r in (r0, r1, r2))
    paper_local = k.paper["t9"]["local-only RSPO+"]
    t14 = k.paper["t14"]
    spo_local = k.m("t14", r0, "spo+-local-only", "per")
    rspo_rows = ("RSPO+ surrogate only", "+ per-client lam/eta", "+ per-client lam/eta + P")
    rspo_rows += ("full (annealing and freezing)",)
    page, md = REPRODUCTIONS, "docs/results/knapsack.md"
    return [
        # docs/reproductions.md, the knapsack against the paper
        (
            page,
            f"Against the paper's Table 3, RSPO+ is within {dev['rspo+']} points in every cell (Fed and +P), "
            f"SPO+ within {dev['spo+']}, MSE within {dev['mse']}, PFYL within {dev['pfyl']} and DPO within "
            f"{dev['dpo']};",
        ),
        (page, "every cell more than 0.5 points off is lower (better) here"),
        (page, f"the Fed column of (0,0,1) (DPO {t3pair('dpo')})"),
        (
            page,
            f"Interp-DFFL is {min(below_i):.2f} to {max(below_i):.2f} points below the paper "
            f"({f(k.interp(r2))} vs {k.t4_paper(r2, 'interp')} at (0,1,0))",
        ),
        (page, f"at (0,0,1) as in the paper ({f(k.interp(r3))} vs {f(k.full(r3))})"),
        (page, f"also at (0,1,0) ({f(k.interp(r2))} vs {f(k.full(r2))})"),
        (
            page,
            f"({local3} against {full3} at (0,0,0) / (1,0,0) / (0,1,0); the paper: "
            f"{' / '.join(map(str, paper_local))} for local-only)",
        ),
        (page, f"local-only SPO+ is worse than the paper's ({f(spo_local)} vs {t14['SPO+ local-only']})"),
        # knapsack.md: header
        (md, f"took {k.wall / 60:.1f} min (`wall-time-s`"),
        # knapsack.md: Against the paper
        (
            md,
            f"RSPO+ is within {dev['rspo+']} points of the paper in every cell (Fed and +P), SPO+ within "
            f"{dev['spo+']}, MSE within {dev['mse']}, PFYL within {dev['pfyl']} and DPO within {dev['dpo']}.",
        ),
        (md, "Every cell that differs by more than 0.5 points is lower (better) here than in the paper"),
        (
            md,
            f"DPO {t3pair('dpo')}, PFYL {t3pair('pfyl')}, MSE {t3pair('mse')}, SPO+ {t3pair('spo+')}, "
            f"RSPO+ {t3pair('rspo+')}.",
        ),
        (
            md,
            f"Interp-DFFL is {min(below_i):.2f} to {max(below_i):.2f} points below the paper's values and "
            f"OptNet-style {min(below_o):.2f} to {max(below_o):.2f} below.",
        ),
        (
            md,
            f"({f(k.full(r0))} vs {f(k.interp(r0))}; paper {k.t4_paper(r0, 'full')} vs "
            f"{k.t4_paper(r0, 'interp')})",
        ),
        (
            md,
            f"({f(k.interp(r3))} vs {f(k.full(r3))}; paper {k.t4_paper(r3, 'interp')} vs "
            f"{k.t4_paper(r3, 'full')})",
        ),
        (
            md,
            f"(Interp-DFFL {f(k.interp(r1))}, FedRSPO+ {f(k.full(r1))}) and the paper has FedRSPO+ ahead "
            f"({k.t4_paper(r1, 'full')} vs {k.t4_paper(r1, 'interp')})",
        ),
        (
            md,
            f"({f(k.interp(r2))} vs {f(k.full(r2))}; std {f(k.t['t4'][r2]['interp-dffl']['interp']['std'])} "
            f"and {f(k.t['t3'][r2]['rspo+']['per']['std'])})"
            f" and the paper has FedRSPO+ ahead ({k.t4_paper(r2, 'full')} vs {k.t4_paper(r2, 'interp')})",
        ),
        (
            md,
            ", ".join(f"{f(k.local(r))} vs {f(k.full(r))} at {r}" for r in (r0, r1, r2))
            + ", where the paper has local-only far behind "
            f"({', '.join(map(str, paper_local))})",
        ),
        (
            md,
            f"The four RSPO+ ablation rows are within {up(max(map(abs, k.t9_diffs(rspo_rows))))} points "
            f"of the paper, FedSPO+ within {up(max(map(abs, k.t9_diffs(('FedSPO+',)))))}.",
        ),
        (
            md,
            f"({f(spo_local)} vs {t14['SPO+ local-only']}), and so are the centralized yardsticks "
            f"(SPO+ {f(k.m('t14', r0, 'centralized-spo+', 'per'))} vs {t14['SPO+ centralized']}, "
            f"RSPO+ {f(k.m('t14', r0, 'centralized-rspo+', 'per'))} vs {t14['RSPO+ centralized']})",
        ),
        # knapsack.md: notes
        (
            md,
            "seed-to-seed std in Table 3 is "
            + " to ".join(
                f(x)
                for x in (
                    min(
                        k.t["t3"][r][loss][s]["std"]
                        for r in k.t["t3"]
                        for loss in ("mse", "spo+")
                        for s in ("fed", "per")
                    ),
                    max(
                        k.t["t3"][r][loss][s]["std"]
                        for r in k.t["t3"]
                        for loss in ("mse", "spo+")
                        for s in ("fed", "per")
                    ),
                )
            )
            + " points (RSPO+: "
            + " to ".join(
                f(x)
                for x in (
                    min(k.t["t3"][r]["rspo+"][s]["std"] for r in k.t["t3"] for s in ("fed", "per")),
                    max(k.t["t3"][r]["rspo+"][s]["std"] for r in k.t["t3"] for s in ("fed", "per")),
                )
            )
            + ")",
        ),
    ]


def trace_counts(variant: str) -> dict[str, int]:
    """energy.json's personalization trace: zone-seed cases, and where the personal model ends."""
    cases = [
        c for z in results("energy")["personalization-trace"][variant]["cases"].values() for c in z.values()
    ]
    return {
        "cases": len(cases),
        "test-worse": sum(c["test"][-1] > c["fed-test"] for c in cases),
        "val-better": sum(c["val-%"][-1] < c["fed-val-%"] for c in cases),
        "first-round-worse": results("energy")["personalization-trace"][variant]["rounds"]["1"][
            "worse-on-test"
        ],
        "frozen": sum(c["frozen-at"] > 0 for c in cases),
    }


def energy_claims() -> list[tuple[str, str]]:
    d = results("energy")
    ab = d["ablation"]
    clean = trace_counts("no-storm")

    def a(setting: str, row: str, std: bool = False) -> str:
        entry = ab[setting][row]["absolute"]
        return f"{entry['mean']:.1f} ± {entry['std']:.1f}" if std else f"{entry['mean']:.1f}"

    zones = d["storm"]["zones"].values()
    share = sum(z["share-sum-norm-%"] for z in zones) / len(zones)
    ratio = sum(z["lam0"] / z["lam0-no-storm"] for z in zones) / len(zones)
    days = {z["storm-days-in-train"] for z in zones}
    assert days == {9}, "docs/reproductions.md: 'the nine February 2021 storm days'"
    pjm = d["paper-pjm"]["ablation"]
    cold = d["cold-start"]
    local = {int(n): v["absolute"]["mean"]["mean"] for n, v in cold["local"].items() if int(n) > 0}
    full = "full (annealing and freezing)"
    assert trace_counts("as-is")["frozen"] == 0  # "As is, no zone ever freezes"
    assert clean["first-round-worse"] > clean["cases"] / 2  # "the harm is there after the first round"
    trace = [
        (
            REPRODUCTIONS,
            f"on the test days in {clean['test-worse']} of {clean['cases']} zone-seeds while it ends better "
            f"on the zone's own validation days in {clean['val-better']};",
        ),
    ]
    return trace + [
        (
            REPRODUCTIONS,
            f"training, MSE {a('no-storm', 'MSE')}, federated SPO+ {a('no-storm', 'SPO+')}, FedRSPO+ (full) "
            f"{a('no-storm', full, std=True)}.",
        ),
        (
            REPRODUCTIONS,
            f"FedRSPO+ (full) is {a('as-is', full, std=True)} against SPO+ {a('as-is', 'SPO+', std=True)}",
        ),
        (REPRODUCTIONS, f"carry {share:.0f}% of the training cost norms"),
        (REPRODUCTIONS, f"about {ratio:.0f}x"),
        (REPRODUCTIONS, f"(PJM: {pjm['MSE']} / {pjm['SPO+']} / ... / {pjm[full]})"),
        (
            REPRODUCTIONS,
            f"(without the storm: {a('no-storm', 'RSPO+ fed-only, shared lam')} fed-only with a shared lam, "
            f"{a('no-storm', full)} full)",
        ),
        (REPRODUCTIONS, f"prices correlate {d['similarity']['price-corr-mean']:.2f}"),
        (
            REPRODUCTIONS,
            f"({cold['federated']['as-is']['absolute']['mean']['mean']:.1f} as is, "
            f"{cold['federated']['no-storm']['absolute']['mean']['mean']:.1f} without the storm)",
        ),
        (
            REPRODUCTIONS,
            f"its last {min(local)}-{max(local)} days ({min(local.values()):.0f}-{max(local.values()):.0f})",
        ),
    ]


def shortest_path_claims() -> list[tuple[str, str]]:
    t8, settings = (results("shortest-path")["table8"][k] for k in ("tables", "settings"))

    def t8_pair(k: str, loss: str) -> str:
        return f"{t8[k][loss]['fed']['mean']:.1f} / {t8[k][loss]['per']['mean']:.1f}"

    d = results("shortest-path")["heterogeneity"]
    t = d["tables"]

    def pair(row: str, loss: str) -> str:
        return f"{t[row][loss]['fed']['mean']:.1f} / {t[row][loss]['per']['mean']:.1f}"

    terrain = d["rows"]["random-t0.5"].split("t = ")[1]
    return [
        (REPRODUCTIONS, f"Table 8 settings** (client fraction {settings['fraction']}, 2 personalization"),
        (REPRODUCTIONS, f"RSPO+ {t8_pair('12', 'rspo+')} against SPO+ {t8_pair('12', 'spo+')}"),
        (REPRODUCTIONS, f"(MSE {t8_pair('12', 'mse')}), on 5 x 5"),
        (REPRODUCTIONS, f"on 5 x 5 RSPO+ {t8_pair('5', 'rspo+')} against SPO+ {t8_pair('5', 'spo+')}"),
        (REPRODUCTIONS, f"{pair('random-t0.5', 'rspo+')} against SPO+ {pair('random-t0.5', 'spo+')}"),
        (REPRODUCTIONS, f"terrain (t = {terrain})"),
        (REPRODUCTIONS, f"personalization does not help ({pair('corners-t0', 'rspo+')})"),
    ]


def clients(d: dict, setting: str) -> int:
    """Clients sampled per round: m, or (full participation) gradient evaluations per round."""
    s = next(s for s in d["settings"] if s["name"] == setting)
    if s["m"]:
        return s["m"]
    row = next(iter(d["table"][setting].values()))
    return row["grad-evals"] // (s["rounds"] * s["local_steps"])


def switching_claims() -> list[tuple[str, str]]:
    npc, fair = results("np-classification"), results("fair-classification")

    def avg_f(d: dict, setting: str, label: str) -> str:
        return f"{d['table'][setting][label]['avg-F']['mean']:.3f}"

    best_np = {s: npc["best-feasible"]["averaged model"][s]["penalty"] for s in ("full", "partial")}
    assert best_np["full"] == best_np["partial"] == "penalty rho=10"
    best_fair = {s: fair["best-feasible"]["averaged model"][s]["penalty"] for s in ("full", "partial")}
    assert best_fair["full"] == best_fair["partial"] == "penalty rho=1"
    sw = "switching alpha=100"
    worst_g = max(npc["table"][s][sw]["avg-G"]["max"] for s in ("full", "partial"))
    n, m = clients(npc, "full"), clients(npc, "partial")
    alpha_min = 2 * math.log(n) / npc["eps"]
    return [
        (REPRODUCTIONS, f"(worst G {worst_g:.3f} against eps = {npc['eps']})"),
        (
            REPRODUCTIONS,
            f"{avg_f(npc, 'full', sw)} vs {avg_f(npc, 'full', best_np['full'])} with full participation, "
            f"{avg_f(npc, 'partial', sw)} vs {avg_f(npc, 'partial', best_np['partial'])} "
            f"with {m} of {n} clients",
        ),
        (REPRODUCTIONS, f"alpha >= 2 ln(m)/eps = {alpha_min:.0f}"),
        (
            REPRODUCTIONS,
            f"with full participation ({avg_f(fair, 'full', 'switching alpha=10')} vs "
            f"{avg_f(fair, 'full', best_fair['full'])}); with {clients(fair, 'partial')} of "
            f"{clients(fair, 'full')} clients per round the penalty with rho = 1 is slightly better "
            f"({avg_f(fair, 'partial', best_fair['partial'])} vs "
            f"{avg_f(fair, 'partial', 'switching alpha=10')})",
        ),
    ]


STUDIES = ("alpha", "clients", "combined", "compositions", "data-heterogeneity", "linear", "rounds")
STUDIES += ("schedule",)


def study_claims() -> list[tuple[str, str]]:
    """docs/reproductions.md's paragraph on the knapsack studies (docs/results/knapsack-<study>.json)."""

    def s(name: str) -> dict:
        return results(f"knapsack-{name}")

    def m(study: str, row: str, loss: str, variant: str) -> str:
        return f"{s(study)['table'][row][loss][variant]['per']['mean']:.2f}"

    def order(variant: str, stage: str, pair: str) -> dict:
        orders = s("combined")["orderings"]
        return next(o for o in orders if (o["variant"], o["stage"], o["order"]) == (variant, stage, pair))

    rf, rp = order("default", "fed", "rspo+ < spo+"), order("default", "per", "rspo+ < spo+")
    sf = order("default", "fed", "spo+ < mse")
    runs = sum(s(n)["runs"] for n in STUDIES)
    minutes = sum(s(n)["runs-wall-time-s"] for n in STUDIES) / 60
    z, d5, d1 = "(0,0,0)", "(0,0,0.5)", "(0,0,1)"
    comp = s("compositions")["table"]
    prox = max(
        abs(comp[row][loss][v]["per"]["mean"] - comp[row][loss]["plain"]["per"]["mean"])
        for row in comp
        for loss in ("spo+", "rspo+")
        for v in ("FedProx mu=0.01", "FedProx mu=0.1")
    )

    def het(row: str, loss: str) -> str:
        local, fed = (m("data-heterogeneity", row, loss, v) for v in ("local-only", "fedrspo"))
        return f"{local} vs {fed}"

    page = REPRODUCTIONS
    return [
        (page, f"The eight studies are {runs} runs, {minutes:.1f} min of run time in all"),
        (
            page,
            f"RSPO+ beats SPO+ in all {rf['rows']} rows of {{0, 0.5, 1}}^3, Fed and +P (smallest margins "
            f"{rf['margin']:.2f} and {rp['margin']:.2f} points), but SPO+ beats MSE with the federated model "
            f"in only {sf['holds']} of {sf['rows']} rows",
        ),
        (
            page,
            f"local-only beats FedRSPO+ after personalization for RSPO+ ({het(d5, 'rspo+')} at (0,0,0.5), "
            f"{het(d1, 'rspo+')} at (0,0,1)) and for SPO+ ({het(d5, 'spo+')}, {het(d1, 'spo+')})",
        ),
        (
            page,
            f"alpha = 0.1 gives {m('alpha', z, 'rspo+', 'rspo-alpha=0.1')} against "
            f"{m('alpha', z, 'rspo+', 'rspo-alpha=0.01')} at the paper's 0.01",
        ),
        (
            page,
            "with 20 warm-start rounds instead of 10, SPO+ reaches "
            f"{m('rounds', z, 'spo+', 'num-rounds=20')} and MSE {m('rounds', z, 'mse', 'num-rounds=20')} "
            f"against RSPO+'s {m('rounds', z, 'rspo+', 'num-rounds=20')}",
        ),
        (
            page,
            f"one RSPO+ model on the pooled data does worse still (centralized "
            f"{m('data-heterogeneity', d5, 'rspo+', 'centralized')} and "
            f"{m('data-heterogeneity', d1, 'rspo+', 'centralized')})",
        ),
        (page, f"FedProx (mu 0.01 or 0.1) moves no +P cell by more than {prox:.2f} points"),
        (
            page,
            f"Ditto's personal model (mu 0.1) is worse than FedRSPO+'s personalization "
            f"({m('compositions', z, 'rspo+', 'Ditto mu=0.1')} vs {m('compositions', z, 'rspo+', 'plain')} "
            "for RSPO+ at (0,0,0))",
        ),
        (
            page,
            "the linear predictor is far behind the MLP for every loss "
            f"(RSPO+ {m('linear', z, 'rspo+', 'linear')} vs {m('linear', z, 'rspo+', 'MLP (64 hidden)')})",
        ),
    ]


FULL = "full (annealing and freezing)"


def pilot_claims() -> list[tuple[str, str]]:
    """docs/reproductions.md's paragraph on the energy pilot (docs/results/energy-pilot.json), and the
    first seed's cells the 13-zone deployment of docs/running-the-methods.md reproduces (energy.json)."""
    d = results("energy-pilot")
    r = d["tables"]["regret"]

    def m(split: str, run: str, stage: str) -> str:
        return f"{r[split][run][stage]['mean']:.1f}"

    diag = [d["diagnosis"][s][run] for s in d["diagnosis"] for run in d["diagnosis"][s]]
    corr = [x["val-test-gain-correlation"] for x in diag]
    picks = [x["choice-picks-test-winner"] for x in diag]
    lam = [z["as-is"]["mean"] / z["as-is"]["median"] for z in d["calibration"].values()]
    first = results("energy")["ablation"]["as-is"]
    fed, per = (first[row]["absolute"]["values"][0] for row in ("RSPO+ fed-only, per-client lam", FULL))
    return [
        (METHODS_GUIDE, f"(Fed {fed:.1f}, +P {per:.1f} in `energy.json`;"),
        (REPRODUCTIONS, f"(a lam0 about {sum(lam) / len(lam):.0f}x smaller, like the clean split's)"),
        (
            REPRODUCTIONS,
            f"the federated model is at {m('as-is', 'rspo+ median', 'fed')} against "
            f"{m('as-is', 'rspo+ mean', 'fed')} with the paper's mean",
        ),
        (
            REPRODUCTIONS,
            f"the deployed models at {m('as-is', 'rspo+ median', 'dep')} against "
            f"{m('as-is', 'rspo+ mean', 'dep')};",
        ),
        (
            REPRODUCTIONS,
            f"(Fed {m('no-storm', 'rspo+ median', 'fed')} and {m('no-storm', 'rspo+ mean', 'fed')})",
        ),
        (
            REPRODUCTIONS,
            f"the deployed models are at {m('as-is', 'rspo+ mean', 'dep')} against +P "
            f"{m('as-is', 'rspo+ mean', 'per')} and Fed {m('as-is', 'rspo+ mean', 'fed')}.",
        ),
        (REPRODUCTIONS, f"correlates {min(corr):.2f} to {max(corr):.2f} with its test gain"),
        (REPRODUCTIONS, f"picks the better test model in {min(picks):.0%} to {max(picks):.0%} of the cases"),
    ]


def lp_pilot_claims() -> list[tuple[str, str]]:
    """docs/pilot.md's paragraph on the worked pilot of silos' own LPs (docs/results/lp-pilot.json)."""
    t = results("lp-pilot")["tables"]

    def dep(loss: str, silo: str = "mean") -> str:
        return f"{t[loss]['dep'][silo]['mean']:.4f}"

    def won(other: str) -> str:
        w = t[f"rspo+-beats-{other}"]
        return f"{w['seeds-won']} of {w['seeds']}"

    houston = "client-00-silo-0"
    return [
        (
            PILOT,
            f"the deployed models' mean test relative regret is {dep('rspo+')} with RSPO+ against "
            f"{dep('mse')} with MSE (RSPO+ lower in {won('mse')} seeds) and {dep('spo+')} with SPO+ "
            f"(lower in {won('spo+')}); SPO+ is ahead on the Houston retailer ({dep('spo+', houston)} "
            f"against {dep('rspo+', houston)}).",
        )
    ]


def dp_claims() -> list[tuple[str, str]]:
    """docs/security.md's paragraph on the utility cost of DP (docs/results/dp-knapsack.json)."""
    t = results("dp-knapsack")["tables"]

    def dep(clients: str, loss: str, z: str) -> str:
        return f"{100 * t[clients][loss][z]['dep']['mean']:.2f}%"

    def eps(z: str) -> str:
        return f"{t['10']['rspo+'][z]['epsilon']:.3g}"

    return [
        (
            SECURITY,
            f"the deployed model's test relative regret of FedRSPO+ goes from {dep('10', 'rspo+', 'off')} "
            f"without DP to {dep('10', 'rspo+', '1')} at epsilon {eps('1')} and "
            f"{dep('10', 'rspo+', '4')} at epsilon {eps('4')} (delta 1e-5), MSE's from "
            f"{dep('10', 'mse', 'off')} to {dep('10', 'mse', '1')} and {dep('10', 'mse', '4')}; with 40 "
            f"clients the same epsilons cost FedRSPO+ less ({dep('40', 'rspo+', '1')} and "
            f"{dep('40', 'rspo+', '4')}), as the noise on the mean shrinks with the number of clients.",
        )
    ]


def superlink_claims() -> list[tuple[str, str]]:
    """docs/runtime.md's per-request SuperLink CPU by node key and round time at 32 SuperNodes
    (docs/results/bench-superlink-asgi.json), and the SuperLink CPU per silo at 100 simulated silos
    (docs/results/bench-superlink-capacity.json, the newest hetfed row and the stock row)."""
    asgi = results("bench-superlink-asgi")
    ms = asgi["per-request-ms"]
    rows = {
        (m["path"], m.get("superlink")): m
        for m in results("bench-superlink-capacity")["measured"]
        if m["silos"] == 100
        and m.get("replies", "trained") == ("trained" if m["path"] == "hetfed" else "light")
    }
    hetfed = rows[
        ("hetfed", "hetfed-superlink, own-message pull, batched objects and confirmations, held pull")
    ]
    stock = rows[("stock", "flower-superlink")]
    requests = sum(hetfed["fleet-requests-per-silo-round"].values())
    round_s = {key: f"{row['round-s']:.2f}" for key, row in asgi["measured"].items()}
    cpu_ms = hetfed["superlink-cpu-per-silo-round-ms"]
    return [
        (
            RUNTIME,
            f"a signed empty pull costs hetfed-superlink {ms['gated-secp256r1']:g} ms of CPU with a P-256 "
            f"key against {ms['gated-secp384r1']:g} ms with a P-384 key.",
        ),
        (
            RUNTIME,
            f"a 32-SuperNode FedAvg round on this 2-core machine took {round_s['gated-32']} s "
            f"(flower-superlink with the same warm SuperNodes: {round_s['stock-32']} s",
        ),
        (
            RUNTIME,
            f"100 simulated silos cost the SuperLink {cpu_ms:.2f} ms of CPU "
            f"per silo per round with {requests:g} Fleet requests per silo per round (Flower's path: "
            f"{stock['superlink-cpu-per-silo-round-ms']:.0f} ms",
        ),
    ]


def all_claims() -> list[tuple[str, str]]:
    claims = knapsack_claims() + energy_claims() + shortest_path_claims() + switching_claims()
    return claims + study_claims() + pilot_claims() + lp_pilot_claims() + dp_claims() + superlink_claims()


# (document, first words of a passage, first words after it): every number in it must be claimed.
PASSAGES = [
    (REPRODUCTIONS, "Results: [`docs/results/knapsack.md`]", "The plain single-process loop"),
    (REPRODUCTIONS, "What they found (5 seeds):", "## PF-LSA"),
    (REPRODUCTIONS, "What the knapsack studies found", "## Differential privacy on the knapsack"),
    (PILOT, "On this pilot, with every loss under FedRSPO+", None),
    (SECURITY, "What DP costs", "Who learns what:"),
    (
        REPRODUCTIONS,
        "[`docs/results/switching-study.md`](results/switching-study.md). What they found:",
        "## The result pages",
    ),
    ("docs/results/knapsack.md", "Generated by `hetfed reproduce knapsack`", "## Table 3"),
    ("docs/results/knapsack.md", "## Against the paper", "## Acceptance checks"),
    ("docs/results/knapsack.md", "## Notes", None),
]
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+(?:x|%)?|%|x)(?![\w])")
ROW_LABEL = re.compile(r"\((?:[\d.]+,){2}[\d.]+\)")  # (0,1,0), (0.5,0,0): a setting, not a result


def doc_text(doc: str) -> str:
    return normalised((ROOT / doc).read_text(encoding="utf-8"))


@pytest.mark.parametrize("doc, claim", all_claims(), ids=lambda x: x[:60])
def test_quoted_numbers_match_the_json(doc: str, claim: str) -> None:
    assert normalised(claim) in doc_text(doc), (
        f"{doc} should say (numbers from the committed JSON):\n  {claim}\n"
        "either the text or the JSON changed; make the text say what the JSON says"
    )


@pytest.mark.parametrize("doc, start, end", PASSAGES, ids=lambda x: str(x)[:40])
def test_every_number_in_the_write_ups_is_checked(doc: str, start: str, end: str | None) -> None:
    text = doc_text(doc)
    begin = text.index(normalised(start))
    stop = text.index(normalised(end), begin) if end else len(text)
    covered = [False] * len(text)
    for claim_doc, claim in all_claims():
        if claim_doc == doc:
            for match in re.finditer(re.escape(normalised(claim)), text):
                covered[match.start() : match.end()] = [True] * (match.end() - match.start())
    passage = ROW_LABEL.sub(lambda m: " " * len(m.group()), text[begin:stop])
    unchecked = [
        f"{m.group()} in '...{text[begin + m.start() - 40 : begin + m.end() + 20]}...'"
        for m in NUMBER.finditer(passage)
        if not covered[begin + m.start()]
    ]
    assert not unchecked, (
        f"{doc}: numbers no test ties to the JSON (add a claim in tests/test_docs.py, or drop the "
        "number):\n" + "\n".join(unchecked)
    )


def test_the_orderings_the_write_ups_state_hold_in_the_json() -> None:
    """The sentences that compare without quoting a number (who is ahead, what holds everywhere)."""
    k = Knapsack()
    # "every cell more than 0.5 points off is lower (better) here"
    assert all(x < 0 for loss in LOSSES for x in k.t3_diffs(loss) if abs(x) > 0.5)
    # "RSPO+ < SPO+ in both stages on every row and SPO+ < MSE after personalization, as in the paper"
    for row in k.t["t3"]:
        assert all(k.t3(row, "rspo+", s) < k.t3(row, "spo+", s) for s in ("fed", "per")), row
        assert k.t3(row, "spo+", "per") < k.t3(row, "mse", "per"), row
    for row in k.paper["t3"]:
        assert all(k.t3_paper(row, "rspo+", s) < k.t3_paper(row, "spo+", s) for s in ("fed", "per")), row
        assert k.t3_paper(row, "spo+", "per") < k.t3_paper(row, "mse", "per"), row
    # Table 4: who is ahead, Interp-DFFL or FedRSPO+, here and in the paper
    r0, r1, r2, r3 = PAPER_ROWS
    assert k.full(r0) < k.interp(r0) and k.t4_paper(r0, "full") < k.t4_paper(r0, "interp")
    assert k.interp(r3) < k.full(r3) and k.t4_paper(r3, "interp") < k.t4_paper(r3, "full")
    level = min(k.t["t4"][r1]["interp-dffl"]["interp"]["std"], k.t["t3"][r1]["rspo+"]["per"]["std"])
    assert abs(k.interp(r1) - k.full(r1)) < level and k.t4_paper(r1, "full") < k.t4_paper(r1, "interp")
    assert k.interp(r2) < k.full(r2) and k.t4_paper(r2, "full") < k.t4_paper(r2, "interp")
    assert all(k.interp(r) < k.t4_paper(r, "interp") for r in PAPER_ROWS)  # "below the paper"
    # "local-only RSPO+ is about as good as FedRSPO+ here" (within 0.1 points on every row), and
    # "the paper has local-only far behind"
    for i, row in enumerate((r0, r1, r2)):
        assert abs(k.local(row) - k.full(row)) < 0.1, row
        assert k.paper["t9"]["local-only RSPO+"][i] > k.full(row) + 4, row
    # Table 14: "worse here than in the paper"
    t14 = k.paper["t14"]
    assert k.m("t14", r0, "spo+-local-only", "per") > t14["SPO+ local-only"]
    assert k.m("t14", r0, "centralized-spo+", "per") > t14["SPO+ centralized"]
    assert k.m("t14", r0, "centralized-rspo+", "per") > t14["RSPO+ centralized"]

    # energy: "Personalization and per-client lam/eta do not help on this market"
    ab = results("energy")["ablation"]
    for setting in ("as-is", "no-storm"):
        shared = ab[setting]["RSPO+ fed-only, shared lam"]["absolute"]["mean"]
        for row in ("+ personalization", "+ per-client lam/eta", "full (annealing and freezing)"):
            assert shared < ab[setting][row]["absolute"]["mean"], (setting, row)
    # "about 4x" for every zone, not only on average
    zones = results("energy")["storm"]["zones"].values()
    assert all(3.5 < z["lam0"] / z["lam0-no-storm"] < 4.5 for z in zones)
    # cold start: the federation's model "does far better than its own model" for every window
    cold = results("energy")["cold-start"]
    for setting in ("as-is", "no-storm"):
        fed = cold["federated"][setting]["absolute"]["mean"]["mean"]
        assert all(fed < v["absolute"]["mean"]["mean"] for n, v in cold["local"].items() if int(n) > 0)

    # shortest paths: "RSPO+ is the best loss in every setting"; with identical clients
    # "personalization does not help"
    sp = results("shortest-path")["heterogeneity"]["tables"]
    for row, losses in sp.items():
        for stage in ("fed", "per"):
            best = min(losses, key=lambda loss, s=stage: losses[loss][s]["mean"])
            assert best == "rspo+", (row, stage)
    assert sp["corners-t0"]["rspo+"]["per"]["mean"] > sp["corners-t0"]["rspo+"]["fed"]["mean"]
    # Table 8's settings: "RSPO+ stays ahead and personalization makes it worse"
    t8 = results("shortest-path")["table8"]["tables"]
    for losses in t8.values():
        for stage in ("fed", "per"):
            assert min(losses, key=lambda loss, s=stage: losses[loss][s]["mean"]) == "rspo+", stage
        assert losses["rspo+"]["per"]["mean"] > losses["rspo+"]["fed"]["mean"]
    sweep = results("shortest-path")["sweep"]["tables"]
    step = sweep["spo-step"]

    def lead(point: str, stage: str) -> float:  # SPO+ - RSPO+, paired by seed
        spo, rspo = (step[point][loss][stage]["values"] for loss in ("spo+", "rspo+"))
        return sum(x - y for x, y in zip(spo, rspo, strict=True)) / len(spo)

    for k in ("k5", "k12"):  # "at RSPO+'s step SPO+'s federated model is level with RSPO+'s"
        assert abs(lead(f"{k}-lr", "fed")) < 0.25 * lead(k, "fed")
    assert lead("k5-rounds", "per") < 0  # "SPO+ overtakes after personalization with 30 warm-start rounds
    for point in ("d1-mlp", "d2-mlp"):  # or a near-linear cost law"
        x = sweep["degree-model"][point]
        assert x["spo+"]["per"]["mean"] < x["rspo+"]["per"]["mean"]
    for point, x in sweep["clients"].items():  # "with clients that differ personalization cuts both"
        if point != "corners-t0":
            assert all(x[m]["per"]["mean"] < x[m]["fed"]["mean"] for m in ("spo+", "rspo+"))

    # NP classification
    npc = results("np-classification")
    table = npc["table"]
    for setting in ("full", "partial"):
        assert table[setting]["switching alpha=100"]["grad-evals"] == 50000  # "50k gradient evaluations"
        assert table[setting]["switching alpha=100"]["avg-feasible-seeds"] == npc["seeds"]  # "every seed"
        for label in ("switching alpha=1", "primal-dual mean lr=1", "fedavg (unconstrained)"):
            assert table[setting][label]["avg-feasible-seeds"] == 0, (setting, label)
        m = clients(npc, setting)
        assert all(math.log(m) / alpha > npc["eps"] for alpha in (1, 10))  # "ln(m)/alpha exceeds eps"
    assert table["full"]["switching alpha=10"]["avg-feasible-seeds"] == 0
    assert table["partial"]["switching alpha=10"]["avg-feasible-seeds"] == 1  # "feasible in 1 of 5"
    assert clients(npc, "partial") == 5 and npc["seeds"] == 5
    # fair classification: "feasible in every seed", full: switching ahead; partial: penalty ahead
    fair = results("fair-classification")
    ft = fair["table"]
    for setting in ("full", "partial"):
        assert ft[setting]["switching alpha=10"]["avg-feasible-seeds"] == fair["seeds"]
    assert ft["full"]["switching alpha=10"]["avg-F"]["mean"] < ft["full"]["penalty rho=1"]["avg-F"]["mean"]
    assert (
        ft["partial"]["penalty rho=1"]["avg-F"]["mean"] < ft["partial"]["switching alpha=10"]["avg-F"]["mean"]
    )


def knapsack_table_lines() -> list[str]:
    """Every row of knapsack.md's tables and acceptance checks, rendered from knapsack.json by the
    report's own renderer (hetfed/reproduce/knapsack.py: markdown, templates/knapsack.md); the
    headings and the tables' header rows are left out."""
    lines = knapsack.markdown(results("knapsack")).splitlines()
    return [
        line
        for line, after in zip(lines, [*lines[1:], ""], strict=True)
        if line.startswith(("| ", "- (")) and not after.startswith("|---")
    ]


def test_knapsack_tables_match_the_json() -> None:
    text = (RESULTS / "knapsack.md").read_text(encoding="utf-8").splitlines()
    missing = [line for line in knapsack_table_lines() if line not in text]
    assert not missing, "docs/results/knapsack.md rows that differ from knapsack.json:\n" + "\n".join(missing)
    rendered = set(knapsack_table_lines())
    headers = {text[i - 1] for i, line in enumerate(text) if line.startswith("|---")}
    table_rows = [
        line for line in text if (line.startswith("| ") and line not in headers) or line.startswith("- (")
    ]
    extra = [line for line in table_rows if line not in rendered]
    assert not extra, "docs/results/knapsack.md rows no test renders from knapsack.json:\n" + "\n".join(extra)


def test_knapsack_md_is_what_the_generator_renders() -> None:
    """docs/results/knapsack.md is, byte for byte, what ``hetfed reproduce knapsack`` writes for
    the committed knapsack.json (hetfed/reproduce/knapsack.py: markdown, which reads nothing but
    that JSON). A hand edit of the document fails here instead of being overwritten by the next
    run, and so does a change of the generator whose document was not regenerated. The run folders
    feed only the plots, which the document merely links (``plot`` draws knapsack-*.png from them):
    the whole text is compared, the images are not."""
    data = json.loads((RESULTS / "knapsack.json").read_text(encoding="utf-8"))
    rendered = knapsack.markdown(data)
    committed = (RESULTS / "knapsack.md").read_bytes()
    if committed != rendered.encode("utf-8"):
        diff = difflib.unified_diff(
            committed.decode("utf-8").splitlines(),
            rendered.splitlines(),
            "docs/results/knapsack.md",
            "rendered from knapsack.json",
            lineterm="",
        )
        pytest.fail(
            "docs/results/knapsack.md is not what hetfed/reproduce/knapsack.py renders from knapsack.json "
            "(change the generator, then write its output to the document):\n" + "\n".join(diff)
        )


def test_the_lp_pilot_orderings_the_readme_states_hold() -> None:
    """ "RSPO+ lower" and "SPO+ is ahead on the Houston retailer" (docs/pilot.md, the worked pilot)."""
    t = results("lp-pilot")["tables"]
    assert t["rspo+"]["dep"]["mean"]["mean"] < min(t[o]["dep"]["mean"]["mean"] for o in ("spo+", "mse"))
    houston = "client-00-silo-0"
    assert t["spo+"]["dep"][houston]["mean"] < t["rspo+"]["dep"][houston]["mean"]


def test_the_dp_orderings_the_readme_states_hold_in_the_json() -> None:
    """docs/security.md "What DP costs": FedRSPO+ ahead without DP and with weak noise, MSE ahead at
    the smallest epsilons with 10 clients, and FedRSPO+'s updates clipped harder under noise."""
    t = results("dp-knapsack")["tables"]["10"]
    dep = {loss: {z: t[loss][z]["dep"]["mean"] for z in t[loss]} for loss in ("rspo+", "mse")}
    assert all(dep["rspo+"][z] < dep["mse"][z] for z in ("off", "0.25", "0.5"))
    assert all(dep["mse"][z] < dep["rspo+"][z] for z in ("2", "4"))
    assert all(
        t["rspo+"][z]["within-clip"]["mean"] < t["mse"][z]["within-clip"]["mean"]
        for z in ("0.5", "1", "2", "4")
    )
