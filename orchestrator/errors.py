"""Typed errors for mistakes a user can fix.

Every user error names where the mistake is (file, line, field) and carries a "To fix:" line. The
CLI prints ``render()`` and exits with code 2, never a traceback. Internal invariants use
``assert`` instead; anything else that escapes is a bug.
"""

from __future__ import annotations

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A mistake in the user's input: a recipe, a plan, a config file or a command line."""

    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        also: tuple[UserError, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.file = file
        self.line = line
        self.field = field
        self.also = also  # further problems found in the same pass, reported after this one

    def where(self) -> str:
        """``file:line: field`` with whatever parts are known."""
        place = ""
        if self.file:
            place = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.field:
            place = f"{place}: {self.field}" if place else self.field
        return place

    def render(self) -> str:
        """The text the CLI prints: where, what, and what to do; then any further problems."""
        head = f"{self.where()}: {self.message}" if self.where() else self.message
        text = head if not self.fix else f"{head}\n  To fix: {self.fix}"
        return "\n".join([text, *(other.render() for other in self.also)])

    def __str__(self) -> str:
        return self.render()

    def __reduce__(self):
        # sent between processes (the driver runs as a Ray actor): rebuilt with its fields, not
        # from ``args`` alone as exceptions are by default
        fields = {"fix": self.fix, "file": self.file, "line": self.line, "field": self.field}
        return (_rebuild, (type(self), self.message, fields, self.also))


def _rebuild(cls, message: str, fields: dict, also: tuple) -> UserError:
    return cls(message, also=also, **fields)


class RecipeError(UserError):
    """A recipe (YAML) is malformed, has unknown keys, wrong types or impossible values."""


def together(problems: list[RecipeError]) -> RecipeError:
    """Several problems as one error: the first, with the others (and theirs) after it."""
    flat = [p for problem in problems for p in (problem, *problem.also)]
    first = flat[0]
    return RecipeError(
        first.message,
        file=first.file,
        line=first.line,
        field=first.field,
        fix=first.fix,
        also=tuple(
            RecipeError(p.message, file=p.file, line=p.line, field=p.field, fix=p.fix)
            for p in flat[1:]
        ),
    )


class CatalogError(UserError):
    """A file under configs/ (or one passed in its place) has a bad row or value."""
