"""The default run hands the longest test modules to its workers first
(`tests/conftest.py`, `MODULE_SECONDS`; `scripts/test.sh`), so that on the
2-core CI host no worker sits idle while the other runs a long module at
the end; and a full run says when that hand-kept table has gone stale."""

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


TABLE = {"test_a.py": 100, "test_b.py": 50, "test_c.py": 20}


def test_a_uniformly_slower_machine_is_not_staleness():
    measured = {name: seconds * 3.0 for name, seconds in TABLE.items()}
    measured["test_short.py"] = 120.0  # 40 s on the table's scale
    assert conftest.stale_module_seconds(measured, TABLE) == {}


def test_modules_listed_too_short_or_not_at_all_are_named():
    measured = {"test_a.py": 100.0, "test_b.py": 20.0, "test_c.py": 100.0,
                "test_new.py": 60.0, "test_short.py": 50.0}
    # Scale: 170 / 220. test_c: 77 s against 20 listed (over 3x); test_new:
    # 46 s, not listed; test_short: 39 s, under the 45 s threshold; test_b
    # (15 s against 50) is listed too long, which only runs it early.
    assert conftest.stale_module_seconds(measured, TABLE) == {
        "test_c.py": (20, 77), "test_new.py": (None, 46)}
    assert conftest.stale_module_seconds({"test_a.py": 10.0}, TABLE) == {}  # others absent


class _Reporter:
    def __init__(self):
        self.lines = []

    def write_sep(self, sep, title):
        self.lines.append(title)

    def write_line(self, line):
        self.lines.append(line)


class _Config:
    def __init__(self, keyword="", worker=False):
        self.option = type("Option", (), {"keyword": keyword})()
        if worker:  # what pytest-xdist sets on a worker's config
            self.workerinput = {"workerid": "gw0"}


def test_a_full_run_reports_a_stale_table(monkeypatch):
    monkeypatch.delenv("KT_PRINT_MODULE_SECONDS", raising=False)
    stale = dict(conftest.MODULE_SECONDS, **{"test_new_and_long.py": 400})
    monkeypatch.setattr(conftest, "_MEASURED_SECONDS", stale)
    reporter = _Reporter()
    conftest.pytest_terminal_summary(reporter, 0, _Config())
    assert reporter.lines[0] == "tests/conftest.py MODULE_SECONDS is out of date"
    assert reporter.lines[1].startswith("test_new_and_long.py: not listed, 400 s measured")

    # Nothing when the table holds, for a partial run, or on an xdist worker
    # (which saw only its own modules; the controller reports).
    for config, measured in ((_Config(), dict(conftest.MODULE_SECONDS)),
                             (_Config(keyword="export"), stale),
                             (_Config(worker=True), stale),
                             (_Config(), {"test_new_and_long.py": 400})):
        monkeypatch.setattr(conftest, "_MEASURED_SECONDS", measured)
        reporter = _Reporter()
        conftest.pytest_terminal_summary(reporter, 0, config)
        assert reporter.lines == []


def test_the_measured_table_is_printed_on_request(monkeypatch):
    monkeypatch.setattr(conftest, "_MEASURED_SECONDS",
                        {"test_x.py": 40.4, "test_y.py": 90.0, "test_z.py": 3.0})
    monkeypatch.setenv("KT_PRINT_MODULE_SECONDS", "1")
    reporter = _Reporter()
    conftest.pytest_terminal_summary(reporter, 0, _Config())
    assert reporter.lines[1] == "{'test_y.py': 90, 'test_x.py': 40}"
    monkeypatch.delenv("KT_PRINT_MODULE_SECONDS")
    reporter = _Reporter()
    conftest.pytest_terminal_summary(reporter, 0, _Config())
    assert reporter.lines == []
