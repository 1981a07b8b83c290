"""The two ways a simulation refuses to run: bad input, and a schedule that cannot make progress."""


class InputError(ValueError):
    """An invalid parameter. The message is one line: which parameter, and what is allowed.

    The CLI prints it and exits with code 2.
    """

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(f"{param}: {message}")


class DeadlockError(RuntimeError):
    """The schedule's dependencies cannot make progress; `blocked` lists the ops that wait forever."""

    def __init__(self, blocked: list[str]):
        self.blocked = blocked
        shown = "; ".join(blocked[:8]) + (f"; ... ({len(blocked)} in all)" if len(blocked) > 8 else "")
        super().__init__(f"deadlock: no op can make progress: {shown}")
