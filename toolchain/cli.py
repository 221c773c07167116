"""`raytrain`: the project's tasks (tasks.py) behind the one error boundary, from any directory.

`invoke` works beside tasks.py; `raytrain` is the same collection, found through the installed
package, with Invoke's own configuration loading (system and user files, the project's
invoke.yaml, `-f FILE`) inside the boundary: a YAML syntax error, an unknown file type, a list
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

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where tasks.py and the project's invoke.yaml live


def _refuse_duplicate_keys(path: Path) -> None:
    """A YAML configuration file whose mapping names a key twice: Invoke (and YAML) keep the last one
    silently, so the first value vanishes unseen. Refused, as duplicate keys in specs and records are."""
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return
    import yaml

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise boundary.ConfigFileError(f"{path}: line {key_node.start_mark.line + 1}: key {key!r} appears twice "
                                               "in one mapping; keep one (YAML keeps the last silently)")
            seen.add(key)
        return loader.construct_mapping(node, deep)
    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        yaml.load(path.read_text(encoding="utf-8"), Loader=Strict)  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return  # Invoke's own loading reports these, through the boundary


def _config_error(phase: str, e: Exception) -> boundary.ConfigFileError:
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
        for name in ("invoke.yaml", "invoke.yml"):
            _refuse_duplicate_keys(PROJECT_ROOT / name)
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

    def update_config(self, merge: bool = True) -> None:
        runtime_file = self.args.config.value
        if runtime_file and not Path(runtime_file).is_file():
            raise boundary.ConfigFileError(f"-f {runtime_file}: no such file (Invoke would ignore it silently); "
                                           "give an existing YAML, JSON or .py configuration file")
        if runtime_file:
            _refuse_duplicate_keys(Path(runtime_file))
        try:
            super().update_config(merge=merge)
        except Exception as e:  # noqa: BLE001
            raise _config_error(f"-f {runtime_file}" if runtime_file else "INVOKE_* variables", e) from None


def main(argv: Optional[list[str]] = None) -> None:
    program = RaytrainProgram(name="raytrain", binary="raytrain", binary_names=["raytrain"], version=__version__)
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
