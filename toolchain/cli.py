"""`raytrain`: the project's tasks (tasks.py) behind the one error boundary, from any directory.

`invoke` works beside tasks.py; `raytrain` is the same collection, found through the installed
package, with every configuration file (system and user files, the project's invoke.yaml, `-f FILE`,
INVOKE_RUNTIME_CONFIG) read by the bounded loader of toolchain/config_files.py and Invoke's merge
inside the boundary: an alias bomb, deep nesting, a YAML syntax error, an unknown file type, a list
where a mapping belongs or a `-f` file that does not exist is one line and exit 2, not a traceback.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Optional

from invoke import Collection, Exit, Program
from invoke.config import AmbiguousMergeError

from toolchain import __version__, boundary
from toolchain.config_files import RaytrainConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where tasks.py and the project's invoke.yaml live


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
        try:
            self.config.set_project_location(str(PROJECT_ROOT))
            self.config.load_project()
        except Exception as e:  # noqa: BLE001
            raise _config_error(f"{PROJECT_ROOT}/invoke.*", e) from None
        spec = importlib.util.spec_from_file_location("tasks", PROJECT_ROOT / "tasks.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["tasks"] = module
        spec.loader.exec_module(module)
        self.collection = Collection.from_module(module, loaded_from=str(PROJECT_ROOT),
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


def main(argv: Optional[list[str]] = None) -> None:
    program = RaytrainProgram(name="raytrain", binary="raytrain", binary_names=["raytrain"], version=__version__,
                              config_class=RaytrainConfig)
    try:
        program.run(argv)
    except (SystemExit, KeyboardInterrupt, Exit):
        raise
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
