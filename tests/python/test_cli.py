"""The `dgcshim` command as a user meets it, after `pip install .` into a
venv (scripts/test-python.sh makes it and names it in DGC_TEST_VENV; the
CMake build the LD_PRELOAD form comes from is DGC_TEST_BUILD). Real mpirun,
real Fashion-MNIST, real Horovod: nothing is faked."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV = os.environ.get("DGC_TEST_VENV")
BUILD = os.environ.get("DGC_TEST_BUILD", os.path.join(ROOT, "build"))
DGCSHIM = os.path.join(VENV, "bin", "dgcshim") if VENV else None
TRAINER = os.path.join(BUILD, "ld_preload_examples", "mlp_trainer")
HOROVOD_TF = os.path.join(ROOT, ".venv", "horovod-tf", "bin", "python")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader"]
# 2 epochs of 1/4 of Fashion-MNIST: 4 ranks, 117 steps an epoch, the warm-up of the command in steps
TRAIN = ["--epochs", "2", "--train-limit", "15000"]


def sh(cmd, env=None, timeout=600, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d\nstdout:\n%s\nstderr:\n%s" % (" ".join(cmd), r.returncode,
                                                                        r.stdout[-4000:], r.stderr[-4000:]))
    return r


def clean_env(**extra):
    """This environment without the shim's variables, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGC_") and k not in ("LD_PRELOAD",)}
    env.update(extra)
    return env


def stats_lines(text):
    """The STATS lines of rank 0's exit report, without the log prefix."""
    return [line.split(" dgcshim STATS ", 1)[1] for line in text.splitlines() if " dgcshim STATS " in line]


def final_line(text):
    line = [l for l in text.splitlines() if l.startswith("final ")][-1]
    return re.sub(r" (wall_s|comm_s|compute_s) \S+", "", line)  # timings differ from run to run


@unittest.skipUnless(VENV, "DGC_TEST_VENV unset: run through scripts/test-python.sh")
class Run(unittest.TestCase):
    def test_same_bits_as_the_ld_preload_form(self):
        """dgcshim run --sparsity 0.999 --warmup-steps 468 --momentum 0.9 -- mpirun -np 4 mlp_trainer gives
        the accuracy and bytes of the demo's LD_PRELOAD form, bit for bit."""
        by_hand = sh(MPIRUN + ["-x", "LD_PRELOAD=" + os.path.join(BUILD, "libdgcshim.so"), "-x", "DGC_SPARSITY=0.999",
                               "-x", "DGC_WARMUP_STEPS=468", "-x", "DGC_MOMENTUM=0.9", "-x", "DGC_STATS=1",
                               "-np", "4", TRAINER] + TRAIN, env=clean_env())
        by_tool = sh([DGCSHIM, "run", "--sparsity", "0.999", "--warmup-steps", "468", "--momentum", "0.9", "--stats",
                      "--"] + MPIRUN + ["-np", "4", TRAINER] + TRAIN, env=clean_env())
        self.assertIn("weights_identical 1", by_tool.stdout)
        self.assertEqual(final_line(by_tool.stdout), final_line(by_hand.stdout))
        hand, tool = stats_lines(by_hand.stderr), stats_lines(by_tool.stderr)
        self.assertTrue(hand and re.search(r"\b669706\s+234\b", hand[1]), hand)
        # engine_ms is a timing: the bytes, calls and ratios must be equal
        strip = lambda rows: [re.sub(r"^0x[0-9a-f]+", "BUF", re.sub(r" +\d+\.\d{3} +(\S+ +s\d+/d\d+)$", r" \1", r))
                              for r in rows]  # addresses (ASLR) and engine_ms (a timing) differ
        self.assertEqual(strip(tool), strip(hand))

    def test_mpmd_line_has_the_shim_on_every_rank(self):
        """An MPMD line (a : b) under dgcshim run: every rank of both app contexts writes its statistics."""
        with tempfile.TemporaryDirectory() as d:
            stem = os.path.join(d, "stats")
            r = sh([DGCSHIM, "run", "--stats", "--stats-file", stem, "--"] + MPIRUN +
                   ["-np", "2", TRAINER, "--epochs", "1", "--train-limit", "4000", ":",
                    "-np", "2", TRAINER, "--epochs", "1", "--train-limit", "4000"], env=clean_env())
            steps = int(re.search(r"\bsteps (\d+)", final_line(r.stdout)).group(1))
            self.assertEqual(sorted(os.listdir(d)), ["stats.%d" % i for i in range(4)])
            for i in range(4):
                with open("%s.%d" % (stem, i)) as f:
                    last = json.loads(f.read().splitlines()[-1])
                self.assertEqual((last["rank"], last["event"]), (i, "exit"))
                self.assertEqual([b["calls"] for b in last["buffers"]], [steps], "rank %d" % i)
            report = [l for l in stats_lines(r.stderr) if l.startswith("pass-through")]
            self.assertIn("compressed calls %d," % steps, report[0])

    def test_bad_value_refused_before_the_launcher_starts(self):
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            for flags, env, name in ((["--sparsity", "1.5"], {}, "DGC_SPARSITY"),
                                     (["--warmup-steps", "-3"], {}, "DGC_WARMUP_STEPS"),
                                     ([], {"DGC_TRANSPORT": "carrier-pigeon"}, "DGC_TRANSPORT")):
                r = sh([DGCSHIM, "run"] + flags + ["--", "sh", "-c", "touch " + marker],
                       env=clean_env(**env), check=False)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("invalid %s=" % name, r.stderr)
                self.assertIn("accepted", r.stderr)
                self.assertFalse(os.path.exists(marker), "the command ran despite %s" % name)

    def test_unknown_name_refused_before_the_launcher_starts(self):
        """A misspelt DGC_* name stops run with the library's message and the closest name; the names the
        project's scripts reserve (DGC_TEST_*) pass."""
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            r = sh([DGCSHIM, "run", "--", "sh", "-c", "touch " + marker], env=clean_env(DGC_SPARSTY="0.99"),
                   check=False)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("unknown variable DGC_SPARSTY, did you mean DGC_SPARSITY?", r.stderr)
            self.assertFalse(os.path.exists(marker))
            sh([DGCSHIM, "run", "--", "sh", "-c", "touch " + marker], env=clean_env(DGC_TEST_ANYTHING="1"))
            self.assertTrue(os.path.exists(marker))

    def test_unpreloadable_library_path_refused(self):
        """A library path with a space or a colon, which LD_PRELOAD splits on, is refused with the path and the
        fix, before the command starts."""
        lib = sh([DGCSHIM, "lib"], env=clean_env()).stdout.strip()
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            for folder in ("with space", "with:colon"):
                copy = os.path.join(d, folder, "libdgcshim.so")
                os.makedirs(os.path.dirname(copy))
                shutil.copy(lib, copy)
                r = sh([DGCSHIM, "run", "--", "sh", "-c", "touch " + marker], env=clean_env(DGCSHIM_LIBRARY=copy),
                       check=False)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(repr(copy), r.stderr)
                self.assertIn("ld.so cannot preload it", r.stderr)
                self.assertIn("DGCSHIM_LIBRARY", r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertFalse(os.path.exists(marker), folder)
                r = sh([DGCSHIM, "lib"], env=clean_env(DGCSHIM_LIBRARY=copy), check=False)
                self.assertEqual((r.returncode, r.stdout), (2, ""), folder)

    def test_exit_status_and_preload_order(self):
        """COMMAND's exit status comes back; the shim goes in front of an LD_PRELOAD already set."""
        r = sh([DGCSHIM, "run", "--", "sh", "-c", 'echo "$LD_PRELOAD"; exit 7'],
               env=clean_env(LD_PRELOAD="libother.so"), check=False)
        self.assertEqual(r.returncode, 7)
        first, second = r.stdout.strip().split(":")
        self.assertTrue(first.endswith("/dgcshim/lib/libdgcshim.so") and second == "libother.so", r.stdout)

    def test_help(self):
        """Each subcommand's --help prints and exits 0; run's lists a flag for every variable."""
        for sub in ("run", "doctor", "config", "report", "lib"):
            r = sh([DGCSHIM, sub, "--help"], env=clean_env())
            self.assertIn("usage:", r.stdout)
        out = sh([DGCSHIM, "run", "--help"], env=clean_env()).stdout
        for flag in ("--sparsity", "--warmup-steps", "--momentum", "--stats-file", "--stats-every", "--nccl-library"):
            self.assertIn(flag, out)
        self.assertEqual(sh([DGCSHIM], env=clean_env(), check=False).returncode, 2)

    def test_verbose_names_the_way(self):
        r = sh([DGCSHIM, "run", "-v", "--sparsity", "0.99", "--"] + MPIRUN + ["-np", "1", "true", ":", "-np", "1",
                                                                             "true"], env=clean_env())
        self.assertIn("Open MPI", r.stderr)
        self.assertIn("-x in each of 2 app context(s)", r.stderr)
        r = sh([DGCSHIM, "run", "-v", "--", "true"], env=clean_env())
        self.assertIn("by the environment", r.stderr)

    @unittest.skipUnless(shutil.which("mpiexec.mpich") and os.path.exists(TRAINER.replace(BUILD, BUILD + "-mpich")),
                         "no mpiexec.mpich or no build-mpich (DGC_TEST_MPICH=0)")
    def test_hydra_gets_genv_and_the_mpich_library(self):
        """Under MPICH's hydra the package's libdgcshim-mpich.so goes by -genv, and reaches both ranks."""
        with tempfile.TemporaryDirectory() as d:
            stem = os.path.join(d, "s")
            r = sh([DGCSHIM, "run", "-v", "--stats-file", stem, "--", "mpiexec.mpich", "-n", "2",
                    TRAINER.replace(BUILD, BUILD + "-mpich"), "--epochs", "1", "--train-limit", "2000"],
                   env=clean_env())
            self.assertIn("-genv LD_PRELOAD", r.stderr)
            self.assertIn("libdgcshim-mpich.so", r.stderr)
            for i in range(2):
                with open("%s.%d" % (stem, i)) as f:
                    last = json.loads(f.read().splitlines()[-1])
                self.assertGreater(last["buffers"][0]["calls"], 0, "rank %d" % i)


@unittest.skipUnless(VENV, "DGC_TEST_VENV unset: run through scripts/test-python.sh")
class Doctor(unittest.TestCase):
    def test_this_machine(self):
        r = sh([DGCSHIM, "doctor", "--json"], env=clean_env())
        checks = json.loads(r.stdout)["checks"]
        by = {}
        for c in checks:
            by.setdefault(c["check"], []).append(c)
        self.assertTrue(all(c["status"] == "OK" for c in by["library"]), by["library"])
        self.assertEqual([c["status"] for c in by["MPI family"]], ["OK"])
        self.assertTrue(by["MPI library"] and all(c["status"] == "OK" for c in by["MPI library"]))
        torch = by["PyTorch"][0]  # Debian's: CPU only
        self.assertEqual(torch["status"], "NO")
        self.assertIn("no NCCL", torch["message"])
        self.assertIsNone(torch["facts"]["cuda"])
        self.assertEqual(by["GPU"][0]["status"], "NO")
        self.assertIn("no GPU", by["GPU"][0]["message"])
        self.assertIn(by["host engine"][0]["facts"]["variant"], ("avx512", "avx2", "generic"))

    def test_for_paths(self):
        self.assertEqual(sh([DGCSHIM, "doctor", "--for", "mpi"], env=clean_env(), check=False).returncode, 0)
        r = sh([DGCSHIM, "doctor", "--for", "ddp"], env=clean_env(), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("ddp: cannot work here", r.stdout)

    def test_mpi4py_reported(self):
        """The venv sees Debian's mpi4py: its line says which MPI it loads."""
        checks = json.loads(sh([DGCSHIM, "doctor", "--json"], env=clean_env()).stdout)["checks"]
        mpi4py = [c for c in checks if c["check"] == "mpi4py"]
        self.assertEqual([c["status"] for c in mpi4py], ["OK"], mpi4py)
        self.assertIn("Open MPI", mpi4py[0]["message"])

    def test_says_why_a_package_does_not_import(self):
        """A venv made without --system-site-packages: PyTorch and mpi4py are not importable, and doctor says
        why (it cannot see the system's site-packages, where /usr/bin/python3 has them) and what to do."""
        with tempfile.TemporaryDirectory() as d:
            sh(["/usr/bin/python3", "-m", "venv", "--without-pip", os.path.join(d, "bare")])
            python = os.path.join(d, "bare", "bin", "python")
            checks = json.loads(sh([DGCSHIM, "doctor", "--json", "--python", python], env=clean_env()).stdout)["checks"]
            by = {c["check"]: c for c in checks}
            for name, module in (("PyTorch", "torch"), ("mpi4py", "mpi4py")):
                c = by[name]
                self.assertEqual(c["status"], "WARN", c)
                self.assertIn("No module named '%s'" % module, c["message"])
                self.assertIn("does not see the system's site-packages", c["message"])
                self.assertIn("--system-site-packages", c["message"])
                self.assertIn("--python /usr/bin/python3", c["message"])
            self.assertIn("install it", by["Horovod"]["message"])  # Debian's python3 has no Horovod either

    def test_never_should_work_under_a_failed_check(self):
        """--for X says "should work here" (and exits 0) only when every check X needs said OK: Horovod not
        importable (the bare venv) is not shown to work."""
        with tempfile.TemporaryDirectory() as d:
            sh(["/usr/bin/python3", "-m", "venv", "--without-pip", os.path.join(d, "bare")])
            python = os.path.join(d, "bare", "bin", "python")
            r = sh([DGCSHIM, "doctor", "--for", "horovod", "--python", python], env=clean_env(), check=False)
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("WARN Horovod", r.stdout)
            self.assertIn("horovod: not shown to work here (the WARN lines above: Horovod)", r.stdout)
            self.assertNotIn("should work", r.stdout)
            for path in ("ddp", "horovod", "mpi"):
                j = sh([DGCSHIM, "doctor", "--json", "--for", path, "--python", python], env=clean_env(), check=False)
                out = json.loads(j.stdout)
                ok = all(c["status"] == "OK" for c in out["checks"] if path in c["for"])
                self.assertEqual((out["works"], j.returncode), (ok, 0 if ok else 1), path)

    def test_unpreloadable_library_is_flagged(self):
        lib = sh([DGCSHIM, "lib"], env=clean_env()).stdout.strip()
        with tempfile.TemporaryDirectory() as d:
            copy = os.path.join(d, "a b", "libdgcshim.so")
            os.makedirs(os.path.dirname(copy))
            shutil.copy(lib, copy)
            r = sh([DGCSHIM, "doctor", "--for", "mpi"], env=clean_env(DGCSHIM_LIBRARY=copy), check=False)
            self.assertEqual(r.returncode, 1)
            self.assertRegex(r.stdout, r"(?m)^NO   library +the library's path '.*/a b/libdgcshim.so' holds a space")
            self.assertIn("mpi: cannot work here (the NO lines above: library)", r.stdout)

    @unittest.skipIf(os.environ.get("DGC_TEST_HOROVOD") == "0" or not os.path.exists(HOROVOD_TF),
                     "no .venv/horovod-tf (DGC_TEST_HOROVOD=0, or scripts/deps.sh horovod-tf not run)")
    def test_horovod_tensorflow(self):
        r = sh([DGCSHIM, "doctor", "--json", "--for", "horovod", "--python", HOROVOD_TF], env=clean_env())
        checks = json.loads(r.stdout)["checks"]
        hvd = [c for c in checks if c["check"] == "Horovod"]
        self.assertEqual([c["facts"]["framework"] for c in hvd], ["horovod.tensorflow"])
        self.assertTrue(hvd[0]["facts"]["mpi"])
        self.assertEqual([c["status"] for c in checks if c["check"] == "TensorFlow"], ["OK"])


@unittest.skipUnless(VENV, "DGC_TEST_VENV unset: run through scripts/test-python.sh")
class Config(unittest.TestCase):
    def test_lists_exactly_the_library_variables(self):
        """The names, defaults and ranges of the option table in shim/core/config.c, read here from the source."""
        with open(os.path.join(ROOT, "shim", "core", "config.c")) as f:
            src = f.read()
        rows = re.findall(r'\[DGC_OPT_\w+\] = \{\s*"(DGC_\w+)",\s*KIND_\w+,\s*"([^"]*)",[^"]*"([^"]*)"', src)
        self.assertGreater(len(rows), 15)
        out = json.loads(sh([DGCSHIM, "config", "--json"], env=clean_env()).stdout)
        got = [(v["name"], v["default"], v["range"]) for v in out["variables"]]
        self.assertEqual(got, rows)
        self.assertTrue(all(v["summary"] for v in out["variables"]))

    def test_values_here(self):
        out = json.loads(sh([DGCSHIM, "config", "--json"], env=clean_env(DGC_SPARSITY="0.99")).stdout)
        v = {x["name"]: x["value"] for x in out["variables"]}
        self.assertEqual((v["DGC_SPARSITY"], v["DGC_MOMENTUM"]), ("0.99", None))
        r = sh([DGCSHIM, "config"], env=clean_env(DGC_SPARSITY="7"), check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("invalid DGC_SPARSITY='7'", r.stderr)

    def test_unknown_name_flagged(self):
        r = sh([DGCSHIM, "config"], env=clean_env(DGC_MOMENTM="0.9"), check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("dgcshim: unknown variable DGC_MOMENTM, did you mean DGC_MOMENTUM?", r.stderr)
        r = sh([DGCSHIM, "config", "--json"], env=clean_env(DGC_MOMENTM="0.9"), check=False)
        out = json.loads(r.stdout)
        self.assertEqual((r.returncode, out["valid"]), (2, False))
        self.assertIn("did you mean DGC_MOMENTUM?", out["problem"])

    def test_a_closed_pipe_is_no_traceback(self):
        """dgcshim config | head: the reader gone before the output is written is no error of the user's."""
        read, write = os.pipe()
        os.close(read)  # a reader that has already gone
        try:
            r = subprocess.run([DGCSHIM, "config"], stdout=write, stderr=subprocess.PIPE, text=True,
                               env=clean_env(), timeout=60)
        finally:
            os.close(write)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual((r.returncode, r.stderr), (141, ""))


@unittest.skipUnless(VENV, "DGC_TEST_VENV unset: run through scripts/test-python.sh")
class Lib(unittest.TestCase):
    def test_prints_the_library_run_preloads(self):
        lib = sh([DGCSHIM, "lib"], env=clean_env()).stdout
        self.assertTrue(lib.endswith("/dgcshim/lib/libdgcshim.so\n") and os.path.isabs(lib), lib)
        self.assertTrue(os.path.isfile(lib.strip()))
        preload = sh([DGCSHIM, "run", "--", "sh", "-c", 'echo "$LD_PRELOAD"'], env=clean_env()).stdout
        self.assertEqual(preload, lib)
        mpich = os.path.join(os.path.dirname(lib.strip()), "libdgcshim-mpich.so")
        r = sh([DGCSHIM, "lib", "--mpich"], env=clean_env(), check=False)
        if os.path.exists(mpich):
            self.assertEqual((r.returncode, r.stdout), (0, mpich + "\n"))
        else:
            self.assertEqual(r.returncode, 2)
            self.assertIn("no library for mpich", r.stderr)


NCCL_ONLY = os.environ.get("DGC_TEST_NCCL_ONLY")


@unittest.skipUnless(VENV and NCCL_ONLY and os.path.isfile(NCCL_ONLY or ""),
                     "DGC_TEST_NCCL_ONLY names no libdgcshim-nccl.so (scripts/test.sh's NCCL-only phase builds one)")
class NcclOnly(unittest.TestCase):
    """A library built without MPI (libdgcshim-nccl.so): doctor says which front ends it has, run preloads it
    for a launcher that is not MPI's (torchrun), and an MPI launcher is refused with the reason."""

    def env(self):
        return clean_env(DGCSHIM_LIBRARY=NCCL_ONLY)

    def test_doctor_names_the_front_ends(self):
        checks = json.loads(sh([DGCSHIM, "doctor", "--json"], env=self.env()).stdout)["checks"]
        by = {}
        for c in checks:
            by.setdefault(c["check"], []).append(c)
        lib = by["library"][0]
        self.assertEqual((lib["status"], lib["facts"]["front_ends"]), ("OK", ["NCCL"]), lib)
        self.assertFalse(lib["facts"]["build"]["mpi_front_end"])
        self.assertEqual(lib["facts"]["build"]["library"], "libdgcshim-nccl.so")
        self.assertIn("front ends: NCCL only (built without MPI)", lib["message"])
        self.assertEqual([c["status"] for c in by["MPI front end"]], ["NO"])
        self.assertNotIn("MPI family", by)  # nothing for mpirun to agree with
        self.assertNotIn("MPI path", by["GPU"][0]["message"])
        r = sh([DGCSHIM, "doctor", "--for", "mpi"], env=self.env(), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("mpi: cannot work here (the NO lines above: MPI front end)", r.stdout)

    def test_run_preloads_it_for_torchrun_and_refuses_mpirun(self):
        self.assertEqual(sh([DGCSHIM, "lib"], env=self.env()).stdout, NCCL_ONLY + "\n")
        preload = sh([DGCSHIM, "run", "--", "sh", "-c", 'echo "$LD_PRELOAD"'], env=self.env()).stdout
        self.assertEqual(preload, NCCL_ONLY + "\n")
        r = sh([DGCSHIM, "run", "--"] + MPIRUN + ["-np", "1", "true"], env=self.env(), check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no library for openmpi: it has %s, the NCCL front end alone" % os.path.basename(NCCL_ONLY),
                      r.stderr)


@unittest.skipUnless(VENV, "DGC_TEST_VENV unset: run through scripts/test-python.sh")
class Report(unittest.TestCase):
    def test_reproduces_the_exit_report_and_plots(self):
        with tempfile.TemporaryDirectory() as d:
            stem = os.path.join(d, "s")
            r = sh([DGCSHIM, "run", "--stats", "--stats-file", stem, "--stats-every", "10", "--warmup-steps", "60",
                    "--momentum", "0.9", "--"] + MPIRUN + ["-np", "4", TRAINER, "--epochs", "1", "--train-limit",
                                                          "12000"], env=clean_env())
            want = stats_lines(r.stderr)
            out = sh([DGCSHIM, "report", stem + ".0", "--plot", os.path.join(d, "p.png")]).stdout.splitlines()
            self.assertTrue(out[0].startswith("== %s.0: rank 0, exit line" % stem), out[0])
            self.assertEqual(out[1:1 + len(want)], want)
            with open(stem + ".0") as f:
                lines = f.read().splitlines()
            self.assertGreaterEqual(len(lines), 9)  # 93 calls: every 10, and the exit line
            png = os.path.join(d, "p.png")
            self.assertGreater(os.path.getsize(png), 10000)
            import matplotlib.pyplot as plt
            img = plt.imread(png)
            self.assertEqual(img.shape[:2], (700, 800))
            self.assertGreater(img.std(), 0.05)  # not a blank canvas

    def test_all_ranks_in_one_call(self):
        with tempfile.TemporaryDirectory() as d:
            stem = os.path.join(d, "s")
            sh([DGCSHIM, "run", "--stats-file", stem, "--"] + MPIRUN + ["-np", "2", TRAINER, "--epochs", "1",
                                                                        "--train-limit", "3000"], env=clean_env())
            out = sh([DGCSHIM, "report", stem + ".0", stem + ".1"]).stdout
            self.assertEqual(len(re.findall(r"^== .*: rank [01], exit line", out, re.M)), 2, out)
            # the --stats-file prefix itself: every rank's file, in rank order
            self.assertEqual(sh([DGCSHIM, "report", stem]).stdout, out)
            # a plot into a folder that does not exist yet: made
            png = os.path.join(d, "new", "folder", "p.png")
            sh([DGCSHIM, "report", stem, "--plot", png])
            self.assertGreater(os.path.getsize(png), 10000)

    def test_mistakes_get_one_line(self):
        with tempfile.TemporaryDirectory() as d:
            for args, said in ((["nope"], "no file %s/nope, nor %s/nope.0" % (d, d)),
                               ([d], "cannot read %s: Is a directory" % d)):
                r = sh([DGCSHIM, "report"] + [os.path.join(d, a) for a in args], check=False)
                self.assertEqual(r.returncode, 1)
                self.assertNotIn("Traceback", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(said, r.stderr)


@unittest.skipUnless(VENV, "DGC_TEST_VENV unset: run through scripts/test-python.sh")
class HorovodGroups1(unittest.TestCase):
    @unittest.skipIf(os.environ.get("DGC_TEST_HOROVOD") == "0" or not os.path.exists(HOROVOD_TF),
                     "no .venv/horovod-tf (DGC_TEST_HOROVOD=0, or scripts/deps.sh horovod-tf not run)")
    def test_tensorflow_only_horovod(self):
        """--horovod-groups1 in a TensorFlow-only Horovod: groups=1 bound, two Keras steps, one buffer compressed."""
        r = sh([DGCSHIM, "run", "--horovod-groups1", "--stats", "--"] + MPIRUN +
               ["-np", "2", HOROVOD_TF, os.path.join(ROOT, "tests", "python", "keras_two_steps.py")],
               env=clean_env())
        said = re.findall(r"keras_two_steps rank (\d) groups1 (\d) params (\d+)", r.stdout)
        self.assertEqual(sorted(s[:2] for s in said), [("0", "1"), ("1", "1")], r.stdout)
        rows = [l for l in stats_lines(r.stderr) if l.startswith("0x")]
        self.assertEqual(len(rows), 1, rows)  # all gradients in one fused buffer
        count, calls = rows[0].split()[1:3]
        self.assertEqual((count, calls), (said[0][2], "2"))

    def test_refuses_a_command_without_python(self):
        r = sh([DGCSHIM, "run", "--horovod-groups1", "--", "true"], check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no Python interpreter", r.stderr)


def read_doc(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def code_blocks(text, lang=None):
    """The fenced code blocks of a Markdown text (those of one language when given)."""
    return [body for tag, body in re.findall(r"(?ms)^```(\w*)\n(.*?)^```", text) if lang is None or tag == lang]


class Docs(unittest.TestCase):
    """The README's and docs/python.md's commands, as a new user copies them onto a 2-core machine as root."""
    DOCS = ("README.md", os.path.join("docs", "python.md"))

    def test_mpirun_lines_run_as_root_on_two_cores(self):
        for doc in self.DOCS:
            lines = [l for b in code_blocks(read_doc(doc)) for l in b.splitlines() if re.search(r"(^|\s)mpirun\s+-", l)]
            self.assertTrue(lines, doc)
            for line in lines:
                self.assertIn("--allow-run-as-root", line, doc)
                self.assertIn("--oversubscribe", line, doc)

    def test_python_way_has_the_warm_up(self):
        readme = read_doc("README.md")
        way = readme[readme.index("**The Python user's way**"):]
        self.assertIn("--warmup-steps", code_blocks(way, "sh")[0])
        self.assertIn("--warmup-steps", code_blocks(read_doc(os.path.join("docs", "python.md")), "sh")[0])

    def test_lib_is_how_a_hand_written_preload_finds_the_library(self):
        for doc in self.DOCS:
            self.assertIn("LD_PRELOAD=$(.venv/dgc/bin/dgcshim lib)", read_doc(doc), doc)

    def test_mpi4py_example_is_the_pattern_users_write(self):
        """The README's lines are the ones of docs/python.md's whole step."""
        step = mpi4py_example()
        readme = [b for b in code_blocks(read_doc("README.md"), "python") if "Allreduce" in b]
        self.assertEqual(len(readme), 1)
        for line in readme[0].strip().splitlines():
            self.assertIn(line.strip(), step)
        self.assertIn("torch.cat([p.grad.view(-1) for p in model.parameters()]).numpy()", step)
        self.assertIn("comm.Allreduce(MPI.IN_PLACE, flat)", step)


def mpi4py_example():
    page = read_doc(os.path.join("docs", "python.md"))
    section = page[page.index("## An mpi4py training step"):]
    return code_blocks(section, "python")[0]


@unittest.skipUnless(VENV, "DGC_TEST_VENV unset: run through scripts/test-python.sh")
class DocsRun(unittest.TestCase):
    def test_mpi4py_example_runs_under_the_shim(self):
        """docs/python.md's mpi4py step, as written, under dgcshim run --buffer-key order on 2 ranks: a new array
        every step, 12 of its 20 calls compressed (8 summed densely while the step is learnt), no warning."""
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "train.py")
            with open(script, "w") as f:
                f.write(mpi4py_example())
            r = sh([DGCSHIM, "run", "--momentum", "0.9", "--buffer-key", "order", "--stats", "--"] + MPIRUN +
                   ["-np", "2", os.path.join(VENV, "bin", "python"), script], env=clean_env())
            report = [l for l in stats_lines(r.stderr) if l.startswith("pass-through")]
            self.assertIn("compressed calls 12,", report[0])
            self.assertIn("pass-through calls by reason: order_learning 8", "\n".join(stats_lines(r.stderr)))
            self.assertNotIn(" dgcshim WARN", r.stderr)


class Launch(unittest.TestCase):
    """The rewriting of commands, without running them (the package's own module)."""
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from dgcshim import launch
        cls.launch = launch

    def test_open_mpi_exports_in_every_app_context(self):
        got = self.launch.with_exports(["mpirun", "-np", "1", "a", ":", "-np", "2", "b", "x"], "openmpi",
                                       [("LD_PRELOAD", "/l.so"), ("DGC_STATS", "1")])
        self.assertEqual(got, ["mpirun", "-x", "LD_PRELOAD=/l.so", "-x", "DGC_STATS=1", "-np", "1", "a", ":",
                               "-x", "LD_PRELOAD=/l.so", "-x", "DGC_STATS=1", "-np", "2", "b", "x"])

    def test_hydra_genv(self):
        got = self.launch.with_exports(["mpiexec.mpich", "-n", "2", "a"], "hydra", [("DGC_STATS", "1")])
        self.assertEqual(got, ["mpiexec.mpich", "-genv", "DGC_STATS", "1", "-n", "2", "a"])

    def test_mpi_family_of_library_versions(self):
        f = self.launch.mpi_family_of_version
        self.assertEqual(f("Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6"), "openmpi")
        self.assertEqual(f("MPICH Version:      4.2.0"), "mpich")
        self.assertEqual(f("Intel(R) MPI Library 2021.10 for Linux* OS"), "mpich")
        self.assertIsNone(f("Microsoft MPI 10.1"))

    def test_groups1_wraps_each_python(self):
        g = self.launch.GROUPS1
        got = self.launch.with_groups1(["mpirun", "-np", "1", "/v/bin/python3", "-u", "-W", "ignore", "t.py", ":",
                                        "-np", "1", "python", "-m", "mod"])
        self.assertEqual(got, ["mpirun", "-np", "1", "/v/bin/python3", "-u", "-W", "ignore", g, "t.py", ":",
                               "-np", "1", "python", g, "-m", "mod"])
        with self.assertRaises(self.launch.Refused):
            self.launch.with_groups1(["python3", "-c", "print(1)"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
