"""The build side's errors, under the project's one base (runtime.errors); every message carries
the inputs that caused it and what to do."""
from runtime.errors import InputError, RaytrainError


class ToolchainError(RaytrainError):
    """A build, push or run that did not work (exit code 1)."""


class ConfigError(ToolchainError, InputError):
    """Bad configuration, flag or spec: nothing was changed (exit code 2)."""

    exit_code = 2


class BootstrapError(ToolchainError):
    """The offline base image could not be made."""


class WheelhouseError(ToolchainError):
    """pip could not download the locked requirement set on the host."""


class BuildError(ToolchainError):
    """A docker build step failed; carries the stage, the image and the log tail."""

    def __init__(self, stage: str, tag: str, message: str, log_tail: list[str]):
        self.stage, self.tag, self.log_tail = stage, tag, log_tail
        tail = "".join(f"\n    {line}" for line in log_tail[-15:])
        super().__init__(f"building the {stage} layer ({tag}) failed: {message}" + (f"\n  last build output:{tail}" if tail else ""))


# the registry's errors are the registry package's (typed by status and code), one class each
from deploy.registry.errors import RegistryError, TransientRegistryError  # noqa: E402,F401 (re-exported)
