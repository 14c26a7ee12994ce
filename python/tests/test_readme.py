"""The pattern users write, from the README and the issue, with exact answers."""

import csv
import io
import json

from conftest import EXAMPLES, README, readme_snippet

from airlock import Sandbox


def weighted_median(csv_text):
    """The weighted median of price by units, computed here, outside any sandbox."""
    rows = sorted((float(r["price"]), int(r["units"])) for r in csv.DictReader(io.StringIO(csv_text)))
    half = sum(units for _, units in rows) / 2
    cumulative = 0
    for price, units in rows:
        cumulative += units
        if cumulative >= half:
            return price
    raise AssertionError("no rows")


def test_the_readme_snippet_runs_as_written(capsys):
    exec(compile(readme_snippet(), str(README), "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["ok 20.0", "b'{\"weighted_median\": 20.0}'"]


def test_the_weighted_median_job_gives_the_exact_answer():
    csv_bytes = (EXAMPLES / "sales.csv").read_bytes()
    code = (EXAMPLES / "weighted_median.py").read_text()
    with Sandbox(network=False, mem_mb=512, timeout_s=20) as sb:
        sb.write("/work/sales.csv", csv_bytes)  # only what is needed
        out = sb.run(code, cwd="/work")
        result = sb.read("/work/out.json") if out.ok else None
    assert out.ok, (out.status, out.stderr)
    answer = json.loads(result)
    expected = weighted_median(csv_bytes.decode())
    assert answer == {"rows": 4000, "weighted_median": expected}
    assert out.value == repr(expected)
    assert out.stdout == f"weighted median price: {expected}\n"
