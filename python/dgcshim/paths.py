"""Where the library and the option-table program are: inside the installed
package (lib/, bin/), or where DGCSHIM_LIBRARY and DGCSHIM_OPTIONS point
(a CMake build tree, for development)."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
# "nccl": the library without the MPI front end, built where CMake found no
# MPI (or with -DDGC_MPI=OFF): ncclAllReduce only, for PyTorch DDP.
FAMILY_LIBRARY = {"openmpi": "libdgcshim.so", "mpich": "libdgcshim-mpich.so", "nccl": "libdgcshim-nccl.so"}
NCCL_ONLY = ("the NCCL front end alone (built without MPI: none found, or DGC_MPI=OFF): it compresses "
             "ncclAllReduce (PyTorch DDP), not MPI_Allreduce")


def family_of(info):
    """The key of a library by its build facts (elf.build_info): its MPI family, or "nccl" without the MPI
    front end. A library from before the facts said so has it."""
    if not info.get("mpi_front_end", True):
        return "nccl"
    return info.get("mpi_family", "openmpi")


def front_ends(info):
    """The front ends a library has, by its build facts: ["MPI", "NCCL"], either alone."""
    return [name for name, key, default in (("MPI", "mpi_front_end", True), ("NCCL", "nccl_front_end", False))
            if info.get(key, default)]


class NotFound(Exception):
    pass


def libraries():
    """{family: path} of every library this installation has."""
    env = os.environ.get("DGCSHIM_LIBRARY")
    if env:
        from . import elf
        info = elf.build_info(env) or {}
        return {family_of(info): os.path.abspath(env)}
    found = {}
    for family, name in FAMILY_LIBRARY.items():
        path = os.path.join(HERE, "lib", name)
        if os.path.exists(path):
            found[family] = path
    return found


def library(family=None):
    libs = libraries()
    if not libs:
        raise NotFound("no libdgcshim.so in %s: install the package (pip install .) or set DGCSHIM_LIBRARY to "
                       "a built build/libdgcshim.so" % os.path.join(HERE, "lib"))
    if family is None:
        family = "openmpi" if "openmpi" in libs else sorted(libs)[0]
    if family not in libs and set(libs) == {"nccl"}:
        raise NotFound("this installation has no library for %s: it has %s, %s; install MPI's development files "
                       "(apt-get install libopenmpi-dev) and reinstall for the MPI path" % (
                           family, os.path.basename(libs["nccl"]), NCCL_ONLY))
    if family not in libs:
        raise NotFound("this installation has no library for %s (it has %s): build it where that MPI's "
                       "development files are installed" % (family, ", ".join(sorted(libs))))
    return libs[family]


# ld.so splits LD_PRELOAD on spaces and colons (ld.so(8)): a library whose
# path holds one cannot be preloaded by that path. A symlink under a safe
# temporary folder would work on this host only (mpirun's remote ranks would
# not have it) and would outlive the job (run replaces itself with COMMAND),
# so the command refuses and says how to fix it instead.
UNPRELOADABLE = {" ": "a space", ":": "a colon"}


def preload_problem(path):
    """None when ld.so can preload path through LD_PRELOAD, else why not and the fix."""
    bad = [word for ch, word in UNPRELOADABLE.items() if ch in path]
    if not bad:
        return None
    return ("the library's path %r holds %s, where LD_PRELOAD splits its list, so ld.so cannot preload it: "
            "install the package in a folder whose path has none (python3 -m venv --system-site-packages "
            "/opt/dgc && /opt/dgc/bin/pip install .), or copy the library to such a path and set "
            "DGCSHIM_LIBRARY to the copy" % (path, " and ".join(bad)))


def options_program():
    env = os.environ.get("DGCSHIM_OPTIONS")
    path = env or os.path.join(HERE, "bin", "dgcshim-options")
    if not os.path.exists(path):
        raise NotFound("no dgcshim-options at %s: install the package (pip install .) or set DGCSHIM_OPTIONS" % path)
    return path
