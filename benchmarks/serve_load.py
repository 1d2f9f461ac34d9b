"""kt-serve under concurrent load with faults mixed in: every answer checked,
a new version published mid-run, throughput, latency and the server's
resident memory.

    python -m benchmarks serve-load --clients 16 --requests 2000

exports two tiny random translators (benchmarks/tiny_serving.py's
`export_tiny_model`, two seeds: versions 1 and 2), computes every expected
answer of both by calling each SavedModel in a process of its own, and starts
kt-serve twice on loopback: with `--enable-batching` and without. Each server
first gets a warm-up (every distinct input once), then a publication round
(at least `--publish-requests`; version 2 is published a third of the way
in, and the round goes on until a third more were sent after the status
showed it AVAILABLE), then `--requests` requests in `--rounds` timed rounds
(pinned requests to version 2), the two servers alternating (the order flips
every round) so that the drift of a shared machine falls on both. The
figures (requests/s, p50 and p99 latency of the valid requests, sentences
per model call with batching, RSS after warm-up, after the publication round
and after the timed rounds) go to
`benchmarks/results/<cpu>_<date>_<commit>_serve-load.json` (`--json` names
another file).

The requests, their expected answers and the checks are
`benchmarks/serve_requests.py`'s.

The versions are `benchmarks/serve_versions.py`'s. Used as a library by
tests/test_serve_load.py: `Server`, `scenario`, `swaps_run`, `MEMORY_BOUND`.
"""

import dataclasses
import os
import random
import tempfile
import time

from benchmarks import harness, tiny_serving
from benchmarks.serve_requests import (
    VALID,
    WEIGHTS,
    Spec,
    check,
    figures,
    json_bytes,
    mix,
    predict_path,
    run_load,
    version_of,
    version_states,
    warm_up_specs,
)
from benchmarks.serve_versions import (
    NAME,
    export_versions,
    served_copy,
    stage_version,
)

# The server's resident memory after a run may exceed its memory after the
# warm-up by this fraction of it or by this many MiB, whichever is larger:
# a swap holds two loaded versions at once and kt-serve's malloc settings
# keep the heap's peak, so the bound is one more loaded version with a
# margin (docs/serving.md has the figures it rests on).
MEMORY_BOUND = {"fraction": 0.5, "mib": 512}
BATCHING_FLAGS = ["--enable-batching", "--max-batch-size", "32", "--batch-timeout-micros",
                  "2000", "--max-enqueued-batches", "64", "--num-batch-threads", "1"]


@dataclasses.dataclass
class Server:
    """A running kt-serve: its process (`pid` is the kt-serve process
    itself), base URL, model name and request size limit."""

    process: object
    url: str
    name: str
    max_request_bytes: int

    @classmethod
    def start(cls, name, base_path, batching, max_request_bytes=1 << 16, timeout=180):
        """kt-serve on `base_path`, polling it every second, with
        `BATCHING_FLAGS` when `batching`."""
        argv = ["--model-name", name, "--model-base-path", str(base_path),
                "--file-system-poll-wait-seconds", "1",
                "--max-request-bytes", str(max_request_bytes)]
        process, url = tiny_serving.start_server(argv + (BATCHING_FLAGS if batching else []),
                                                 timeout=timeout)
        return cls(process, url.rstrip("/"), name, max_request_bytes)

    def stop(self):
        return tiny_serving.stop_server(self.process)

    def rss_mib(self):
        """VmRSS of the kt-serve process (not of its children), MiB."""
        return harness.status_mib("VmRSS", self.process.pid)

    def log(self):
        """The server's stderr so far (after `stop`, all of it)."""
        text = getattr(self.process, "stderr_text", None)
        if text is not None:
            return text
        try:
            with open(self.process.stderr_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""


def wait_for_version(server, version, timeout=120):
    """Polls the model status until `version` is AVAILABLE. Returns the time
    the answer saying so was received; raises TimeoutError with the last
    status."""
    import requests

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        response = requests.get(f"{server.url}/v1/models/{server.name}", timeout=30)
        last = (response.status_code, response.text[:500])
        if response.status_code == 200 and version_states(response.json()).get(version) \
                == "AVAILABLE":
            return time.perf_counter()
        time.sleep(0.1)
    raise TimeoutError(f"version {version} of {server.name} not AVAILABLE after {timeout} s; "
                       f"last status: {last}")


def batching_statistics(server):
    """The server's batching counters (`GET /v1/models/NAME/batching`)."""
    import requests

    response = requests.get(f"{server.url}/v1/models/{server.name}/batching", timeout=30)
    response.raise_for_status()
    return response.json()


def batches_between(before, after):
    """Batches, requests and rows run between two `batching_statistics`,
    and the mean rows (sentences) and requests per batch."""
    if not (before.get("enabled") and after.get("enabled")):
        return None
    counts = {k: after[k] - before[k] for k in ("batches", "requests", "rows")}
    batches = counts["batches"] or 1
    return {**counts, "rows_per_batch": counts["rows"] / batches,
            "requests_per_batch": counts["requests"] / batches}


def memory_limit(warm_mib):
    """The most RSS (MiB) a run may leave after `warm_mib` after warm-up."""
    return warm_mib + max(MEMORY_BOUND["fraction"] * warm_mib, MEMORY_BOUND["mib"])


def warm_up(server, versions, clients, pinned=1):
    """Sends `warm_up_specs` and checks them. Returns `(run, failures)`."""
    run = run_load(server, warm_up_specs(versions, pinned, server.max_request_bytes), clients)
    return run, check(run, versions, lambda o: {o.spec.version or pinned})


def publish_under_load(server, versions, specs, clients, publish, publish_at, count, tail,
                       old=1, new=2, weights=None, wait_timeout=180):
    """Sends `specs` (pinned ones to version `old`), calling `publish` to
    publish version `new` once request `publish_at` is taken, at least
    `count` of them, until `tail` more were taken after a status answer
    showed `new` AVAILABLE (at most `wait_timeout` seconds), and checks
    every answer: a latest one may come from either version until then,
    from `new` only after; a pinned one from its version (or 404 for `old`,
    once it may have been unloaded: see `check`). `weights(version)`: whose
    expected answers a version gives (default: its own).

    Returns: `(run, available, failures)`, `available` the time a status
    answer showed `new` AVAILABLE (None if it never did).
    """
    weights = weights or (lambda version: version)
    run = run_load(server, specs, clients, publish=publish, publish_at=publish_at,
                   new_version=new, minimum=count, tail=tail, seconds=wait_timeout)
    failures = [] if run.published is not None else [f"version {new} was never published"]
    available = run.available_seen
    if available is None:
        try:
            available = wait_for_version(server, new, wait_timeout)
        except TimeoutError as error:
            failures.append(str(error))
    seen = available if available is not None else float("inf")

    def allowed(o):
        if o.spec.version is not None:
            return {weights(o.spec.version)}
        return {weights(new)} if o.sent > seen else {weights(old), weights(new)}

    failures += check(run, versions, allowed,
                      unloaded=(old, run.unavailable_polled or run.start))
    return run, available, failures


def publication_run(server, versions, clients, count, publish, seed=0, fraction=1 / 3,
                    tail=None, wait_timeout=180):
    """At least `count` requests of the mix (pinned ones to version 1), with
    version 2 published after `fraction` of them are taken, going on until
    `tail` (default `count // 3`) more were taken after a status answer
    showed version 2 AVAILABLE (at most `wait_timeout` seconds); then sends
    every sentence once more to the latest version and once pinned to
    version 2.

    Returns: `(run, after, failures, facts)`. `after` is the run after the
    swap. A latest answer may come from either version until a status
    answer showed version 2 AVAILABLE, from version 2 only after; a pinned
    one from its version (or 404 for version 1, once it may have been
    unloaded: see `check`). `facts`: when the swap happened relative to the
    run, how many latest answers each version gave.
    """
    tail = count // 3 if tail is None else tail
    # Enough requests for the swap to fall inside the run however slowly the
    # new version loads; `wait_timeout` bounds the run.
    specs = mix(versions, 20 * count, seed, pinned=1,
                max_request_bytes=server.max_request_bytes)
    run, available, failures = publish_under_load(
        server, versions, specs, clients, publish, int(count * fraction), count, tail,
        wait_timeout=wait_timeout)
    rng = random.Random(seed + 1)
    after_specs = []
    for key in versions.sentences:
        for path, version in ((predict_path(versions.name), None),
                              (predict_path(versions.name, 2), 2)):
            after_specs.append(Spec("sentence" if version is None else "pinned", path,
                                    json_bytes({"inputs": {"text": [versions.texts[key]]}}),
                                    200,
                                    (("serving_default", key),), version))
    rng.shuffle(after_specs)
    after = run_load(server, after_specs, clients)
    failures += [f"after the swap: {f}" for f in check(after, versions, lambda o: {2})]
    latest = [o for o in run.outcomes if o.status == 200 and o.spec.version is None
              and o.spec.kind in VALID]
    by_version = {1: [], 2: []}
    for o in latest:
        which = version_of(o, versions)
        if len(which) == 1:  # the empty sentence's answers are the same
            by_version[which.pop()].append(o.sent - run.start)
    facts = {
        "published_s": None if run.published is None else run.published - run.start,
        "available_seen_s": None if available is None else available - run.start,
        "run_s": run.end - run.start, "requests": len(run.outcomes),
        "latest_answers_v1": len(by_version[1]), "latest_answers_v2": len(by_version[2]),
        "last_v1_answer_sent_s": max(by_version[1], default=None),
        "first_v2_answer_sent_s": min(by_version[2], default=None),
    }
    return run, after, failures, facts


def scenario(server, versions, publish, clients=16, count=300, seed=0):
    """Warm-up, RSS, a publication run, RSS. Returns a report dict:
    `failures` (empty when every answer was right), `figures` of the
    publication run, `swap` facts, `rss_mib` {"started" (before the
    warm-up), "warm", "after", "peak", "limit"}."""
    rss_started = server.rss_mib()
    warm, failures = warm_up(server, versions, clients)
    time.sleep(0.5)
    rss_warm = server.rss_mib()
    run, after, more, facts = publication_run(server, versions, clients, count, publish, seed)
    failures = [f"warm-up: {f}" for f in failures] + more
    time.sleep(0.5)
    rss_after = server.rss_mib()
    return {"failures": failures, "figures": figures([run]), "swap": facts,
            "rss_mib": {"started": rss_started, "warm": rss_warm, "after": rss_after,
                        "peak": max(run.rss_samples + after.rss_samples + [rss_after]),
                        "limit": memory_limit(rss_warm)}}


def weights_of(version):
    """Which export's weights `swaps_run` publishes as `version`: 2's for
    even versions, 1's for odd ones."""
    return 2 if version % 2 == 0 else 1


def swaps_run(server, versions, directory, base, swaps, clients=16, count=40, seed=0,
              wait_timeout=180):
    """`swaps` publications in a row under load: versions 2, 3, ...,
    `swaps + 1`, each a copy of export 1 or 2 (`weights_of`), published
    after a quarter of at least `count` requests of the mix (pinned ones to
    the version served before it), the run going on until `count // 3` more
    were taken after a status answer showed the new version AVAILABLE.
    Every answer is checked as in `publication_run`.

    Returns: `(failures, rss_mib)`, `rss_mib` the server's resident memory
    after each swap (MiB, in order).
    """
    failures, rss = [], []
    for k in range(swaps):
        new, old = k + 2, k + 1
        publish = stage_version(versions.paths[weights_of(new)],
                                os.path.join(str(directory), f"swap-{new}"), base, new)
        specs = mix(versions, 20 * count, seed + k, pinned=old,
                    max_request_bytes=server.max_request_bytes)
        _, _, failed = publish_under_load(server, versions, specs, clients, publish, count // 4,
                                          count, count // 3, old, new, weights_of, wait_timeout)
        failures += [f"swap to {new}: {f}" for f in failed]
        wait_for_version(server, new, wait_timeout)
        time.sleep(0.2)
        rss.append(server.rss_mib())
    return failures, rss


def _summary_line(label, f):
    return (f"  {label:30s} {f['requests']:5d} requests in {f['seconds']:6.1f} s: "
            f"{f['requests_per_s']:6.1f} requests/s, {f['valid_sentences_per_s']:6.1f} "
            f"sentences/s; valid p50 {f['latency_ms_p50']:7.1f} ms, "
            f"p99 {f['latency_ms_p99']:7.1f} ms; 5xx {f['server_errors_5xx']}")


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=2000,
                        help="timed requests per server, over all rounds")
    parser.add_argument("--rounds", type=int, default=8,
                        help="timed rounds per server, alternating between the servers")
    parser.add_argument("--publish-requests", type=int, default=300,
                        help="requests of the untimed round that publishes version 2")
    parser.add_argument("--modes", default="batching,plain",
                        help="servers to start: batching (--enable-batching), plain")
    parser.add_argument("--max-request-bytes", type=int, default=1 << 16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="the result file (default: benchmarks/results/"
                                       "<cpu>_<date>_<commit>_serve-load.json)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if set(modes) - {"batching", "plain"} or not modes:
        parser.error(f"--modes takes batching and/or plain, not {args.modes!r}")
    if args.rounds < 1 or args.requests // args.rounds < len(WEIGHTS):
        parser.error(f"--requests / --rounds must be at least {len(WEIGHTS)} (one request "
                     "of each kind per round)")
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    record = harness.record()
    load = {"before": os.getloadavg()}
    report = {**record, "clients": args.clients, "requests": args.requests,
              "rounds": args.rounds, "publish_requests": args.publish_requests,
              "max_request_bytes": args.max_request_bytes,
              "batching_flags": BATCHING_FLAGS, "weights": WEIGHTS, "memory_bound": MEMORY_BOUND}
    servers = {}
    with tempfile.TemporaryDirectory(prefix="serve-load-") as directory:
        started = time.perf_counter()
        versions = export_versions(os.path.join(directory, "exports"))
        print(f"exported versions 1 and 2 and computed their answers in "
              f"{time.perf_counter() - started:.0f} s; {len(versions.sentences)} sentences",
              flush=True)
        failures, results = {}, {}
        try:
            publishers = {}
            for mode in modes:
                base, publishers[mode] = served_copy(versions, os.path.join(directory, mode))
                servers[mode] = Server.start(NAME, base, mode == "batching",
                                             args.max_request_bytes)
                print(f"{mode}: kt-serve at {servers[mode].url}, pid "
                      f"{servers[mode].process.pid}", flush=True)
            for mode, server in servers.items():
                done = scenario(server, versions, publishers[mode], args.clients,
                                args.publish_requests, args.seed)
                failures[mode] = done["failures"]
                rss = done["rss_mib"]
                results[mode] = {"rss_mib": {"started": rss["started"], "warm": rss["warm"],
                                             "after_publication": rss["after"]},
                                 "rounds": [],
                                 "publication": {"figures": done["figures"],
                                                 "swap": done["swap"]}}
                print(_summary_line(f"{mode} publication round", done["figures"]), flush=True)
            per_round = args.requests // args.rounds
            timed = {mode: [] for mode in servers}
            counters = {mode: batching_statistics(server) for mode, server in servers.items()}
            for r, order in harness.flipped(servers, args.rounds):
                for mode in order:
                    specs = mix(versions, per_round, args.seed + 100 + r, pinned=2,
                                max_request_bytes=args.max_request_bytes)
                    run = run_load(servers[mode], specs, args.clients)
                    failures[mode] += [f"round {r}: {f}" for f in
                                       check(run, versions, lambda o: {2})]
                    timed[mode].append(run)
                    f = figures([run])
                    results[mode]["rounds"].append(
                        {k: f[k] for k in ("requests", "seconds", "requests_per_s",
                                           "valid_sentences_per_s", "latency_ms_p50",
                                           "latency_ms_p99", "server_errors_5xx")})
                    print(_summary_line(f"{mode} round {r}", f), flush=True)
            for mode, server in servers.items():
                time.sleep(0.5)
                rss = results[mode]["rss_mib"]
                rss["after"] = server.rss_mib()
                rss["peak"] = max([rss["after"]] + [s for run in timed[mode]
                                                    for s in run.rss_samples])
                rss["limit"] = memory_limit(rss["warm"])
                if rss["after"] > rss["limit"]:
                    failures[mode].append(f"RSS {rss['after']:.0f} MiB after the run, over "
                                          f"{rss['limit']:.0f} MiB")
                results[mode]["figures"] = figures(timed[mode])
                results[mode]["batches"] = batches_between(counters[mode],
                                                           batching_statistics(server))
                results[mode]["failures"] = failures[mode][:50]
                results[mode]["failure_count"] = len(failures[mode])
        finally:
            for server in servers.values():
                server.stop()
    load["after"] = os.getloadavg()
    report.update(load_average=load, results=results)
    if "batching" in results and "plain" in results:
        report["batching_over_plain_requests_per_s"] = harness.ratios(
            *([r["requests_per_s"] for r in results[mode]["rounds"]]
              for mode in ("batching", "plain")))
    print(f"{record['cpu']['model']} ({', '.join(record['cpu']['flags'])}), "
          f"{record['cpu']['cores']} cores; load average before {load['before']}, "
          f"after {load['after']}")
    for mode, result in results.items():
        rss = result["rss_mib"]
        print(_summary_line(f"{mode} (timed rounds)", result["figures"]))
        if result["batches"]:
            print(f"  {'':30s} {result['batches']['rows_per_batch']:.1f} sentences and "
                  f"{result['batches']['requests_per_batch']:.1f} requests per model call")
        print(f"  {'':30s} RSS MiB: warm {rss['warm']:.0f}, after publication "
              f"{rss['after_publication']:.0f}, after {rss['after']:.0f}, peak "
              f"{rss['peak']:.0f}, limit {rss['limit']:.0f}; failures "
              f"{result['failure_count']}")
        for failure in result["failures"][:10]:
            print(f"    {failure}")
    if "batching_over_plain_requests_per_s" in report:
        ratio = report["batching_over_plain_requests_per_s"]
        print(f"batching / plain requests/s: median {ratio['median']:.3f} "
              f"(rounds {', '.join(f'{x:.3f}' for x in ratio['rounds'])})")
    harness.write_result(report, record, "serve-load", args.json)
    return report
