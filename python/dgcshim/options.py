"""The library's option table and parser, through dgcshim-options (built
from the same C table as libdgcshim.so: no copy of either here)."""
import json
import subprocess

from . import paths


def table():
    out = subprocess.run([paths.options_program(), "table"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def flag_of(name):
    """DGC_WARMUP_STEPS -> --warmup-steps."""
    return "--" + name[len("DGC_"):].lower().replace("_", "-")


def check(env):
    """None when env's DGC_* variables parse, else the library's message."""
    r = subprocess.run([paths.options_program(), "check"], env=env, capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return r.stderr.strip() or "dgcshim-options check failed (exit %d)" % r.returncode


def engine():
    r = subprocess.run([paths.options_program(), "engine"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None
