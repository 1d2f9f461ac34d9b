"""kt-serve under load, on loopback: 16 concurrent clients send a mix of
valid and faulty requests (benchmarks/serve_load.py builds and checks it)
while a new version of the model is published; every request gets its own
answer (valid ones the translation and score the SavedModel gives in-process,
faulty ones the expected 4xx with a JSON error), none gets a 5xx, the new
version takes over without a failed request, and the server's resident
memory after the run stays within `serve_load.MEMORY_BOUND` of its memory
after the warm-up.

The default test runs with batching on; the slow one sends 2,000 requests
with batching on and off and prints the figures (the recorded figures come
from `python -m benchmarks serve-load`)."""

import json
import os
import threading

import pytest

from benchmarks import serve_load, serve_requests, serve_versions
from support.serving_model import export_tiny_model

CLIENTS = 16


def start_when_exported(directory, batching):
    """An `on_exported` callback that starts kt-serve on version 1 in a
    thread as soon as it is exported (the server loads while the expected
    answers are computed), and the box the thread leaves it in."""
    box = {}

    def on_exported(version, path):
        if version != 1:
            return

        def start():
            try:
                box["base"] = serve_versions.serve_version(path, directory)
                box["server"] = serve_load.Server.start(serve_versions.NAME, box["base"], batching)
            except BaseException as error:  # re-raised by the fixture
                box["error"] = error

        box["thread"] = threading.Thread(target=start, daemon=True)
        box["thread"].start()

    return box, on_exported


def served(directory, batching, reweight, in_process):
    """Exports versions 1 and 2, serves version 1 (batching on or off) and
    stages version 2. Returns `(server, versions, publish)`. In this
    process, version 1 is the tiny export the other serving tests share,
    copied from the run's cache (support/serving_model.py)."""
    box, on_exported = start_when_exported(directory, batching)
    try:
        versions = serve_versions.export_versions(directory / "exports", reweight=reweight,
                                              in_process=in_process, on_exported=on_exported,
                                              export=export_tiny_model)
    finally:
        if "thread" in box:
            box["thread"].join()
    if "error" in box:
        raise box["error"]
    publish = serve_versions.stage_version(versions.paths[2], directory, box["base"])
    return box["server"], versions, publish


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    # Version 2 is version 1's export with permuted weights (seconds instead
    # of a second export's tens of seconds), published mid-run by a rename.
    server, versions, publish = served(tmp_path_factory.mktemp("serve-load"), batching=True,
                                       reweight=True, in_process=True)
    try:
        result = serve_load.scenario(server, versions, publish, clients=CLIENTS, count=300)
    finally:
        server.stop()
    result["log"] = server.log()
    result["versions"] = versions
    return result


def explain(report):
    return "\n".join(report["failures"][:20]) + "\n--- server log ---\n" + report["log"][-3000:]


def test_every_request_gets_its_own_answer(report):
    assert report["failures"] == [], explain(report)
    statuses = report["figures"]["statuses_by_kind"]
    # Every kind of request was sent, and each kind got only its status (the
    # one exception: requests pinned to version 1 may get 404 once it is
    # unloaded).
    assert set(statuses) == set(serve_requests.WEIGHTS)
    for kind, counts in statuses.items():
        allowed = {str(serve_requests.STATUS[kind])} | ({"404"} if kind == "pinned" else set())
        assert set(counts) <= allowed, (kind, counts)
    assert sum(statuses["pinned"].values()) > statuses["pinned"].get("404", 0)


def test_no_server_errors_and_no_dropped_requests(report):
    figures = report["figures"]
    assert figures["server_errors_5xx"] == 0, explain(report)
    assert figures["no_answer"] == 0, explain(report)
    assert figures["requests"] >= 300


def test_a_version_published_mid_run_takes_over_without_a_failed_request(report):
    swap = report["swap"]
    assert report["failures"] == [], explain(report)
    # Published during the run, seen AVAILABLE during it, and requests went
    # on for a while after: the swap happened under load.
    assert 0 < swap["published_s"] < swap["available_seen_s"] < swap["run_s"], swap
    assert swap["latest_answers_v1"] > 0 and swap["latest_answers_v2"] > 0, swap
    # The old version answered until it was replaced, never after the first
    # answer of the new one was seen AVAILABLE (check() held every latest
    # request sent after that to version 2's answers).
    assert swap["last_v1_answer_sent_s"] < swap["available_seen_s"], swap
    assert swap["first_v2_answer_sent_s"] > swap["published_s"], swap


def test_resident_memory_after_the_run_stays_within_the_bound(report):
    rss = report["rss_mib"]
    print(json.dumps(rss))
    assert rss["after"] <= rss["limit"], (
        f"RSS {rss['after']:.0f} MiB after the run, {rss['warm']:.0f} MiB after the warm-up: "
        f"over the bound {serve_load.MEMORY_BOUND}")


def test_the_check_catches_a_swapped_answer_a_wrong_version_and_a_bad_error_body():
    """`check` against answers made up here: it must fail the run when a
    request gets another request's answer, the other version's answer, a
    score off by more than float32 rounding, a 5xx, or a 4xx without a JSON
    error."""
    sentences = ["s0", "s1"]
    answers = {v: {("serving_default", k): (f"v{v}-{k}", -10.0 * (i + 1) - v)
                   for i, k in enumerate(sentences)} for v in (1, 2)}
    versions = serve_versions.Versions("tiny", {}, {"s0": "a", "s1": "b"}, sentences, answers, 20)

    def outcome(key, body, status=200, expect=200, version=None):
        spec = serve_requests.Spec("sentence", "/v1/models/tiny:predict", b"", expect,
                               (("serving_default", key),) if expect == 200 else (), version)
        return serve_requests.Outcome(spec, 1.0, 2.0, status, body, json.dumps(body))

    def answer(translation, score):
        return {"outputs": {"translation": [translation], "score": [score]}}

    def failures(*outcomes, allowed=frozenset({1})):
        run = serve_requests.Run(list(outcomes), 0.0, 3.0)
        return serve_requests.check(run, versions, lambda o: set(allowed))

    right = outcome("s0", answer("v1-s0", -11.0))
    close = outcome("s1", answer("v1-s1", -21.0 * (1 + 5e-6)))
    assert failures(right, close) == []
    assert failures(outcome("s0", answer("v1-s1", -21.0)))  # another request's answer
    assert failures(outcome("s0", answer("v2-s0", -12.0)))  # the other version's
    assert failures(right, allowed={1, 2}) == []
    assert failures(outcome("s0", answer("v2-s0", -12.0)), allowed={1, 2}) == []
    assert failures(outcome("s0", answer("v1-s0", -11.0 * (1 + 1e-4))))  # score off
    assert failures(outcome("s0", {"error": "boom"}, status=500))
    assert failures(outcome("s0", {"error": "bad"}, status=400, expect=400)) == []
    assert failures(outcome("s0", {"error": ""}, status=400, expect=400))
    assert failures(outcome("s0", None, status=400, expect=400))
    assert failures(outcome("s0", {"error": "x"}, status=404, expect=400))


@pytest.mark.slow
@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no-batching"])
def test_two_thousand_requests(tmp_path, batching):
    # Two real exports (two seeds), in two processes at once.
    server, versions, publish = served(tmp_path, batching, reweight=False, in_process=False)
    try:
        result = serve_load.scenario(server, versions, publish, clients=CLIENTS, count=2000)
    finally:
        server.stop()
    result["log"] = server.log()
    figures = result["figures"]
    print(f"\nbatching {'on' if batching else 'off'}, {os.cpu_count()} cores: "
          f"{figures['requests']} requests in {figures['seconds']:.1f} s, "
          f"{figures['requests_per_s']:.1f} requests/s, valid p50 "
          f"{figures['latency_ms_p50']:.1f} ms, p99 {figures['latency_ms_p99']:.1f} ms; RSS "
          f"{json.dumps({k: round(v) for k, v in result['rss_mib'].items()})}; "
          f"swap {json.dumps(result['swap'])}")
    assert result["failures"] == [], explain(result)
    assert figures["server_errors_5xx"] == 0 and figures["no_answer"] == 0
    assert figures["requests"] >= 2000
    assert result["rss_mib"]["after"] <= result["rss_mib"]["limit"], result["rss_mib"]


SWAPS = 20
# Growth of resident memory from the second swap to the last: each swap
# loads a version beside the served one and unloads the old one after, so
# memory may stay one version higher than before the first swap, but must
# not grow with the number of swaps (docs/serving.md has the figures).
SWAP_GROWTH_BOUND_MIB = 150


@pytest.mark.slow
def test_twenty_swaps_under_load_keep_every_answer_and_bounded_memory(tmp_path):
    server, versions, _ = served(tmp_path, batching=True, reweight=True, in_process=True)
    try:
        base = tmp_path / "served" / serve_versions.NAME
        _, failures = serve_load.warm_up(server, versions, CLIENTS)
        more, rss = serve_load.swaps_run(server, versions, tmp_path / "swaps", str(base), SWAPS,
                                         clients=CLIENTS)
        failures += more
    finally:
        server.stop()
    print(f"\nRSS after each of {SWAPS} swaps (MiB): {[round(r) for r in rss]}")
    assert failures == [], "\n".join(failures[:20]) + "\n" + server.log()[-3000:]
    assert len(rss) == SWAPS
    assert rss[-1] - rss[1] <= SWAP_GROWTH_BOUND_MIB, rss
