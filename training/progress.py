"""The training progress display: one bar, log lines printed above it.

On a terminal, `TrainingProgress` shows a `rich` bar with the current
step's loss (not a running average), the learning rate, tokens/s and the
ETA, and routes the log records of the run through `rich`'s
`RichHandler` on the same console, so each log line is printed above the
bar instead of being glued onto it. Without a terminal (CI, a pipe, a
file) there is no bar: the usual plain log lines are the whole output.

`rich` ships with Keras (a Keras dependency), so nothing is added.
"""

import logging
import sys
import time


class TrainingProgress:
    """Context manager; call `update(step, loss, lr, tokens)` after each step.

    Args:
        total: int. The last step of the run.
        start: int. The step the run starts from (a resume starts later).
        enabled: bool. `--progress` was given.
        console: optional `rich.console.Console` (tests pass one writing to
            a buffer with `force_terminal=True`); default: stderr.
    """

    def __init__(self, total, start=0, enabled=True, console=None):
        self.total = total
        self.start = start
        self.enabled = bool(enabled)
        self.console = console
        self._progress = None
        self._task = None
        self._handlers = []
        self._started = None
        self._tokens = 0

    def _terminal_console(self):
        from rich.console import Console

        console = self.console or Console(file=sys.stderr)
        return console if console.is_terminal else None

    def __enter__(self):
        if not self.enabled:
            return self
        console = self._terminal_console()
        if console is None:  # no terminal: plain log lines, no bar
            return self
        from rich.logging import RichHandler
        from rich.progress import BarColumn
        from rich.progress import MofNCompleteColumn
        from rich.progress import Progress
        from rich.progress import TextColumn
        from rich.progress import TimeRemainingColumn

        self._progress = Progress(
            TextColumn("train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), TimeRemainingColumn(),
            console=console, transient=False,
        )
        self._task = self._progress.add_task(
            "train", total=self.total, completed=self.start, status="",
        )
        # Log records go through the bar's console (printed above it), in
        # place of the stream handlers that would write into the bar's line.
        root = logging.getLogger()
        rich_handler = RichHandler(console=console, show_path=False,
                                   rich_tracebacks=False)
        rich_handler.setLevel(root.level)
        for handler in list(root.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                root.removeHandler(handler)
                self._handlers.append(handler)
        root.addHandler(rich_handler)
        self._rich_handler = rich_handler
        self._progress.start()
        return self

    def update(self, step, loss, lr, tokens):
        """The bar shows this step's values (the log line's loss is the
        mean over its window; both name their step)."""
        if self._progress is None:
            return
        now = time.perf_counter()
        if self._started is None:  # the rate counts from the first step on
            self._started, rate = now, ""
        else:
            self._tokens += tokens
            rate = f" | {self._tokens / max(now - self._started, 1e-9):,.0f} tok/s"
        self._progress.update(
            self._task, completed=step,
            status=f"loss {loss:.4f} | lr {lr:.2e}{rate}",
        )

    def __exit__(self, *exc):
        if self._progress is None:
            return False
        self._progress.stop()
        root = logging.getLogger()
        root.removeHandler(self._rich_handler)
        for handler in self._handlers:
            root.addHandler(handler)
        self._handlers = []
        self._progress = None
        return False
