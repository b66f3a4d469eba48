"""How `dgcshim run` puts the shim and its settings on every rank of a
command: the launchers it knows, and the rewriting each needs.

- Open MPI's mpirun/mpiexec: `-x NAME=VALUE` in every app context of an MPMD
  line (`a : b`), since each context takes its own -x (remote ranks see
  nothing else of mpirun's environment).
- MPICH's hydra (mpiexec.hydra, mpiexec.mpich): `-genv NAME VALUE`, global.
- Everything else (torchrun, horovodrun, srun, plain programs, launchers it
  does not know): the environment, which they pass on.
"""
import os
import re
import subprocess

OPEN_MPI = {"orterun", "oshrun", "prterun", "mpirun.openmpi", "mpiexec.openmpi"}
HYDRA = {"mpiexec.hydra", "mpirun.mpich", "mpiexec.mpich", "hydra_pmi_proxy"}
ASK = {"mpirun", "mpiexec"}  # either family: ask the program itself
PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
GROUPS1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_groups1.py")


class Refused(Exception):
    pass


def version_text(program):
    try:
        r = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout + r.stderr


def family_of_version(text):
    if "Open MPI" in text or "OpenRTE" in text or "Open RTE" in text or "PRRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return "hydra"
    return None


def mpi_family_of_version(text):
    """The shim's library family ("openmpi" or "mpich") for an MPI's version text, or None."""
    return {"openmpi": "openmpi", "hydra": "mpich"}.get(family_of_version(text))


def launcher(argv0):
    """(kind, why): kind is openmpi, hydra or environment."""
    base = os.path.basename(argv0)
    if base in OPEN_MPI:
        return "openmpi", "%s is Open MPI's launcher" % base
    if base in HYDRA:
        return "hydra", "%s is MPICH's hydra" % base
    if base in ASK:
        text = version_text(argv0)
        kind = family_of_version(text)
        first = text.strip().splitlines()[0] if text.strip() else "no answer"
        if kind:
            return kind, "`%s --version` says %r" % (base, first)
        return "environment", "`%s --version` names neither Open MPI nor hydra (%r): by environment" % (base, first)
    return "environment", "%s inherits the environment" % base


def contexts(argv):
    """The app contexts of an MPMD line: index ranges between ':' tokens."""
    out, start = [], 1
    for i, a in enumerate(argv):
        if a == ":" and i > 0:
            out.append((start, i))
            start = i + 1
    out.append((start, len(argv)))
    return out


def with_exports(argv, kind, pairs):
    """argv with pairs ((name, value), ...) exported the launcher's way."""
    if kind == "openmpi":
        out = [argv[0]]
        for n, (lo, hi) in enumerate(contexts(argv)):
            if n:
                out.append(":")
            for name, value in pairs:
                out += ["-x", "%s=%s" % (name, value)]
            out += argv[lo:hi]
        return out
    if kind == "hydra":
        out = [argv[0]]
        for name, value in pairs:
            out += ["-genv", name, value]
        return out + argv[1:]
    return list(argv)


# Python's options that take the next token as their value.
PY_OPTS_WITH_VALUE = {"-W", "-X", "-Q"}


def with_groups1(argv):
    """argv with horovod_groups1.py between each Python interpreter and its
    script (or -m module); refused when a rank's Python runs -c or nothing."""
    out, i, wrapped = [], 0, 0
    while i < len(argv):
        a = argv[i]
        out.append(a)
        i += 1
        if not PYTHON.match(os.path.basename(a)):
            continue
        while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c", "-"):
            out.append(argv[i])
            i += 1
            if out[-1] in PY_OPTS_WITH_VALUE and i < len(argv):
                out.append(argv[i])
                i += 1
        if i >= len(argv) or argv[i] in ("-c", "-", ":"):
            raise Refused("--horovod-groups1: the Python at %r runs no script (-c, stdin or nothing): "
                          "give it the training script" % a)
        out.append(GROUPS1)
        wrapped += 1
    if not wrapped:
        raise Refused("--horovod-groups1: no Python interpreter (python, python3, .../bin/python) in the command, "
                      "so no script to bind groups=1 into: write `python SCRIPT` in the command")
    return out
