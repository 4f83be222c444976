"""What a long job is doing and how far it is, on stderr.

Where stderr is a terminal, one line redrawn in place: a bar with the steps done (when the
total is known), what is running now and the time since it started, refreshed every second
while a step runs. Anywhere else (a log, a pipe, CI), plain lines: one per step, and one
every ``heartbeat`` seconds while a step takes long, so a log shows that the job is alive.

    with Progress("lint u280x4", total=3) as p:
        for top in tops:
            p.step(top)            # starts the next step, named
            p.note("verilator")    # what this step is doing now
            ...

Nothing here needs a third-party package.
"""

import sys
import threading
import time

__all__ = ["Progress", "quiet"]


def _clock(seconds):
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """Progress of a job of ``total`` steps (None: unknown) on ``stream`` (stderr).

    Parameters
    ----------
    what : str
        The job, as the first words of every line ("lint u280x4").
    total : int or None
        Number of steps, for the bar and the "k/total" count.
    stream : file, optional
        Where to write; ``sys.stderr`` when None.
    tty : bool, optional
        Force the terminal (True) or plain-line (False) form; by default, whether ``stream``
        is a terminal.
    heartbeat : float
        Plain form: seconds between "still running" lines within one step.
    grace : float
        Plain form: print nothing during the first ``grace`` seconds (a short job leaves no
        lines in a log); a job still running then prints its state and goes on as usual.
    """

    def __init__(self, what, total=None, *, stream=None, tty=None, heartbeat=60.0, grace=0.0,
                 width=24):
        self.what, self.total = what, total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.heartbeat, self.grace, self.width = heartbeat, grace, width
        self._pending = False
        self.done, self.label, self.detail = 0, "", ""
        self.t0 = self.t_step = self.t_beat = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._drawn = False
        self.closed = False

    # -- the job's calls ---------------------------------------------------------------------
    def step(self, label, detail=""):
        """Start the next step (the previous one counts as done, if any)."""
        with self._lock:
            if self.closed:
                return
            if self.label:
                self.done += 1
            self.label, self.detail = label, detail
            self.t_step = self.t_beat = time.monotonic()
            self._show(new=True)
        self._start_ticker()

    def note(self, detail):
        """What the current step is doing now."""
        with self._lock:
            if self.closed:
                return
            self.detail = detail
            self._show(new=True)
        self._start_ticker()

    def advance(self, n=1, detail=None):
        """Count ``n`` steps done without naming them (loops of many small steps)."""
        with self._lock:
            if self.closed:
                return
            self.done += n
            if detail is not None:
                self.detail = detail
            self._show(new=not self.tty and self._due())
        self._start_ticker()

    def log(self, msg, file=None):
        """A line of its own (a result worth keeping) on ``file`` (default: the progress
        stream), printed above the bar."""
        with self._lock:
            was = self._drawn
            self._clear()
            print(msg, file=file or self.stream, flush=True)
            if was:
                self._show(new=False)

    def close(self, msg=None):
        """Stop; the bar is erased (terminal) and ``msg``, if any, printed. Later calls do
        nothing."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.label and self.total is not None and self.done < self.total:
                self.done += 1
            self._clear()
            if msg:
                print(f"{self.what}: {msg} ({_clock(time.monotonic() - self.t0)})", file=self.stream,
                      flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- drawing -------------------------------------------------------------------------------
    def _due(self):
        return time.monotonic() - self.t_beat >= self.heartbeat

    def _count(self):
        if self.total is None:
            return f"{self.done}" if self.done else ""
        return f"{min(self.done + bool(self.label), self.total)}/{self.total}"

    def _text(self):
        now = time.monotonic()
        parts = [self.what + ":"]
        if self.total:
            fill = round(self.width * min(self.done, self.total) / self.total)
            parts.append("[" + "#" * fill + "." * (self.width - fill) + "]")
        count = self._count()
        if count:
            parts.append(count)
        if self.label:
            parts.append(self.label)
        if self.detail:
            parts.append(f"({self.detail})")
        parts.append(_clock(now - (self.t_step if self.label else self.t0)))
        return " ".join(parts)

    def _show(self, new):
        if self.tty:
            cols = _columns(self.stream)
            self.stream.write("\r" + self._text()[:cols - 1] + "\x1b[K")
            self.stream.flush()
            self._drawn = True
        elif new:
            if time.monotonic() - self.t0 < self.grace:
                self._pending = True
                return
            self._pending = False
            print(self._text(), file=self.stream, flush=True)
            self.t_beat = time.monotonic()

    def _clear(self):
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _start_ticker(self):
        if self._thread is not None or self._stop.is_set() or self.closed:
            return
        self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._thread.start()

    def _tick(self):
        while not self._stop.wait(1.0):
            with self._lock:
                if self.tty:
                    self._show(new=False)
                elif self._due() or self._pending:
                    self._show(new=True)


class _Quiet:
    """A Progress that says nothing (library calls without a progress display)."""

    total = None

    def step(self, label, detail=""):
        pass

    def note(self, detail):
        pass

    def advance(self, n=1, detail=None):
        pass

    def log(self, msg, file=None):
        pass

    def close(self, msg=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def quiet():
    """A progress object that prints nothing."""
    return _Quiet()


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _columns(stream):
    import shutil
    return max(20, shutil.get_terminal_size((100, 24)).columns)
