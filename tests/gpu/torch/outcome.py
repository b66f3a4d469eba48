"""The GPU trainers' one result line, which their launchers read: FINISHED,
or RAISED with the first line of what PyTorch raised (a timeout or an
out-of-memory error is a result here, not a crash of the test)."""
import sys
import time


def run_reported(rank, body):
    """Runs body(), which returns what it did ("200 steps"). Prints
    "rank R: FINISHED <that> in T s", or "rank R: RAISED after T s: ..." and
    exits with 3."""
    t0 = time.monotonic()
    try:
        what = body()
    except Exception as e:  # what PyTorch raised is the result
        first = (str(e).splitlines() or [""])[0][:300]
        print(f"rank {rank}: RAISED after {time.monotonic() - t0:.1f} s: {type(e).__name__}: {first}", flush=True)
        sys.exit(3)
    print(f"rank {rank}: FINISHED {what} in {time.monotonic() - t0:.1f} s", flush=True)
