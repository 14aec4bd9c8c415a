"""How `andrea train` stops on a signal: Ctrl-C, `kill` / `timeout` / a service manager's stop
(SIGTERM) and a closed terminal or ssh session (SIGHUP) all stop the run as Ctrl-C does. While
the page is driven the first one is only noted (PageInterrupt: the watch loop then stops the
run) and a second one raised; around the whole command, SIGTERM and SIGHUP raise as Ctrl-C does
(stop_signals_interrupt), so the run is stopped, the server the command started stopped and its
JSON printed."""

from __future__ import annotations

import contextlib
import signal
import threading

INTERRUPTED = "interrupted from the command line"     # a stopped run's message after Ctrl-C

# The signals that stop a run as Ctrl-C does: a terminal's Ctrl-C, `kill` / `timeout` / a
# service manager's stop, and a closed terminal or ssh session.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


class PageInterrupt:
    """Ctrl-C (or SIGTERM, SIGHUP) while the page is driven: the first one is noted (the watch
    loop then stops the run) instead of raised wherever the main thread happens to be; raised
    inside Playwright's event loop, a KeyboardInterrupt can leave its connection waiting
    forever. A second one is raised at once. Outside the main thread, nothing is installed."""

    def __init__(self):
        self.seen = False
        self._previous = {}

    def _handler(self, signum, frame):
        if self.seen:
            raise KeyboardInterrupt
        self.seen = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        return False


@contextlib.contextmanager
def stop_signals_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does: the run is stopped, the
    server this command started is stopped and the JSON printed. (By default they killed the
    command on the spot, and its server, in a session of its own, went on holding the data
    dir.) Only where they are at their default, and in the main thread."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS
                    if sig != signal.SIGINT and signal.getsignal(sig) == signal.SIG_DFL}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
