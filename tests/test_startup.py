"""keras_transformer/startup.py and malloc.py: what a kt-* command does
before TensorFlow loads. glibc's malloc is tuned with mallopt (and can be
left alone), TensorFlow's start-up lines are hidden (and can be shown), and
the commands do both before they import TensorFlow."""

import ast
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from keras_transformer import malloc, startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ["train", "evaluate", "translate", "export", "average", "visualize", "demo",
            "serve"]
SCRIPTS = {"train": "train", "evaluate": "evaluate", "translate": "translate",
           "export": "export", "average": "average_checkpoints", "visualize": "visualize",
           "demo": "demo"}
glibc_only = pytest.mark.skipif(malloc._glibc() is None, reason="glibc's malloc only")


def clean_env(**extra):
    """This environment without the switches under test."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in
           ("KT_FAST_MALLOC", "KT_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")}
    return {**env, **extra}


def python(code, env=None, args=()):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=clean_env() if env is None else env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


# mallinfo2's fields: arena (heap bytes) and hblkhd (bytes in mmapped blocks).
# malloc.py is loaded by its path: through the package, whose __init__
# imports TensorFlow, each probe would start TensorFlow's threads and heap.
MALLOC_PROBE = """
import ctypes, importlib.util, json, sys, threading
spec = importlib.util.spec_from_file_location("kt_malloc", sys.argv[2])
malloc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(malloc)

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
applied = malloc.apply() if sys.argv[1] == "apply" else {}
before = libc.mallinfo2().hblkhd
block = libc.malloc(64 << 20)
mmapped = libc.mallinfo2().hblkhd - before
libc.free(block)
# Each new thread takes an arena of its own unless their number is capped.
barrier = threading.Barrier(5)
def work():
    p = libc.malloc(1000)
    barrier.wait()
    libc.free(p)
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
barrier.wait()
for t in threads:
    t.join()
print(json.dumps({"applied": applied, "mmapped": mmapped}), flush=True)
libc.malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


def malloc_probe(mode, **env):
    out = python(MALLOC_PROBE, env=clean_env(**env), args=[mode, malloc.__file__])
    result = json.loads(out.stdout)
    result["arenas"] = len(re.findall(r"^Arena \d+:", out.stderr, re.M))
    return result


@glibc_only
def test_apply_keeps_large_blocks_in_one_heap():
    default = malloc_probe("none")
    assert default["mmapped"] >= 64 << 20 and default["arenas"] > 1
    tuned = malloc_probe("apply")
    assert tuned["applied"] == {"MALLOC_MMAP_MAX_": 0, "MALLOC_TRIM_THRESHOLD_": -1,
                                "MALLOC_ARENA_MAX": 1}
    assert tuned["mmapped"] == 0 and tuned["arenas"] == 1


@glibc_only
def test_a_variable_in_the_environment_wins():
    # glibc applied it at start-up; apply() leaves that parameter alone.
    result = malloc_probe("apply", MALLOC_ARENA_MAX="4", MALLOC_MMAP_MAX_="65536")
    assert result["applied"] == {"MALLOC_TRIM_THRESHOLD_": -1}
    assert result["mmapped"] >= 64 << 20 and result["arenas"] > 1
    # The environment form does what mallopt does.
    result = malloc_probe("none", **malloc.ENVIRONMENT)
    assert result["mmapped"] == 0 and result["arenas"] == 1


def test_the_environment_form_agrees_with_mallopt_and_scripts_venv_sh():
    assert set(malloc.ENVIRONMENT) == set(malloc.MALLOPT)
    for name, value in malloc.ENVIRONMENT.items():
        mallopt_value = malloc.MALLOPT[name][1]
        assert int(value) == mallopt_value or (mallopt_value == -1 and int(value) >= 2**34)
    venv = open(os.path.join(ROOT, "scripts", "venv.sh")).read()
    exported = dict(re.findall(r"export (MALLOC_\w+)=\$\{\1:-(\d+)\}", venv))
    assert exported == malloc.ENVIRONMENT
    assert "KT_FAST_MALLOC" in venv


def test_the_flags_are_found_as_argparse_would_find_them():
    assert startup._given(["--run-dir", "x", "--system-malloc"], "--system-malloc")
    assert not startup._given(["--tf-verb"], "--tf-verbose")  # commands take no abbreviation
    assert not startup._given(["--", "--tf-verbose"], "--tf-verbose")
    assert not startup._given(["--tf-verbosely"], "--tf-verbose")
    assert not startup._given(["-"], "--tf-verbose")


def test_log_lines_below_the_level_are_dropped():
    text = ("WARNING: All log messages before absl::InitializeLog() is called are written "
            "to STDERR\n"
            "I0000 00:00:1795634607.608457    4775 port.cc:153] oneDNN custom operations are on.\n"
            "W1125 19:40:01.123456 1 dataset.cc:997] a warning\n"
            "E0000 00:00:1795634610.363848    4775 cuda_platform.cc:52] failed call to cuInit\n"
            "F0000 00:00:1795634610.363848    4775 x.cc:1] fatal\n"
            "a line of the program's own\n")
    lines = text.splitlines(keepends=True)
    assert startup.filter_log_lines(text, 0) == text
    assert startup.filter_log_lines(text, 2) == "".join(lines[3:])
    assert startup.filter_log_lines(text, 3) == "".join(lines[4:])


def test_every_command_declares_and_documents_the_switches():
    for name in COMMANDS:
        module = importlib.import_module(f"keras_transformer.cli.{name}")
        text = " ".join(module.build_parser().format_help().split())
        for words in ("--tf-verbose", "KT_VERBOSE=1", "--system-malloc", "KT_FAST_MALLOC=0",
                      "TF_CPP_MIN_LOG_LEVEL=3"):
            assert words in text, (name, words)


def test_every_command_starts_up_before_it_imports_tensorflow():
    # The package's __init__ starts a command up before its first import
    # that loads TensorFlow (importing a command's module runs it first).
    init = ast.parse(open(os.path.join(ROOT, "keras_transformer", "__init__.py")).read())
    statements = [ast.unparse(node) for node in init.body
                  if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    assert statements[:2] == ["from keras_transformer import startup",
                              "startup.start_if_command()"]
    for name in COMMANDS:
        path = os.path.join(ROOT, "keras_transformer", "cli", f"{name}.py")
        tree = ast.parse(open(path).read())
        # Module level: the standard library, the TensorFlow-free start-up
        # and keras_transformer.cli only.
        for node in tree.body:
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert module.startswith(
                    ("keras_transformer.cli", "keras_transformer.startup")) or (
                    top in sys.stdlib_module_names), (name, module)
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        body = main.body[1:] if ast.get_docstring(main) else main.body
        assert ast.unparse(body[0]) == "startup.start(argv)", name
    # startup.py and malloc.py themselves import the standard library only
    # (and each other): nothing that loads TensorFlow.
    for name in ("startup", "malloc"):
        tree = ast.parse(open(os.path.join(ROOT, "keras_transformer", f"{name}.py")).read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [f"{node.module}.{a.name}" for a in node.names])
                for module in modules:
                    assert (module.split(".")[0] in sys.stdlib_module_names
                            or module in ("keras_transformer.malloc", "tensorflow")), module


# Started as `sys.argv[1]`: whether TensorFlow and matplotlib were imported
# with the package and Keras's gallery went without pyplot; then pyplot by
# hand.
PYPLOT_PROBE = """
import sys
sys.argv[0] = sys.argv.pop(1)
import keras_transformer
from keras.src.visualization import plot_image_gallery
print("tensorflow" in sys.modules, "matplotlib" in sys.modules, plot_image_gallery.plt is None)
import matplotlib.pyplot
print(matplotlib.pyplot.__name__, "matplotlib.pyplot" in sys.modules)
"""


@pytest.mark.parametrize("verbose", ["0", "1"])
def test_a_command_imports_keras_without_matplotlib_and_pyplot_later(verbose):
    pytest.importorskip("matplotlib")  # the viz extra, which the tests install
    # The premise, in this process (Keras imported without a hold-back):
    # Keras takes pyplot whenever matplotlib is installed.
    from keras.src.visualization import plot_image_gallery

    assert plot_image_gallery.plt is not None, (
        "Keras no longer imports matplotlib: startup.matplotlib_held_back is moot")
    command = python(PYPLOT_PROBE, clean_env(KT_VERBOSE=verbose), args=["kt-visualize"])
    assert command.stdout.splitlines() == ["True False True", "matplotlib.pyplot True"]


def test_matplotlib_held_back_leaves_an_imported_matplotlib_alone():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot

    with startup.matplotlib_held_back():
        from matplotlib import pyplot
    assert pyplot is matplotlib.pyplot is sys.modules["matplotlib.pyplot"]


def test_training_scripts_are_the_commands():
    for command, script in SCRIPTS.items():
        text = open(os.path.join(ROOT, "training", f"{script}.py")).read()
        assert f"from keras_transformer.cli.{command} import main" in text
        assert "sys.exit(main())" in text and "sys.path" not in text


def run_command(args, **env):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=180, cwd=ROOT, env=clean_env(**env))


def test_a_command_is_quiet_unless_asked(tmp_path):
    missing = str(tmp_path / "missing")
    args = ["keras_transformer.cli.average", "--run-dir", missing]
    quiet = run_command(args)
    assert quiet.returncode == 2
    assert quiet.stderr == f"error: No checkpoints in {missing}/checkpoints to average.\n"
    for loud in (run_command(args, KT_VERBOSE="1"), run_command(args + ["--tf-verbose"])):
        assert loud.returncode == 2
        assert loud.stderr.startswith("kt: glibc malloc tuned with mallopt {")
        assert loud.stderr.endswith(quiet.stderr)
        # TensorFlow's own lines, whichever this machine prints.
        assert len(loud.stderr.splitlines()) > 2, loud.stderr


@glibc_only
def test_the_malloc_switches_reach_the_command():
    args = ["keras_transformer.cli.average", "--help"]
    said = run_command(args, KT_VERBOSE="1").stderr
    assert "tuned with mallopt {'MALLOC_MMAP_MAX_': 0" in said
    assert f"kt: garbage collector thresholds {startup.GC_THRESHOLDS}\n" in said
    said = run_command(args, KT_VERBOSE="1", MALLOC_ARENA_MAX="2").stderr
    assert "from the environment {'MALLOC_ARENA_MAX': '2'}" in said
    for off in (run_command(args + ["--system-malloc"], KT_VERBOSE="1"),
                run_command(args, KT_VERBOSE="1", KT_FAST_MALLOC="0")):
        assert off.returncode == 0
        assert off.stderr.startswith("kt: glibc malloc left at its defaults")


def test_the_collector_runs_less_often_unless_the_process_chose():
    import gc

    before = gc.get_threshold()
    try:
        gc.set_threshold(*startup.PYTHON_GC_THRESHOLDS)
        assert startup.collect_less() == startup.GC_THRESHOLDS == gc.get_threshold()
        assert startup.GC_THRESHOLDS[0] > startup.PYTHON_GC_THRESHOLDS[0]
        gc.set_threshold(5000, 20, 20)
        assert startup.collect_less() == (5000, 20, 20) == gc.get_threshold()
    finally:
        gc.set_threshold(*before)


def test_the_commands_it_recognises_are_the_console_scripts():
    import configparser

    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    scripts = [line.split("=")[0].strip() for line in
               parser["options.entry_points"]["console_scripts"].strip().splitlines()]
    assert sorted(scripts) == sorted(startup.COMMANDS)
    thin = sorted(name for name in os.listdir(os.path.join(ROOT, "training"))
                  if name.endswith(".py"))
    assert thin == sorted(startup.CHECKOUT_SCRIPTS)
    for argv0 in ("/venv/bin/kt-train", "kt-demo", os.path.join(ROOT, "training", "train.py")):
        assert startup.launched_as_command(argv0, ["python", argv0]), argv0
    assert startup.launched_as_command("-m", ["python", "-m", "keras_transformer.cli.train"])
    # A user's own train.py, pytest, python -c, another module: not a command.
    for argv0 in ("/home/me/train.py", "/venv/bin/pytest", "-c", ""):
        assert not startup.launched_as_command(argv0, ["python", argv0]), argv0
    assert not startup.launched_as_command("-m", ["python", "-m", "pytest"])
