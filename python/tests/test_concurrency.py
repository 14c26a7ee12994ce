"""Sandboxes on several threads, and under asyncio, run at the same time."""

import asyncio
import os
import signal
import threading
import time

import pytest

from airlock import Sandbox, SandboxError

SLEEP = "import time\ntime.sleep(1.5)\n'done'"


def overlapping(spans):
    """Whether every run was in progress at one same moment."""
    return max(start for start, _ in spans) < min(end for _, end in spans)


def test_sandboxes_on_threads_run_at_once():
    spans, results, errors = [], [], []

    def work():
        try:
            with Sandbox() as sb:
                start = time.monotonic()
                out = sb.run(SLEEP)
                spans.append((start, time.monotonic()))
                results.append(out.value)
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == ["'done'"] * 4
    assert overlapping(spans), "the runs took turns: is the GIL held during a run?"


def test_the_gil_is_free_while_a_run_waits(sandbox):
    ticks = 0
    done = threading.Event()

    def run():
        sandbox.run(SLEEP)
        done.set()

    worker = threading.Thread(target=run)
    worker.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.01)
    worker.join()
    # Holding the GIL for the run would leave this thread at a tick or two.
    assert ticks > 20


def test_one_sandbox_shared_by_threads_takes_turns(sandbox):
    values = []
    threads = [threading.Thread(target=lambda i=i: values.append(sandbox.run(f"{i} * 2").value)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(values) == ["0", "2", "4", "6"]


def test_asyncio_runs_sandboxes_at_once():
    async def main():
        sandboxes = [Sandbox() for _ in range(3)]
        ticks = 0
        finished = False

        async def ticker():
            nonlocal ticks
            while not finished:
                ticks += 1
                await asyncio.sleep(0.01)

        async def timed(sb):
            start = time.monotonic()
            out = await sb.run_async(SLEEP)
            return out, (start, time.monotonic())

        tick_task = asyncio.create_task(ticker())
        try:
            done = await asyncio.gather(*(timed(sb) for sb in sandboxes))
        finally:
            finished = True
            await tick_task
            for sb in sandboxes:
                sb.close()
        return done, ticks

    done, ticks = asyncio.run(main())
    assert [out.value for out, _ in done] == ["'done'"] * 3
    assert overlapping([span for _, span in done])
    assert ticks > 20, "the event loop stalled while the runs went on"


def test_cancelling_run_async_stops_the_run():
    async def main(sb):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sb.run_async("import time\ntime.sleep(60)"), timeout=1)

    with Sandbox(timeout_s=120) as sb:
        asyncio.run(main(sb))
        # The run was killed, so closing (which waits for a run in
        # progress) returns long before the code's 60 seconds.
        start = time.monotonic()
        with pytest.raises(SandboxError, match="stopped while a run was in progress"):
            sb.run("1")
        sb.close()
        assert time.monotonic() - start < 30


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler, for the test's length. A process started
    in the background by a shell without job control (`cmd &` in a script)
    inherits SIGINT ignored, and Python then raises no KeyboardInterrupt:
    the test asks for what an interactive session has."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_a_run_instead_of_waiting_it_out(ctrl_c_raises):
    with Sandbox(timeout_s=120) as sb:
        interrupt = threading.Timer(1, os.kill, (os.getpid(), signal.SIGINT))
        interrupt.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            sb.run("import time\ntime.sleep(60)")
        assert time.monotonic() - start < 30
        with pytest.raises(SandboxError, match="stopped while a run was in progress"):
            sb.run("1")
