"""The `dgcshim` command: run, doctor, config, report."""
import argparse
import json
import os
import shlex
import sys

from . import __version__, launch, options, paths

USAGE = """dgcshim run [SETTINGS] [--horovod-groups1] [--verbose] -- COMMAND ...
       dgcshim doctor [--for ddp|horovod|mpi] [--json] [--python PATH]
       dgcshim config [--json]
       dgcshim report FILE... [--plot OUT.png]
       dgcshim lib [--mpich]"""


def err(msg):
    print("dgcshim: " + msg, file=sys.stderr)


def add_setting_flags(p, table):
    g = p.add_argument_group("settings (each sets its DGC_* variable; `dgcshim config` lists them)")
    for o in table:
        text = "%s: %s (default %s; %s)" % (o["name"], o["summary"], o["default"] or "unset", o["range"])
        kw = {"metavar": "V", "dest": o["name"], "help": text.replace("%", "%%")}  # argparse formats help with %
        if o["range"] == "0 or 1":
            kw.update(nargs="?", const="1", metavar="0|1")
        g.add_argument(options.flag_of(o["name"]), **kw)


def preloadable_library(family):
    """The installed library of the MPI family (None: the default), or None after saying in one line why there is
    none, or why ld.so could not preload it (a space or a colon in its path)."""
    try:
        lib = paths.library(family)
    except paths.NotFound as e:
        err(str(e))
        return None
    problem = paths.preload_problem(lib)
    if problem:
        err(problem)
        return None
    return lib


def cmd_run(argv):
    try:
        table = options.table()
    except (paths.NotFound, OSError) as e:
        err(str(e))
        return 2
    p = argparse.ArgumentParser(prog="dgcshim run", usage="dgcshim run [SETTINGS] [--horovod-groups1] -- COMMAND ...",
                                description="Runs COMMAND with libdgcshim.so preloaded on every rank and the given "
                                "settings; exits with COMMAND's status.")
    add_setting_flags(p, table)
    p.add_argument("--horovod-groups1", action="store_true",
                   help="run each Python rank's script through horovod_groups1.py (groups=1 in "
                   "hvd.DistributedOptimizer, script unmodified)")
    p.add_argument("--mpi", choices=("openmpi", "mpich"),
                   help="the MPI family of the library to preload when the launcher does not say (default: the "
                   "launcher's; else Open MPI's where installed)")
    p.add_argument("--verbose", "-v", action="store_true", help="say how the settings reach the ranks")
    if "--" not in argv:
        _, rest = p.parse_known_args(argv)  # --help, or an error for a bad value, first
        p.error("COMMAND goes after --: dgcshim run [SETTINGS] -- COMMAND ...%s" % (
            " (not after --: %s)" % " ".join(rest) if rest else ""))
    at = argv.index("--")
    args, command = p.parse_args(argv[:at]), argv[at + 1:]
    if not command:
        p.error("no COMMAND after --")

    env = dict(os.environ)
    for o in table:
        v = getattr(args, o["name"])
        if v is not None:
            env[o["name"]] = v
    problem = options.check(env)
    if problem:
        err(problem)
        return 2
    kind, why = launch.launcher(command[0])
    family = {"openmpi": "openmpi", "hydra": "mpich"}.get(kind) or args.mpi
    lib = preloadable_library(family)
    if lib is None:
        return 2
    preload = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    names = sorted(k for k in env if k.startswith("DGC_"))
    if args.horovod_groups1:
        try:
            command = launch.with_groups1(command)
        except launch.Refused as e:
            err(str(e))
            return 2
    if kind == "environment":
        env["LD_PRELOAD"] = preload
    else:
        command = launch.with_exports(command, kind, [("LD_PRELOAD", preload)] + [(k, env[k]) for k in names])
    if args.verbose:
        how = {"openmpi": "-x in each of %d app context(s)" % len(launch.contexts(command)),
               "hydra": "-genv", "environment": "the environment"}[kind]
        err("run: %s; LD_PRELOAD and %d DGC_* variable(s) by %s" % (why, len(names), how))
        err("run: library %s" % lib)
        err("run: " + " ".join(shlex.quote(a) for a in command))
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        err("cannot run %s: %s" % (command[0], e.strerror))
        return 127


def cmd_config(argv):
    p = argparse.ArgumentParser(prog="dgcshim config", description="Every DGC_* variable: its value here, its "
                                "default, its range and its meaning, from the library's own option table.")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        table = options.table()
    except (paths.NotFound, OSError) as e:
        err(str(e))
        return 2
    for o in table:
        o["value"] = os.environ.get(o["name"])
        o["flag"] = options.flag_of(o["name"])
    problem = options.check(dict(os.environ))
    if args.json:
        print(json.dumps({"variables": table, "valid": problem is None, "problem": problem}, indent=1))
        return 0 if problem is None else 2
    w = max(len(o["name"]) for o in table)
    for o in table:
        value = o["value"] if o["value"] is not None else "(unset)"
        print("%-*s  %-10s default %-6s %s" % (w, o["name"], value, o["default"] or "unset", o["range"]))
        print("%-*s  %s%s" % (w, "", o["summary"], " (all ranks must agree)" if o["all_ranks"] else ""))
    if problem:
        err(problem)
        return 2
    return 0


def cmd_lib(argv):
    p = argparse.ArgumentParser(prog="dgcshim lib", description="Prints the installed library's absolute path, "
                                "for an LD_PRELOAD written by hand: mpirun -x LD_PRELOAD=$(dgcshim lib) ...")
    p.add_argument("--mpi", choices=("openmpi", "mpich"), help="the MPI family's library (default: Open MPI's "
                   "where installed)")
    p.add_argument("--mpich", dest="mpi", action="store_const", const="mpich", help="the same as --mpi mpich")
    args = p.parse_args(argv)
    lib = preloadable_library(args.mpi)
    if lib is None:
        return 2
    print(lib)
    return 0


def main(argv=None):
    try:
        rc = dispatch(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe's error would escape this handler
        return rc
    except BrokenPipeError:
        # The reader went away (dgcshim config | head): not an error of ours.
        # Output to nowhere from here on, so that the exit's flush is quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a program killed by SIGPIPE, which the shell reports so


def dispatch(argv):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--version":
        print("dgcshim", __version__)
        return 0
    sub, rest = argv[0], argv[1:]
    if sub == "run":
        return cmd_run(rest)
    if sub == "config":
        return cmd_config(rest)
    if sub == "doctor":
        from . import doctor
        return doctor.main(rest)
    if sub == "report":
        from . import report
        return report.main(rest)
    if sub == "lib":
        return cmd_lib(rest)
    err("unknown command %r\n%s" % (sub, USAGE))
    return 2
