"""The target flags of `invoke deploy`, generated from the targets' Options models.

Each target option's type, help and default live in one place, its target's `Options` model
(a pydantic field with a `description`; bounds as `ge`/`le`), the way TorchX's `runopts` carry
them; the CLI is built from the union of every target's fields:

    FLAGS = TargetFlags.collect(TARGETS)    # one TargetFlag per field name, with the targets taking it
    @task(help={**job_help, **FLAGS.help()})
    @FLAGS.add_to                           # the deploy function's signature gains one parameter each
    def deploy(c, ..., **options): flags = FLAGS.given(options)   # only what the user set, parsed

What a field's type makes of its flag:
    bool            a switch (default False: not given)
    int             a value, a whole number of ASCII digits within the field's ge/le (numbers.whole)
    str, list[...]  a value passed on as text; a list field's own validator turns the text into the
                    list (seeds.Seeds, k8s.Slots), so the string becomes a list in exactly one place
A field marked `json_schema_extra={"cli": False}` is not a flag but plumbing the target sets itself
(pyxis' sqsh_dir, from Target.build_dir_options). Two targets that define the same field must agree
on its type, help, default and bounds; `collect` refuses them otherwise (the CLI could not say which one a flag means).
"""
from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import annotated_types
from pydantic.fields import FieldInfo

from deploy.targets.base import is_cli
from runtime import numbers

WHOLE_MAX = numbers.COUNT_MAX  # a whole-number flag without a `le` bound


class FlagConflict(TypeError):
    """Two targets define one option differently, or an option the CLI cannot express."""


def _kind(name: str, annotation: Any) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union and len(args) == 1:  # Optional[X]
        annotation = args[0]
    if annotation is bool:
        return "switch"
    if annotation is int:
        return "whole"
    if annotation is str or typing.get_origin(annotation) is list:
        return "text"
    raise FlagConflict(f"option {name!r}: the CLI has no flag for a {annotation!r} field "
                       "(bool, int, str and list[...] with a text validator are supported)")


def _bounds(field: FieldInfo) -> tuple[int, int]:
    low, high = 0, WHOLE_MAX
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            low = int(m.ge)
        elif isinstance(m, annotated_types.Gt):
            low = int(m.gt) + 1
        elif isinstance(m, annotated_types.Le):
            high = int(m.le)
        elif isinstance(m, annotated_types.Lt):
            high = int(m.lt) - 1
    return low, high


def _identity(field: FieldInfo) -> tuple:
    """What two targets' definitions of one option must share."""
    return (repr(field.annotation), field.description, repr(field.get_default(call_default_factory=True)),
            repr(field.metadata))


@dataclass(frozen=True)
class TargetFlag:
    name: str                  # the Options field; the flag is --name-with-dashes
    field: FieldInfo           # the first definition (every other one agrees with it)
    targets: tuple[str, ...]   # the targets whose Options define it, in TARGETS order
    every_target: bool         # all targets take it

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def kind(self) -> str:
        return _kind(self.name, self.field.annotation)

    @property
    def bounds(self) -> tuple[int, int]:
        return _bounds(self.field)

    @property
    def cli_default(self) -> Any:
        """What Invoke sees: False makes a switch, None a flag that takes a value; either means 'not given'."""
        return False if self.kind == "switch" else None

    @property
    def help(self) -> str:
        who = "every target" if self.every_target else "/".join(self.targets)
        text = f"{who}: {self.field.description}"
        if self.kind == "whole":
            low, high = self.bounds
            text += f" A whole number, {low}-{high}." if high != WHOLE_MAX else f" A whole number >= {low}."
        return text

    def parse(self, value: Any) -> Any:
        """The value to hand the target: a whole number checked against the field's bounds (InputError
        naming the flag otherwise), anything else as given (the Options model validates it)."""
        if self.kind == "whole":
            low, high = self.bounds
            return numbers.whole(str(value), self.flag, low, high)
        return value


class TargetFlags:
    def __init__(self, flags: dict[str, TargetFlag]):
        self.flags = flags

    @classmethod
    def collect(cls, targets: Mapping[str, Any]) -> "TargetFlags":
        """The union of every target's Options fields; a field two targets define differently is refused."""
        seen: dict[str, tuple[FieldInfo, list[str]]] = {}
        for tname, target in targets.items():
            for name, field in target.Options.model_fields.items():
                if not is_cli(field):
                    continue
                if not field.description:
                    raise FlagConflict(f"{tname}: option {name!r} has no description (it is the flag's --help)")
                _kind(name, field.annotation)
                if name not in seen:
                    seen[name] = (field, [tname])
                    continue
                first, owners = seen[name]
                if _identity(first) != _identity(field):
                    diff = [what for what, a, b in zip(("type", "help", "default", "constraints"),
                                                       _identity(first), _identity(field)) if a != b]
                    raise FlagConflict(f"option {name!r}: targets {owners[0]} and {tname} define it with a different "
                                       f"{', '.join(diff)}; one flag means one option: make them agree "
                                       "(share one Annotated type)")
                owners.append(tname)
        return cls({name: TargetFlag(name, field, tuple(owners), len(owners) == len(targets))
                    for name, (field, owners) in sorted(seen.items())})

    def __iter__(self):
        return iter(self.flags.values())

    def __contains__(self, name: str) -> bool:
        return name in self.flags

    def help(self) -> dict[str, str]:
        """Invoke's help= entries, keyed by parameter name."""
        return {f.name: f.help for f in self}

    def add_to(self, func: Callable) -> Callable:
        """Give FUNC (`def deploy(c, <job flags>, **options)`) a signature with one keyword parameter per
        target flag in place of **options; Invoke reads `inspect.signature`, which honours __signature__."""
        sig = inspect.signature(func)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        if len(params) == len(sig.parameters):
            raise TypeError(f"{func.__name__} needs a **options parameter to receive the target flags")
        clash = sorted(set(self.flags) & {p.name for p in params})
        if clash:
            raise FlagConflict(f"target option(s) {clash} clash with {func.__name__}'s own parameters")
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.cli_default) for f in self]
        func.__signature__ = sig.replace(parameters=params)
        return func

    def given(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Only the flags the user set (not None, not False), parsed; the target refuses one it does not take."""
        unknown = sorted(set(values) - set(self.flags))
        if unknown:
            raise TypeError(f"not target flags: {unknown}")
        return {name: self.flags[name].parse(v) for name, v in values.items() if v is not None and v is not False}

    def get(self, name: str) -> Optional[TargetFlag]:
        return self.flags.get(name)


def _all() -> TargetFlags:
    from deploy.targets import TARGETS  # the package imports every target module; none imports this one
    return TargetFlags.collect(TARGETS)


FLAGS = _all()
