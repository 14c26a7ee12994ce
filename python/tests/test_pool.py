"""A pool's sandboxes answer warm, each as fresh as a cold one; what a ready
sandbox cannot take runs cold and says why."""

import ast

import pytest
from conftest import leftover_cgroups, namespace_fds

from airlock import PolicyError, Pool, PoolStats, SandboxError

#: Long enough for a refill on a loaded machine.
FILL_S = 180


@pytest.fixture
def pool():
    with Pool(size=1, preload=["numpy", "pandas"]) as pool:
        assert pool.wait_ready(1, FILL_S), pool.stats()
        yield pool


def test_a_pooled_run_is_warm_and_finds_nothing_an_earlier_one_left(pool):
    csv = b"x\n1\n2\n3\n"
    plant = (
        "import sys, os\n"
        "open('/work/left.txt', 'w').write('left')\n"
        "open('/tmp/left.txt', 'w').write('left')\n"
        "os.environ['AIRLOCK_LEFT'] = '1'\n"
        "import pandas as pd\n"
        "print('pandas' in sys.modules)\n"
        "int(pd.read_csv('data.csv').x.sum())"
    )
    first = pool.run(plant, files={"data.csv": csv})
    assert first.ok, (first.stderr, first.message)
    assert first.usage.start == "pooled", first.record["isolation"]
    assert first.stdout == "True\n" and first.value == "6"
    assert first.usage.pool_wait_ms is not None

    assert pool.wait_ready(1, FILL_S), pool.stats()
    look = (
        "import os\n"
        "paths = ('/work/left.txt', '/tmp/left.txt', '/work/data.csv')\n"
        "[p for p in paths if os.path.exists(p)], os.environ.get('AIRLOCK_LEFT')"
    )
    second = pool.run(look)
    assert second.usage.start == "pooled", second.record["isolation"]
    assert second.value == "([], None)", "the second pooled run found what the first left"

    # The probe is real: the same two runs in one sandbox find the file.
    assert pool.wait_ready(1, FILL_S), pool.stats()
    with pool.sandbox() as sb:
        assert sb.run(plant).ok is False  # no data.csv here: the plant fails at the end
        again = sb.run(look)
    assert again.usage.start == "cold", "a second run in a pooled sandbox is a cold one"
    assert "/work/left.txt" in again.value

    stats = pool.stats()
    assert isinstance(stats, PoolStats)
    assert (stats.size, stats.hits) == (1, 3), stats
    assert stats.refills >= 3 and stats.refill_ms_total >= stats.last_refill_ms > 0, stats


def test_a_run_that_lowers_its_memory_limit_stays_warm_and_is_held_to_it(pool):
    big = "import numpy\nx = numpy.ones(40 << 20)\nprint('survived', x.sum())"
    out = pool.run(big, mem_mb=200)
    assert out.usage.start == "pooled", out.record["isolation"]
    assert out.status == "memory_limit" and out.limit == "memory", (out.status, out.message)
    assert "survived" not in out.stdout
    assert out.record["policy"]["memory_mb"] == 200, out.record["policy"]


def test_settings_a_ready_sandbox_cannot_take_run_cold_and_say_why(pool):
    with pool.sandbox(env={"A": "b"}) as sb:
        out = sb.run("import os\nos.environ['A']")
    assert out.ok and out.value == "'b'"
    assert out.usage.start == "cold"
    assert "env" in out.record["isolation"]["details"]["pool"], out.record["isolation"]["details"]

    out = pool.run("1", timeout_s=60)
    assert out.usage.start == "cold"
    assert "wall or CPU time is above the pool's" in out.record["isolation"]["details"]["pool"]

    # A run that fits is warm again.
    assert pool.stats().unsuited == 2, pool.stats()
    assert pool.wait_ready(1, FILL_S), pool.stats()
    assert pool.run("1").usage.start == "pooled"


def test_a_variable_env_at_claim_names_is_set_warm_and_no_other():
    with Pool(size=1, preload=["json"], env_at_claim=["TASK_ID"]) as pool:
        assert pool.wait_ready(1, FILL_S), pool.stats()
        with pool.sandbox(env={"TASK_ID": "t-1"}) as sb:
            out = sb.run("import os\nos.environ.get('TASK_ID')")
        assert out.usage.start == "pooled", out.record["isolation"]
        assert out.value == "'t-1'" and out.record["policy"]["env"] == {"TASK_ID": "t-1"}
        assert pool.wait_ready(1, FILL_S), pool.stats()
        with pool.sandbox(env={"OTHER": "x"}) as sb:
            out = sb.run("import os\nos.environ.get('OTHER')")
        assert out.usage.start == "cold" and out.value == "'x'"
        assert "OTHER" in out.record["isolation"]["details"]["pool"], out.record["isolation"]["details"]


def test_a_forked_run_has_pandas_imported_and_its_files_in():
    with Pool(size=1, mode="forked", preload=["numpy", "pandas"]) as pool:
        assert pool.wait_ready(1, FILL_S), pool.stats()
        code = (
            "import json, sys\n"
            "import pandas as pd\n"
            "sales = pd.read_csv('data.csv').sort_values('price')\n"
            "half = sales.units.sum() / 2\n"
            "median = float(sales.price[sales.units.cumsum() >= half].iloc[0])\n"
            "json.dump({'weighted_median': median}, open('out.json', 'w'))\n"
            "'pandas' in sys.modules, median"
        )
        with pool.sandbox() as sb:
            sb.write("/work/data.csv", b"price,units\n10,1\n20,3\n30,1\n")
            out = sb.run(code)
            written = sb.read("/work/out.json")
        assert out.ok, (out.status, out.stderr, out.message)
        assert out.usage.start == "forked", out.record["isolation"]
        assert out.value == "(True, 20.0)"
        assert written == b'{"weighted_median": 20.0}'
        stats = pool.stats()
        assert stats.templates == 1 and stats.hits == 1, stats
        assert stats.template_memory_bytes and stats.template_memory_bytes > 32 << 20, stats


def test_randomness_differs_across_forked_runs():
    draws = (
        "import os, random\n"
        "import numpy\n"
        "random.random(), float(numpy.random.random()), os.urandom(8).hex()"
    )
    seen = []
    with Pool(size=1, mode="forked", preload=["numpy"]) as pool:
        for _ in range(4):
            assert pool.wait_ready(1, FILL_S), pool.stats()
            out = pool.run(draws)
            assert out.ok and out.usage.start == "forked", (out.status, out.stderr, out.record["isolation"])
            seen.append(ast.literal_eval(out.value))
    for source, values in zip(("random", "numpy.random", "os.urandom"), zip(*seen)):
        assert len(set(values)) == len(values), f"{source} repeated across forked runs: {values}"


def test_a_pooled_pool_forks_nothing():
    with Pool(size=1, preload=["json"]) as pool:
        assert pool.wait_ready(1, FILL_S), pool.stats()
        assert pool.run("1").usage.start == "pooled"
        assert pool.stats().templates == 0


def test_a_closed_pool_leaves_nothing_and_refuses_sandboxes():
    before = namespace_fds()
    pool = Pool(size=2, preload=["json"])
    assert pool.wait_ready(2, FILL_S), pool.stats()
    stats = pool.stats()
    assert stats.ready == 2 and stats.memory_bytes and stats.memory_bytes > 2 << 20, stats
    assert len(namespace_fds()) == len(before) + 4, "each ready sandbox holds its user and mount namespaces"
    pool.close()
    assert pool.closed
    assert namespace_fds() == before, "the ready sandboxes outlived the pool"
    assert leftover_cgroups() == []
    with pytest.raises(SandboxError, match="this pool is closed"):
        pool.sandbox()
    pool.close()


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"size": 0}, "size"),
        ({"size": True}, "size"),
        ({"preload": "pandas"}, "preload=\\['pandas'\\]"),
        ({"preload": ["os; import x"]}, "preload"),
        ({"idle_expiry_s": 0}, "idle_expiry_s"),
        ({"memory_budget_mb": 0}, "memory_budget_mb"),
        ({"memory_budget_mb": "1G"}, "memory_budget_mb"),
        ({"env_at_claim": "TASK_ID"}, "env_at_claim=\\['TASK_ID'\\]"),
        ({"env_at_claim": ["LD_PRELOAD"]}, "env_at_claim: \"LD_PRELOAD\" cannot be set"),
        ({"with_packages": ["statsmodels"]}, "with_packages"),
        ({"mem_mb": 1}, "mem_mb"),
        ({"mode": "fork"}, 'mode="fork" is not a pool mode: use "pooled" or "forked"'),
        ({"mode": None}, 'mode takes "pooled" or "forked"'),
    ],
)
def test_bad_pool_settings_are_refused_naming_them(arguments, named):
    with pytest.raises(PolicyError, match=named):
        Pool(**arguments)


def test_an_unknown_setting_is_a_type_error():
    with pytest.raises(TypeError, match="memory_mb"):
        Pool(memory_mb=256)
