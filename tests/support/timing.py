"""Which of two ways of doing the same work costs less, inside one test:
alternating rounds, each way's best round, in CPU seconds of the test's
process (its threads included, tf.data's too), so that another process's
load on the machine, which wall time would count, does not."""

import time


def best_cpu_seconds(calls, rounds=3):
    """Runs each of `calls` (`{name: function()}`) once a round, in turn,
    for `rounds` rounds.

    Returns: `(seconds, results)`: each name's least CPU seconds over the
    rounds, and what its function returned, which must be the same in
    every round.
    """
    seconds, results = {}, {}
    for _ in range(rounds):
        for name, call in calls.items():
            started = time.process_time()
            result = call()
            spent = time.process_time() - started
            assert results.setdefault(name, result) == result, f"{name} changed between rounds"
            seconds[name] = min(seconds.get(name, spent), spent)
    return seconds, results
