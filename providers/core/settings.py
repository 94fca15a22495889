"""Settings declared once: a field of a section model carries its flag; the rest is derived.

A section is a pydantic model (`Section`); each of its fields marked with a `Flag` is one
setting, with its type, default, unit (in the field's name) and description in one place:

    class PodNetworkSettings(Section):
        vxlan_port: Annotated[int, Flag("--vxlan-port")] = Field(
            4789, ge=1, le=65535, description="UDP port of pod tunnels"
        )

From that declaration `adaptor.cli.flags` derives the argparse flag, its environment twin
(`PEERPODS_VXLAN_PORT`, parsed by the very same `Setting.parse` as the flag's text), the help
text with the default, and `docs/configuration.md` (rendered from the help). Sub-configs are
built from the section with `Section.of(...)`, never re-declared.

To add a setting: add the field, with its `Flag` and `description`, to its section; read it
from the built section. Constraints (`ge=`, `Literal[...]`, `AfterValidator(...)`) go into the
field's type, so a flag, an env value and a model built in code are checked alike.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

ENV_PREFIX = "PEERPODS_"
TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(h|ms|m|s))+$", re.ASCII)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)", re.ASCII)
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def env_name(flag: str) -> str:
    """The environment twin of a long flag: `--static-endpoints` -> `PEERPODS_STATIC_ENDPOINTS`."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def parse_duration(text: str) -> float:
    """A CAA-style duration (`30s`, `5m`, `1h30m`, `250ms`) in seconds."""
    text = text.strip()
    if not _DURATION.fullmatch(text):
        raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 5m, 1h)")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    """Seconds as the shortest duration text `parse_duration` reads back (300.0 -> `5m`)."""
    if seconds == 0:
        return "0s"
    for unit in ("h", "m", "s"):
        count = seconds / _UNITS[unit]
        if count == int(count):
            return f"{int(count)}{unit}"
    return f"{round(seconds * 1000)}ms"


def parse_bool(text: str) -> bool:
    """A boolean written as text; anything but the known words is an error, never `False`."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(
        f"invalid boolean {text!r} (choose from {', '.join(TRUE_WORDS + FALSE_WORDS)})"
    )


def csv(text: str) -> tuple[str, ...]:
    """A comma-separated value as a tuple, each item stripped, blanks dropped: the one
    comma-list parser of flags, env values and settings."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def listed(value: object) -> object:
    """A section field's before-validator: a comma-separated text becomes its items."""
    return csv(value) if isinstance(value, str) else value


# A list of names, given as a sequence or as one comma-separated text.
Names = Annotated[tuple[str, ...], BeforeValidator(listed)]


@dataclass(frozen=True)
class Flag:
    """Marks a section field as a setting with this long flag (and its `PEERPODS_*` twin).

    `duration`: written as `30s`/`5m`/`1h`, held in seconds. `choices`: the allowed texts when
    the field's type does not say (a `Literal` or an `Enum` does). `valued`: a boolean given as
    a value (`--aws-use-public-ip true`) rather than as a switch. `repeated`: a list
    flag that may be given more than once, each time adding its items.
    """

    name: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    duration: bool = False
    valued: bool = False
    # a list given as often as wanted (`--warm-pool A=1 --warm-pool B=2`), each time extending it
    repeated: bool = False

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


class Section(BaseModel):
    """A group of settings; frozen, and unknown fields are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def of(cls, source: BaseModel) -> Self:
        """This section from a model that has its fields (a composite, or another section)."""
        known = type(source).model_fields
        values = {name: getattr(source, name) for name in cls.model_fields if name in known}
        return cls.model_validate(values)


@dataclass(frozen=True)
class Setting:
    """One declared setting: a section's field and its flag."""

    section: type[BaseModel]
    field: str
    info: FieldInfo
    flag: Flag

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True)

    @property
    def description(self) -> str:
        return self.info.description or ""

    @cached_property
    def _type(self) -> Any:
        """The field's type without `None` (an optional setting's `""` means None)."""
        annotation = self.info.annotation
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(rest) == 1:
                return rest[0]
        return annotation

    @property
    def optional(self) -> bool:
        return self._type is not self.info.annotation

    @property
    def is_bool(self) -> bool:
        return self._type is bool

    @property
    def is_switch(self) -> bool:
        """A boolean flag given alone (`--rdma`, `--no-agent-tls`), not with a value."""
        return self.is_bool and not self.flag.valued

    @property
    def is_int(self) -> bool:
        return self._type is int

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self._type) in (tuple, frozenset, list, set)

    @cached_property
    def choices(self) -> tuple[str, ...]:
        """The allowed texts, when the setting has a closed set."""
        if self.flag.choices:
            return self.flag.choices
        kind = self._type
        if typing.get_origin(kind) is Literal:
            return tuple(str(arg) for arg in typing.get_args(kind))
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return tuple(str(member.value) for member in kind)
        return ()

    @cached_property
    def _adapter(self) -> TypeAdapter[Any]:
        return TypeAdapter(Annotated[self.info.annotation, *self.info.metadata])

    def parse(self, text: str) -> Any:
        """The value a flag's or env twin's text stands for; ValueError says why it is invalid."""
        if _CONTROL.search(text):
            raise ValueError(f"invalid value {text!r}: control characters are not allowed")
        choices = self.choices
        if choices and text not in choices:
            allowed = ", ".join(choice or repr(choice) for choice in choices)
            raise ValueError(f"invalid choice {text!r} (choose from {allowed})")
        value: object = text
        if self.is_bool:
            value = parse_bool(text)
        elif self.flag.duration:
            value = parse_duration(text)
        elif self.is_list:
            value = csv(text)
        elif self.optional and not text:
            value = None
        try:
            return self._adapter.validate_python(value)
        except ValidationError as exc:
            message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise ValueError(f"invalid value {text!r}: {message}") from None

    def kind(self) -> str:
        """What the value is, in words (the configuration reference's type column)."""
        if self.is_bool:
            return "boolean"
        if self.choices:
            return "one of " + ", ".join(choice or "''" for choice in self.choices)
        if self.flag.duration:
            return "duration"
        if self.is_list:
            return "comma-separated list"
        if self.is_int:
            return "integer"
        return "text"

    def shown_default(self) -> str:
        """The default as the help shows it ('' when there is nothing worth showing)."""
        default = self.default
        if default is None or default is False or default == "" or self.is_switch:
            return ""
        if self.flag.duration:
            return format_duration(float(default))
        if isinstance(default, tuple | frozenset | list | set):
            return ",".join(sorted(str(item) for item in default))
        if isinstance(default, enum.Enum):
            return str(default.value)
        return str(default)


def describe(model: type[BaseModel], exc: ValidationError, *, by_flag: bool = True) -> str:
    """One line for a section's validation error, naming the field at fault by its flag (or,
    for a section built in code, by its name)."""
    first = exc.errors()[0]
    flags = {s.field: s.flag.name for s in settings(model)} if by_flag else {}
    where = ".".join(flags.get(str(part), str(part)) for part in first["loc"]) or "settings"
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"


def settings(*sections: type[BaseModel]) -> Iterator[Setting]:
    """Every flagged field of the sections: a section's own fields first, then its bases'."""
    for section in sections:
        fields = section.model_fields
        own_first = [
            name
            for cls in section.__mro__
            for name in vars(cls).get("__annotations__", {})
            if name in fields
        ]
        for name in dict.fromkeys(own_first):
            info = fields[name]
            flag = next((m for m in info.metadata if isinstance(m, Flag)), None)
            if flag is not None:
                yield Setting(section, name, info, flag)
