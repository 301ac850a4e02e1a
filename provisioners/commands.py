"""Running a system command (``ip``, ``wg``, ...) with a deadline, its failure a typed error that
names the command and carries the end of its stderr."""

from __future__ import annotations

import subprocess

COMMAND_TIMEOUT_S = 10.0


class CommandError(RuntimeError):
    """A command failed, was missing or ran past its deadline."""


def run_command(
    args: list[str],
    *,
    error: type[CommandError] = CommandError,
    input_text: str | None = None,
    timeout_s: float = COMMAND_TIMEOUT_S,
    install_hint: str = "",
    env: dict[str, str] | None = None,
) -> str:
    """The command's stdout; ``error`` (a CommandError subclass) when it fails."""
    try:
        done = subprocess.run(
            args,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise error(f"{args[0]} not found{'; ' + install_hint if install_hint else ''}") from None
    except subprocess.TimeoutExpired:
        raise error(f"{' '.join(args[:4])} did not finish in {timeout_s} s") from None
    if done.returncode != 0:
        raise error(f"{' '.join(args[:5])} failed: {done.stderr.strip()[-400:]}")
    return done.stdout
