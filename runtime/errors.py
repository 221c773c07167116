"""The one error base of the project, with the exit code the CLI ends with.

Every user-facing error (bad spec, bad flag, a pre-flight problem, a failed build or push) is a
RaytrainError: its message names the input, what was wrong and what to do. Anything else reaching
the CLI is a bug. The runtime package holds it because the in-image runtime raises them too, and
everything else depends on the runtime, never the other way.
"""
from __future__ import annotations


class RaytrainError(Exception):
    """A failure the user can act on (exit code 1): a build, push or run that did not work."""

    exit_code = 1


class InputError(RaytrainError, ValueError):
    """Bad input (a flag, a spec, a recorded file, a scheduler variable): nothing was changed (exit 2)."""

    exit_code = 2
