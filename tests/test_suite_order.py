"""The default run hands the longest test modules to its workers first
(`tests/conftest.py`, `MODULE_SECONDS`; `scripts/test.sh`), so that on the
2-core CI host no worker sits idle while the other runs a long module at
the end."""

import os
import re

import conftest

TESTS = os.path.dirname(__file__)


def test_every_timed_module_exists():
    # A renamed or removed module would silently drop out of the order.
    missing = [name for name in conftest.MODULE_SECONDS
               if not os.path.exists(os.path.join(TESTS, name))]
    assert not missing, f"MODULE_SECONDS names modules that do not exist: {missing}"


def test_collected_tests_come_longest_module_first(request):
    seconds = [conftest.MODULE_SECONDS.get(item.path.name, 0)
               for item in request.session.items]
    assert seconds == sorted(seconds, reverse=True)
    # Each module's tests stay together (the sort is stable).
    modules = [item.path.name for item in request.session.items]
    runs = [name for i, name in enumerate(modules) if i == 0 or modules[i - 1] != name]
    assert len(runs) == len(set(runs)), "a module's tests were split up"


def test_the_test_script_keeps_the_collection_order():
    # With `--dist loadscope`, xdist re-sorts modules by their number of
    # tests unless told not to.
    with open(os.path.join(TESTS, "..", "scripts", "test.sh")) as f:
        script = f.read()
    command = re.search(r"python -m pytest .*?\"\$@\"", script, re.S).group(0)
    assert "--dist loadscope" in command and "--no-loadscope-reorder" in command
