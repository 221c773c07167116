"""`raytrain`: the task collection (toolchain/tasks.py) behind the one error boundary, in the project
found from the current directory (toolchain/project.py).

Every configuration file (system and user files, the project's settings and an invoke.yaml beside
them, `-f FILE`, INVOKE_RUNTIME_CONFIG) is read by the bounded loader of toolchain/config_files.py and
Invoke's merge runs inside the boundary: an alias bomb, deep nesting, a YAML syntax error, an unknown
file type, a list where a mapping belongs or a `-f` file that does not exist is one line and exit 2,
not a traceback.
"""
from __future__ import annotations

import copy
import importlib
import os
import sys
from pathlib import Path
from typing import Optional

from invoke import Collection, Exit, Program
from invoke.config import AmbiguousMergeError, Config, merge_dicts

from toolchain import __version__, boundary, config_files, project


class RaytrainConfig(Config):
    """Invoke's Config with every configuration file read by toolchain/config_files.py (system, user,
    project, -f), and the project's settings (toolchain/project.py: raytrain.yaml or [tool.raytrain]) at
    its project level, above an invoke.yaml beside them: defaults < /etc/invoke.yaml < ~/.invoke.yaml < invoke.yaml < the
    project's settings < INVOKE_* < -f FILE < flags."""

    def load_project(self, merge: bool = True) -> None:
        super().load_project(merge=False)
        located = project.locate()
        if located.found and located.settings:
            self._set(_project=merge_dicts(copy.deepcopy(self._project or {}), copy.deepcopy(located.settings)))
        if merge:
            self.merge()

    def _load_yaml(self, path):
        return config_files.load_yaml(path)

    _load_yml = _load_yaml

    def _load_json(self, path):
        return config_files.load_json(path)


def _config_error(phase: str, e: Exception) -> boundary.ConfigFileError:
    if isinstance(e, boundary.ConfigFileError):  # config_files said it already, naming the file
        return e
    detail = " ".join(str(e).split())[:400] or type(e).__name__
    return boundary.ConfigFileError(
        f"Invoke configuration ({phase}): {detail}; fix or remove that file (YAML, JSON or .py, a mapping of "
        "settings such as `deploy: {nodes: 2}`)")


class RaytrainProgram(Program):
    """Invoke's Program with the collection loaded from the project and config loading checked."""

    def create_config(self) -> None:
        try:
            super().create_config()  # system and user files (/etc/invoke.yaml, ~/.invoke.yaml)
        except Exception as e:  # noqa: BLE001 - any failure here is a file the user can fix
            raise _config_error("/etc/invoke.* or ~/.invoke.*", e) from None

    def load_collection(self) -> None:
        root = project.locate().root  # the project's (or, outside one, the current directory)
        try:
            self.config.set_project_location(str(root))
            self.config.load_project()
        except boundary.ConfigFileError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _config_error(f"{root}/invoke.*", e) from None
        module = importlib.import_module("toolchain.tasks")
        self.collection = Collection.from_module(module, loaded_from=str(root),
                                                 auto_dash_names=self.config.tasks.auto_dash_names)

    def print_help(self) -> None:
        """`raytrain`, `raytrain --help`: the tasks first, one line each, then Invoke's core options."""
        if getattr(self, "collection", None) is None:  # a bare --help comes before the collection is loaded
            self.load_collection()
        print("Usage: raytrain TASK [--TASK-OPTS] [TASK ...]    e.g. raytrain build push deploy --target local")
        print("       raytrain TASK --help                      a task's options")
        print("")
        self.list_format, self.list_depth, self.list_root, self.scoped_collection = "flat", None, None, self.collection
        self.list_tasks()
        print("Core options (Invoke's; rarely needed):")
        print("")
        self.print_columns(self.initial_context.help_tuples())

    def update_config(self, merge: bool = True) -> None:
        runtime_file = self.args.config.value
        if runtime_file and not Path(runtime_file).exists():  # a FIFO or a directory: config_files names it
            raise boundary.ConfigFileError(f"-f {runtime_file}: no such file (Invoke would ignore it silently); "
                                           "give an existing YAML, JSON or .py configuration file")
        try:
            super().update_config(merge=merge)
        except Exception as e:  # noqa: BLE001
            raise _config_error(f"-f {runtime_file}" if runtime_file else "INVOKE_* variables", e) from None


HELP_FLAGS = ("--help", "-h")


def task_help_first(argv: list[str]) -> list[str]:
    """`raytrain TASK --help` as Invoke's `raytrain --help TASK`, for every task: Invoke would give the
    `--help` of a task whose first argument is positional (`spec.check FILE`) to that argument."""
    for i in range(2, len(argv)):
        if argv[i] in HELP_FLAGS and not argv[i - 1].startswith("-") and argv[i - 1] in _task_names():
            return [argv[0], "--help", argv[i - 1]]
    return argv


def _task_names() -> set[str]:
    module = importlib.import_module("toolchain.tasks")
    collection = Collection.from_module(module)
    return set(collection.task_names) | {alias for aliases in collection.task_names.values() for alias in aliases}


def main(argv: Optional[list[str]] = None) -> None:
    argv = task_help_first(list(sys.argv if argv is None else argv))
    program = RaytrainProgram(name="raytrain", binary="raytrain", binary_names=["raytrain"], version=__version__,
                              config_class=RaytrainConfig)
    try:
        program.run(argv)
    except (SystemExit, KeyboardInterrupt, Exit):
        raise
    except BrokenPipeError:  # `raytrain --help | head`: the reader left, as for any Unix tool; nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit writes nowhere
        sys.exit(141)  # 128 + SIGPIPE, as a shell reports a tool the pipe ended
    except Exception as e:  # noqa: BLE001 - the boundary decides what is the user's doing
        if isinstance(e, AmbiguousMergeError):  # raised while the files are merged, just before the first task
            e = _config_error("a file's value where the defaults have a mapping", e)
        failure = boundary.explain(e)
        if failure is None:
            sys.exit(boundary.report_bug(e))
        print(failure.message, file=sys.stderr)
        sys.exit(failure.code)


if __name__ == "__main__":
    main()
