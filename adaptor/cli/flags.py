"""Flags derived from the setting declarations (`providers.core.settings`), with env twins.

`add_settings(parser, Section, ...)` adds one long flag per declared field: its type, help,
default and `PEERPODS_*` twin all come from the declaration. Flags are added with no argparse
default; after parsing, `resolve(args)` fills every setting the command line did not give from
its env twin, parsed and checked by the same `Setting.parse` as the flag (an invalid value is an
`InvalidRequest` naming the variable), or else from the declared default. Only the chosen
subcommand's settings are resolved, so one command's env twin never fails another command.
`section(Section, args)` then builds the typed section the command runs with.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, create_model

from providers.core.errors import InvalidRequest
from providers.core.settings import (
    Flag,
    Section,
    Setting,
    describe,
    env_name,
    parse_duration,
    settings,
)

__all__ = [
    "add",
    "add_settings",
    "declared",
    "duration",
    "env_name",
    "resolve",
    "section",
    "section_values",
]

M = TypeVar("M", bound=BaseModel)
_KEY = "_setting:"


def add_settings(
    parser: argparse.ArgumentParser, *sections: type[BaseModel], help: str | None = None
) -> None:
    """Add the flags of the sections' settings. One declaration reached through two sections
    (the clouds' common settings) is added once; two different ones of the same flag are an
    error. `help` replaces every flag's own text."""
    for setting in settings(*sections):
        kwargs: dict[str, Any] = {
            "dest": setting.flag.dest,
            "default": argparse.SUPPRESS,
            "help": (help or _help(setting)).replace("%", "%%"),
        }
        if setting.is_switch:
            optional = setting.default is True
            kwargs["action"] = argparse.BooleanOptionalAction if optional else "store_true"
        else:
            kwargs["type"] = _converter(setting)
            if setting.flag.repeated:
                kwargs["action"] = "extend"
            metavar = setting.flag.metavar
            if metavar is None and setting.choices:
                metavar = "{" + ",".join(setting.choices) + "}"
            if metavar is not None:
                kwargs["metavar"] = metavar
        known = parser.get_default(_KEY + setting.flag.dest)
        if isinstance(known, Setting):
            if (known.flag, known.default, known.description) != (
                setting.flag,
                setting.default,
                setting.description,
            ):
                raise ValueError(f"{setting.flag.name} is declared twice, differently")
            continue  # one declaration reached through two sections (the clouds' common ones)
        parser.add_argument(setting.flag.name, **kwargs)
        parser.set_defaults(**{_KEY + setting.flag.dest: setting})


def declared(parser: argparse.ArgumentParser) -> list[Setting]:
    """The settings `add_settings` gave this parser (its own, not its subcommands')."""
    return [v for k, v in parser._defaults.items() if k.startswith(_KEY)]


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> None:
    """Fill the settings the command line did not give: env twin, else the declared default."""
    environ = os.environ if environ is None else environ
    for key, setting in list(vars(args).items()):
        if not key.startswith(_KEY):
            continue
        delattr(args, key)
        if not isinstance(setting, Setting) or hasattr(args, setting.flag.dest):
            continue
        env = setting.flag.env
        raw = environ.get(env)
        if raw is None:
            value = setting.default
        else:
            try:
                value = setting.parse(raw)
            except ValueError as exc:
                raise InvalidRequest(f"{env}: {exc}") from None
        setattr(args, setting.flag.dest, value)


def section_values(model: type[BaseModel], args: argparse.Namespace) -> dict[str, Any]:
    """The parsed values of a section's settings, by field name."""
    return {
        s.field: getattr(args, s.flag.dest) for s in settings(model) if hasattr(args, s.flag.dest)
    }


def section(model: type[M], args: argparse.Namespace, **extra: Any) -> M:
    """The section built from the parsed settings (and `extra` fields); InvalidRequest naming
    the flag when the section as a whole refuses them."""
    try:
        return model.model_validate({**section_values(model, args), **extra})
    except ValidationError as exc:
        raise InvalidRequest(describe(model, exc)) from None


def duration(text: str) -> float:
    """A duration flag value (`30s`, `5m`, `1h30m`, `250ms`) in seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _help(setting: Setting) -> str:
    shown = setting.shown_default()
    default = f" (default: {shown})" if shown else ""
    return f"{setting.description}{default} [env {setting.flag.env}]"


def _converter(setting: Setting) -> Any:
    def convert(text: str) -> Any:
        try:
            return setting.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = setting.flag.dest  # argparse names the type in some errors
    return convert


def add(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> None:
    """A flag declared in place, argparse-style (`default`, `type`, `choices`, `action`, `help`,
    `metavar`): made into a one-field section, so its env twin is resolved and checked like every
    other setting's. Prefer a field in a section model."""
    action = kwargs.pop("action", None)
    convert = kwargs.pop("type", None)
    default = kwargs.pop("default", None)
    marker = Flag(
        flag,
        metavar=kwargs.pop("metavar", None),
        choices=tuple(str(choice) for choice in kwargs.pop("choices", ()) or ()),
        duration=convert is duration,
    )
    description = kwargs.pop("help", "")
    if kwargs:
        raise TypeError(f"{flag}: unsupported argument(s) {', '.join(kwargs)}")
    annotation: Any
    if action == "store_true" or action is argparse.BooleanOptionalAction:
        annotation, default = Annotated[bool, marker], bool(default)
    elif marker.duration:
        annotation = Annotated[float, marker]
        default = parse_duration(default) if isinstance(default, str) else default
    elif convert is not None:
        annotation = Annotated[Any, marker, BeforeValidator(_typed(convert))]
        default = convert(default) if isinstance(default, str) else default
    else:
        annotation = Annotated[str | None if default is None else str, marker]
    fields: dict[str, Any] = {marker.dest: (annotation, Field(default, description=description))}
    model = create_model("Flag_" + marker.dest, __base__=Section, **fields)
    add_settings(parser, model)


def _typed(convert: Any) -> Any:
    def check(value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            return convert(value)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None

    return check
