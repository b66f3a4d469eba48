"""`dgcshim doctor`: what will happen on this machine, one line per check,
each OK, WARN or NO with what to do. `--for ddp|horovod|mpi` exits 1 when
that path cannot work here; `--json` prints the checks as JSON."""
import argparse
import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys

from . import elf, launch, options, paths

OK, WARN, NO = "OK", "WARN", "NO"


# Where Debian's python3-torch, python3-mpi4py, ... are installed: for this
# interpreter only, which a venv sees only when made from it with
# --system-site-packages.
SYSTEM_PYTHON = "/usr/bin/python3"
INSTALL = {"torch": "pip install torch, or Debian's python3-torch",
           "mpi4py": "pip install mpi4py, or Debian's python3-mpi4py",
           "horovod": "HOROVOD_WITH_MPI=1 pip install horovod, as scripts/deps.sh horovod-torch does"}

VENV_FACTS = """import json, os, sys
cfg, system = os.path.join(sys.prefix, 'pyvenv.cfg'), None
if os.path.exists(cfg):
    for line in open(cfg):
        k, _, v = line.partition('=')
        if k.strip() == 'include-system-site-packages':
            system = v.strip().lower() == 'true'
print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'venv': sys.prefix != sys.base_prefix,
                  'system_site': system, 'base': sys.base_prefix}))"""


class Doctor:
    def __init__(self, python):
        self.python = python
        self.checks = []
        self.last_error = None
        self._interpreter = None

    def say(self, name, status, message, paths_=(), **facts):
        self.checks.append({"check": name, "status": status, "message": message, "for": list(paths_), "facts": facts})

    def probe(self, code, timeout=120, python=None):
        """Runs code in the Python asked about; its last stdout line as JSON, or
        None, with what went wrong (the error's last line) in last_error."""
        try:
            r = subprocess.run([python or self.python, "-c", code], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.last_error = "no answer in %d s" % timeout
            return None
        except OSError as e:
            self.last_error = "cannot run %s: %s" % (python or self.python, e.strerror)
            return None
        lines = r.stdout.strip().splitlines()
        errors = r.stderr.strip().splitlines()
        self.last_error = errors[-1].strip() if errors else "exit status %d" % r.returncode
        try:
            return json.loads(lines[-1]) if r.returncode == 0 and lines else None
        except ValueError:
            return None

    def interpreter(self):
        """The Python asked about: version, venv or not, whether it sees its base's site-packages."""
        if self._interpreter is None:
            self._interpreter = self.probe(VENV_FACTS, timeout=30) or {}
        return self._interpreter

    def why_not(self, module):
        """Why module does not import in the Python asked about, and what to do, in one clause."""
        error = self.last_error or "no answer"
        me = self.interpreter()
        if not me:
            return "%s (%s): pass --python a working interpreter" % (self.python, error)
        said = "%s (%s)" % (self.python, error)
        if not error.startswith("ModuleNotFoundError"):
            return "%s: it is installed but fails to import" % said
        # A venv's python links to its base's binary: the system Python itself is told by its prefix, not its path.
        elsewhere = os.path.exists(SYSTEM_PYTHON) and (me["venv"] or me["base"] != "/usr")
        system_has = elsewhere and self.probe("import importlib.util, json; print(json.dumps("
                                              "importlib.util.find_spec(%r) is not None))" % module, timeout=30,
                                              python=SYSTEM_PYTHON)
        if system_has and me["venv"] and me["base"] == "/usr" and not me["system_site"]:
            return ("%s: this venv does not see the system's site-packages, where %s has %s: make it with "
                    "`%s -m venv --system-site-packages DIR`, or pass --python %s" % (
                        said, SYSTEM_PYTHON, module, SYSTEM_PYTHON, SYSTEM_PYTHON))
        if system_has and me["base"] != "/usr":
            return ("%s: this is Python %s from %s, while %s is installed for Debian's %s: make a venv with "
                    "`%s -m venv --system-site-packages DIR`, or pass --python %s" % (
                        said, me["version"], me["base"], module, SYSTEM_PYTHON, SYSTEM_PYTHON, SYSTEM_PYTHON))
        return "%s: install it (%s), or pass --python a Python that has it" % (said, INSTALL.get(module, module))


def check_library(d):
    libs = paths.libraries()
    if not libs:
        d.say("library", NO, "no libdgcshim.so installed with this package: pip install . (or set DGCSHIM_LIBRARY)",
              ("ddp", "horovod", "mpi"))
        return {}
    infos = {}
    for family, path in sorted(libs.items()):
        info = elf.build_info(path) or {}
        infos[family] = (path, info)
        fronts = paths.front_ends(info)
        gpu = ("CUDA for sm_%s (toolkit %s), NCCL front end built in" %
               (info.get("cuda_architectures", "?").replace(";", ", sm_"), info.get("cuda_toolkit", "?"))
               if info.get("nccl_front_end") else "CPU only: the MPI path (no NCCL front end)")
        problem = paths.preload_problem(path)
        if problem:
            d.say("library", NO, problem, ("ddp", "horovod", "mpi"), path=path, build=info, front_ends=fronts)
            continue
        if "MPI" in fronts:
            what = "front ends: %s; for %s (MPI %s), %s" % (" and ".join(fronts), info.get("mpi_family", "?"),
                                                           info.get("mpi_standard", "?"), gpu)
        else:
            what = "front ends: NCCL only (built without MPI); CUDA for sm_%s (toolkit %s)" % (
                info.get("cuda_architectures", "?").replace(";", ", sm_"),
                info.get("cuda_toolkit", "?"))
        d.say("library", OK if info else WARN, "%s: version %s, %s%s" % (
            path, info.get("version", "?"), what,
            ", sanitizers" if info.get("sanitize") else ""), (), path=path, build=info, front_ends=fronts)
    return infos


def check_engine(d):
    v = options.engine()
    d.say("host engine", OK if v else WARN, "variant %s on this CPU" % v if v else "dgcshim-options engine failed",
          variant=v)


def resolves(lib):
    """{needed name: path or None} as the dynamic loader finds them (ldd)."""
    try:
        out = subprocess.run(["ldd", lib], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.splitlines():
        parts = line.split("=>")
        if len(parts) == 2:
            where = parts[1].strip().split(" (")[0].strip()
            found[parts[0].strip()] = None if where.startswith("not found") else where
    return found


def check_mpi(d, infos):
    if infos and not [f for f in infos if f != "nccl"]:
        path = infos["nccl"][0]
        d.say("MPI front end", NO, "%s has no MPI front end: %s; install MPI's development files (apt-get install "
              "libopenmpi-dev) and reinstall for the MPI path" % (os.path.basename(path), paths.NCCL_ONLY),
              ("mpi", "horovod"), path=path)
    infos = {f: v for f, v in infos.items() if f != "nccl"}
    launcher_family = None
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun:
        text = launch.version_text(mpirun)
        launcher_family = launch.mpi_family_of_version(text)
        first = text.strip().splitlines()[0] if text.strip() else "?"
        d.say("mpirun", OK if launcher_family else WARN, "%s: %s (%s family)" % (
            mpirun, first, launcher_family or "unknown"), (), path=mpirun, family=launcher_family)
    else:
        d.say("mpirun", WARN, "no mpirun or mpiexec on PATH: the MPI path needs an MPI launcher "
              "(apt-get install openmpi-bin)", ("mpi", "horovod"))
    usable = False
    for family, (path, info) in sorted(infos.items()):
        needed = [n for n in (elf.needed(path) or []) if n.startswith("libmpi")]
        where = resolves(path)
        missing = [n for n in needed if not where.get(n)]
        if missing:
            d.say("MPI library", NO, "%s needs %s, which the loader does not find: install %s's runtime" % (
                os.path.basename(path), ", ".join(missing), family), ("mpi", "horovod"))
            continue
        d.say("MPI library", OK, "%s loads %s" % (os.path.basename(path), ", ".join(
            "%s (%s)" % (n, where.get(n)) for n in needed)), (), family=family, needed=needed)
        usable = usable or launcher_family in (None, family)
    if launcher_family and infos and launcher_family not in infos:
        d.say("MPI family", NO, "mpirun is %s's but this installation has only a library for %s: the ABIs differ, "
              "so the shim would never see the ranks' MPI calls; install %s's development files and reinstall" % (
                  launcher_family, ", ".join(sorted(infos)), launcher_family), ("mpi", "horovod"))
    elif launcher_family and infos:
        d.say("MPI family", OK, "mpirun and the library agree (%s); `dgcshim run` picks it for mpirun" %
              launcher_family, ())
    mpi4py = d.probe("import json; from mpi4py import MPI; print(json.dumps(MPI.Get_library_version().strip('\\0 \\n')"
                     ".splitlines()[0]))", timeout=60)
    if mpi4py:
        fam = launch.mpi_family_of_version(mpi4py)
        status = OK if fam in infos else WARN
        d.say("mpi4py", status, "loads %s%s" % (mpi4py, "" if status == OK else
                                                ": no library of this installation is built for it"), (),
              library_version=mpi4py)
    else:
        # Not needed by the MPI path as such (C, Fortran, Horovod call MPI themselves): no path is blocked.
        d.say("mpi4py", WARN, "not importable by %s; Python programs that call MPI through mpi4py need it" %
              d.why_not("mpi4py"), ())
    return usable


def so_in(directory, pattern):
    hits = sorted(glob.glob(os.path.join(directory, pattern)))
    return hits[0] if hits else None


def check_torch(d):
    info = d.probe("import json, os, torch; c = torch.version.cuda; n = None\n"
                   "try:\n    n = '.'.join(map(str, torch.cuda.nccl.version())) if c else None\n"
                   "except Exception:\n    pass\n"
                   "print(json.dumps({'version': torch.__version__, 'cuda': c, 'nccl': n, "
                   "'lib': os.path.join(os.path.dirname(torch.__file__), 'lib'), "
                   "'mpi': torch.distributed.is_mpi_available(), 'gpus': torch.cuda.device_count() if c else 0}))")
    if info is None:
        d.say("PyTorch", WARN, "not importable by %s; nothing to check for DDP" % d.why_not("torch"), ("ddp",))
        return
    if not info["cuda"]:
        d.say("PyTorch", NO, "%s is a CPU-only build: no NCCL, so DDP's gradients never reach ncclAllReduce here%s" % (
            info["version"], "; torch.distributed's mpi backend calls MPI_Allreduce, which the shim compresses"
            if info["mpi"] else " (its gloo backend is not intercepted)"), ("ddp",), **info)
        return
    lib = so_in(info["lib"], "libtorch_cuda*.so")
    need = elf.needed(lib) or [] if lib else []
    dynamic = [n for n in need if n.startswith("libnccl")]
    if dynamic:
        d.say("PyTorch", OK, "%s (CUDA %s) loads %s dynamically (NCCL %s): the shim can intercept DDP's "
              "ncclAllReduce" % (info["version"], info["cuda"], dynamic[0], info["nccl"]), (), **info)
    else:
        d.say("PyTorch", NO, "%s (CUDA %s) links NCCL %s statically (libtorch_cuda.so needs no libnccl, as in "
              "conda's builds): nothing can intercept it; use the pip wheels, whose libtorch_cuda.so needs "
              "libnccl.so.2" % (info["version"], info["cuda"], info["nccl"]), ("ddp",), **info)


def check_horovod(d):
    info = d.probe(
        "import json, importlib, os, warnings\nwarnings.simplefilter('ignore')\nimport horovod\nout = "
        "{'version': horovod.__version__, 'frameworks': {}}\n"
        "for fw in ('horovod.torch', 'horovod.tensorflow'):\n"
        "    try:\n        m = importlib.import_module(fw)\n        if not hasattr(m, 'DistributedOptimizer'): continue\n"
        "        out['frameworks'][fw] = {'mpi': bool(m.mpi_built()), 'nccl': bool(m.nccl_built()), "
        "'dir': os.path.dirname(m.__file__)}\n    except Exception:\n        pass\n"
        "print(json.dumps(out))", timeout=180)
    if info is None:
        d.say("Horovod", WARN, "not importable by %s; nothing to check" % d.why_not("horovod"), ("horovod",))
        return
    if not info["frameworks"]:
        d.say("Horovod", NO, "%s has no framework built in (horovod.torch and horovod.tensorflow are empty)" %
              info["version"], ("horovod",), **info)
        return
    for fw, f in sorted(info["frameworks"].items()):
        if not f["mpi"]:
            d.say("Horovod", NO, "%s %s was built without MPI (gloo only): rebuild with HOROVOD_WITH_MPI=1" % (
                fw, info["version"]), ("horovod",), **f)
            continue
        msg = "%s %s built with MPI: CPU tensors' MPI_Allreduce is compressed (give it groups=1: " \
              "dgcshim run --horovod-groups1)" % (fw, info["version"])
        if f["nccl"]:
            ext = so_in(f["dir"], "mpi_lib*.so")
            dyn = [n for n in (elf.needed(ext) or []) if n.startswith("libnccl")] if ext else []
            msg += "; GPU tensors go by NCCL, %s" % ("linked dynamically (%s): interceptable" % dyn[0] if dyn else
                                                     "linked statically: not interceptable "
                                                     "(rebuild with HOROVOD_NCCL_LINK=SHARED)")
        d.say("Horovod", OK, msg, (), framework=fw, **f)


def check_tensorflow(d):
    info = d.probe("import json, os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\nimport tensorflow as tf\n"
                   "b = tf.sysconfig.get_build_info()\nprint(json.dumps({'version': tf.__version__, "
                   "'cuda': b.get('cuda_version'), 'is_cuda_build': bool(b.get('is_cuda_build'))}))", timeout=180)
    if info is None:
        return  # not installed: nothing to say
    if not info["is_cuda_build"]:
        d.say("TensorFlow", OK, "%s, CPU only: no NCCL; with Horovod its gradients go by MPI_Allreduce" %
              info["version"], (), **info)
        return
    major_minor = tuple(int(x) for x in info["version"].split(".")[:2])
    if major_minor >= (2, 20):
        d.say("TensorFlow", OK, "%s (CUDA %s) loads NCCL from its own nvidia-nccl package: interceptable" % (
            info["version"], info["cuda"]), (), **info)
    else:
        d.say("TensorFlow", WARN, "%s (CUDA %s) links NCCL statically (before 2.20): its NCCL collectives cannot "
              "be intercepted; Horovod over MPI still can" % (info["version"], info["cuda"]), (), **info)


def driver_version():
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    return v.value


def check_gpu(d, infos):
    gpu_libs = [info for _, info in infos.values() if info.get("nccl_front_end")]
    v = driver_version()
    if v is None:
        mpi = any(family != "nccl" for family in infos)
        d.say("GPU", NO, "no GPU driver (libcuda.so.1 does not load): no GPU here, so the NCCL path cannot run%s" % (
            "; the MPI path is unaffected" if mpi or not infos else ""), ("ddp",))
        return
    have = "%d.%d" % (v // 1000, v % 1000 // 10)
    if not gpu_libs:
        d.say("GPU", WARN, "driver for CUDA %s, but the library was built without the NCCL front end (nvcc or "
              "nccl.h was missing at build time)" % have, ("ddp",), driver_cuda=have)
        return
    toolkit = gpu_libs[0].get("cuda_toolkit", "0")
    want = tuple(int(x) for x in toolkit.split(".")[:2])
    if (v // 1000, v % 1000 // 10) < want:
        d.say("GPU", NO, "the driver supports CUDA %s but the library's runtime is CUDA %s: update the driver (CUDA "
              "13 needs R580 or newer) or build against an older toolkit" % (have, toolkit), ("ddp",),
              driver_cuda=have)
    else:
        d.say("GPU", OK, "driver for CUDA %s, library's runtime CUDA %s" % (have, toolkit), (), driver_cuda=have)


def main(argv):
    p = argparse.ArgumentParser(prog="dgcshim doctor", description=__doc__)
    p.add_argument("--for", dest="path", choices=("ddp", "horovod", "mpi"),
                   help="exit 1 when this path cannot work here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--python", default=sys.executable, help="the Python whose frameworks to check (default: this one)")
    args = p.parse_args(argv)
    d = Doctor(args.python)
    infos = check_library(d)
    check_engine(d)
    check_mpi(d, infos)
    check_torch(d)
    check_horovod(d)
    check_tensorflow(d)
    check_gpu(d, infos)
    needed = [c for c in d.checks if args.path in c["for"]] if args.path else []
    blocked = [c for c in needed if c["status"] == NO]
    unsure = [c for c in needed if c["status"] == WARN]
    if args.json:
        print(json.dumps({"checks": d.checks, "for": args.path,
                          "works": not (blocked or unsure) if args.path else None}, indent=1, default=str))
    else:
        for c in d.checks:
            print("%-4s %-12s %s" % (c["status"], c["check"], c["message"]))
        if args.path:
            print("%s: %s" % (args.path, verdict(blocked, unsure)))
    return 1 if blocked or unsure else 0


def verdict(blocked, unsure):
    """The last line of --for: "should work" only when every check the path needs said OK."""
    names = lambda cs: ", ".join(sorted(set(c["check"] for c in cs)))
    if blocked:
        return "cannot work here (the NO lines above: %s)" % names(blocked)
    if unsure:
        return "not shown to work here (the WARN lines above: %s)" % names(unsure)
    return "should work here (every check it needs said OK)"
