"""A process that blocks with known stacks, for the `ddpdoctor stacks` tests (any CPython 3.x).

Main thread: a method (qualified name), a generator, a lambda, non-ASCII names (1- and 2-byte strings)
and a recursion, then blocked in an Event wait; a second thread blocked elsewhere. Prints "ready" once
both are in place.
"""

import sys
import threading

released = threading.Event()
parked = threading.Event()


def worker_waits() -> None:
    parked.set()
    released.wait()


def größe(depth: int) -> None:
    if depth:
        größe(depth - 1)
        return
    print("ready", flush=True)
    released.wait()


def 関数() -> None:
    größe(3)


class Trainer:
    def step(self) -> None:
        for _ in self.batches():
            pass

    def batches(self):  # type: ignore[no-untyped-def]
        (lambda: 関数())()
        yield 1


if __name__ == "__main__":
    threading.Thread(target=worker_waits, name="worker", daemon=True).start()
    parked.wait()
    Trainer().step()
    sys.exit(0)
