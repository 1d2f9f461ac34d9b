"""The public API: every name of `keras_transformer.__all__` (and of
`kt.data`'s entry points, and of the `__all__` of the modules in `MODULES`)
has a docstring with an `Example:` whose code block runs (KerasHub's
style), and docs/api.md lists every public name."""

import importlib
import inspect
import os
import re
import textwrap

import pytest

import keras_transformer as kt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = re.compile(r"Example:\s*\n\s*```python\n(.*?)\n\s*```", re.S)
# Values, not callables: nothing to run.
CONSTANTS = {"PRESETS"}
# Public modules outside `kt.__all__`, by the prefix docs/api.md lists their
# names with: each name of their `__all__` is public (a value, as CONSTANTS).
MODULES = {"warmup": "keras_transformer.export.warmup",
           "vocabulary_map": "keras_transformer.export.vocabulary_map",
           "evaluation": "keras_transformer.evaluation",
           "r_drop": "keras_transformer.r_drop"}


def module_names():
    """`{prefixed name: value}` of the `__all__` of each module of `MODULES`."""
    found = {}
    for prefix, dotted in MODULES.items():
        module = importlib.import_module(dotted)
        for name in module.__all__:
            found[f"{prefix}.{name}"] = getattr(module, name)
    return found


def module_constants():
    return {name for name, value in module_names().items() if not callable(value)}


def public_objects():
    found = {}
    for name in kt.__all__:
        if name in CONSTANTS:
            continue
        value = getattr(kt, name)
        if inspect.ismodule(value):
            for entry in value._ENTRY_POINTS:
                found[f"{name}.{entry}"] = getattr(value, entry)
        else:
            found[name] = value
    found.update((name, value) for name, value in module_names().items() if callable(value))
    return found


def examples():
    """`(id, code)` for every Example of a public name and of its methods."""
    out = []
    for name, value in public_objects().items():
        docs = [(name, inspect.getdoc(value) or "")]
        if inspect.isclass(value):
            # The class's own methods (not docstrings inherited from Keras).
            for attr, member in vars(value).items():
                if not (inspect.isfunction(member)
                        or isinstance(member, (classmethod, staticmethod))):
                    continue
                doc = inspect.cleandoc(getattr(member, "__doc__", None) or "")
                if not attr.startswith("_") and "Example:" in doc:
                    docs.append((f"{name}.{attr}", doc))
        for where, doc in docs:
            for i, block in enumerate(EXAMPLE.findall(doc)):
                out.append(pytest.param(textwrap.dedent(block), id=f"{where}-{i}"))
    return out


def test_every_public_name_has_an_example():
    missing = [name for name, value in public_objects().items()
               if not EXAMPLE.search(inspect.getdoc(value) or "")]
    assert missing == []


@pytest.mark.parametrize("code", examples())
def test_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})


def test_api_page_lists_every_public_name():
    with open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8") as f:
        page = f.read()
    listed = set(re.findall(r"^\| `(?:kt\.)?([\w.]+)", page, re.M))
    public = set(public_objects()) | CONSTANTS | module_constants()
    assert public <= listed, sorted(public - listed)


def test_tensorflow_names_load_on_first_use_only():
    import subprocess
    import sys

    code = ("import sys, keras_transformer as kt; "
            "assert 'keras_transformer.pipeline.trainer' not in sys.modules; "
            "kt.train; assert 'keras_transformer.pipeline.trainer' in sys.modules; "
            "print(sorted(set(kt.__all__) - set(dir(kt))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
