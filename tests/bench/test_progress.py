import io

from specpilot.bench.progress import Progress


def test_progress_prints_the_first_step_and_every_tenth_to_a_log_and_nothing_when_disabled():
    log = io.StringIO()
    with Progress(20, "bench x", stream=log) as bar:
        for _ in range(20):
            bar.step("gsm8k: ar")
    lines = log.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("bench x [") and "20/20 100%" in lines[-1]
    assert "gsm8k: ar" in lines[0] and "left" in lines[0]
    quiet = io.StringIO()
    bar = Progress(5, stream=quiet, enabled=False)
    bar.step()
    bar.close()
    assert quiet.getvalue() == "" and bar.done == 1
