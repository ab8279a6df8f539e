"""Write the tabular example: three silos' samples.csv and the new rows to predict.

    .venv/bin/python examples/tabular/make_example.py [--out DIR]

Silo k (``silo-<k>/samples.csv``, 200 rows) draws its features x1..x4 with its own location and scale,
a group ``s ~ Bernoulli(0.3 + 0.1 k)`` and ``label ~ Bernoulli(sigmoid(beta'z + 1.5 s - 0.5))``
(problems/tabular.py ``write_synthetic_silos``, seed 0): the label depends on the group, so a model
fitted without the constraint has a demographic-parity gap. ``new-rows.csv``: 10 rows of silo 0's
distribution, with ``id`` and the features only.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from anywhere in the repository

from hetfed.problems.tabular import write_synthetic_silos  # noqa: E402

FEATURES = ("x1", "x2", "x3", "x4")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: this folder)")
    out = parser.parse_args().out
    silos = write_synthetic_silos(out, num_silos=3, rows=200, features=FEATURES, seed=0)
    with open(silos[0] / "samples.csv", newline="") as f:
        test_rows = [r for r in csv.DictReader(f) if r["split"] == "test"][:10]
    with open(out / "new-rows.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", *FEATURES])
        writer.writerows([[f"new-{i:02d}", *(r[c] for c in FEATURES)] for i, r in enumerate(test_rows)])
    print(f"wrote {', '.join(str(s) for s in silos)} and {out / 'new-rows.csv'}")


if __name__ == "__main__":
    main()
