"""A setting given wrong, said in one line: which one (the flag, the ANDREA_* variable or the
JSON option), what was given and what is allowed, so `andrea serve | train | export` can exit 2
with no traceback. What is allowed is read from the model's own JSON schema (its type, bounds
and choices), so a new Settings or RunConfig field is covered without a word here.

    andrea serve: ANDREA_PORT='abc': must be an integer from 0 to 65535
    andrea serve: --data-dir /etc/hostname: must be a folder, not a file
    andrea train: --room '{bad': not JSON: expecting property name enclosed in double quotes
                  at character 2 (after '{')
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any


class BadSetting(Exception):
    """A setting given wrong: the message names it, what was given and what is allowed."""


# ---- what a JSON schema property allows, in words ------------------------------------------------

def _number(value) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bounds(prop: dict, integer: bool) -> str:
    """" from 1 to 65535", " above 0", " of at least 1", ...: the schema's bounds in words; an
    integer's exclusive bound as the next integer in."""
    lo, hi = prop.get("minimum"), prop.get("maximum")
    lo_x, hi_x = prop.get("exclusiveMinimum"), prop.get("exclusiveMaximum")
    if integer:
        if lo_x is not None:
            lo, lo_x = lo_x + 1, None
        if hi_x is not None:
            hi, hi_x = hi_x - 1, None
    if lo is not None and hi is not None:
        return f" from {_number(lo)} to {_number(hi)}"
    lower = (f"at least {_number(lo)}" if lo is not None else
             f"above {_number(lo_x)}" if lo_x is not None else None)
    upper = (f"at most {_number(hi)}" if hi is not None else
             f"below {_number(hi_x)}" if hi_x is not None else None)
    words = " and ".join(filter(None, (lower, upper)))
    return (" of " if words.startswith("at ") else " ") + words if words else ""


def allowed(prop: dict | None, json_values: bool = False) -> str | None:
    """What a JSON schema property allows, in words ("an integer from 0 to 65535"), or None
    where it cannot be said simply. json_values: as a JSON document writes the values (an
    option of --room), not as a flag or an environment variable takes them."""
    if not prop:
        return None
    kinds = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    if len(kinds) != 1:
        return None
    p = kinds[0]
    if "enum" in p or "const" in p:
        values = [json.dumps(v) if json_values else str(v) for v in p.get("enum", [p.get("const")])]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    kind = p.get("type")
    if kind in ("integer", "number"):
        return ("an integer" if kind == "integer" else "a number") + _bounds(p, kind == "integer")
    if kind == "boolean":
        return "true or false" + ("" if json_values else " (or 1 or 0, yes or no, on or off)")
    if kind == "string":
        if p.get("format") == "path":
            return "a path"
        if "pattern" in p:
            return f"text matching {p['pattern']}"
        return "text"
    if kind == "array":
        items = p.get("items") or {}
        if "prefixItems" in items:
            parts = ", ".join('"PATH"' if i.get("format") == "path" else '"NAME"'
                              if i.get("type") == "string" else (i.get("type") or "X").upper()
                              for i in items["prefixItems"])
            return f"a JSON list of [{parts}] " + \
                ("pairs" if len(items["prefixItems"]) == 2 else "lists")
        return "a list" + (f" of {allowed(items, json_values)} items"
                           if allowed(items, json_values) else "")
    if kind == "object" or "$ref" in p:
        return "a JSON object"
    return None


def reason(error: dict, prop: dict | None, json_values: bool = False) -> str:
    """Why pydantic refused a value, in words: a validator's own message as it is; a wrong type
    or a value out of bounds as what is allowed."""
    if error["type"] in ("value_error", "assertion_error"):
        return re.sub(r"^(Value error|Assertion failed), ", "", error["msg"])
    if error["type"] == "missing":
        return "is required"
    words = allowed(prop, json_values)
    if words:
        return f"must be {words}"
    msg = error["msg"]
    return msg[:1].lower() + msg[1:]


def json_error(e: json.JSONDecodeError) -> str:
    """Where a JSON document breaks, in words: "expecting ',' delimiter at character 12 (after
    '{"codec": "f16"')"."""
    at = f"line {e.lineno} column {e.colno}" if e.lineno > 1 else f"character {e.pos + 1}"
    before = e.doc[max(0, e.pos - 24):e.pos]
    where = (f"after {'...' if e.pos > 24 else ''}{before!r}" if before.strip() else
             "at the start")
    return f"not JSON: {e.msg[:1].lower()}{e.msg[1:]} at {at} ({where})"


def parse_json(flag: str, text: str) -> Any:
    """A flag's JSON (--room '{...}'); a syntax error says where it is."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadSetting(f"{flag} {shlex.quote(text)}: {json_error(e)}") from None


def typed(kind: type, prop: dict, bounds: bool = True):
    """An argparse `type`: the text as `kind` (int or float), within the JSON schema property
    `prop`'s bounds (unless `bounds` is off: a model checks them later); anything else an error
    saying what is allowed ("argument --workers: 'x': must be an integer of at least 1")."""
    import argparse
    import math

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        lo, hi = prop.get("minimum"), prop.get("maximum")
        lo_x, hi_x = prop.get("exclusiveMinimum"), prop.get("exclusiveMaximum")
        if value is not None and not bounds:
            return value
        if value is None or (isinstance(value, float) and not math.isfinite(value)) or \
                (lo is not None and value < lo) or (hi is not None and value > hi) or \
                (lo_x is not None and value <= lo_x) or (hi_x is not None and value >= hi_x) or \
                ("enum" in prop and value not in prop["enum"]):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {allowed(prop)}")
        return value

    convert.__name__ = kind.__name__
    return convert


# ---- Settings: flags and ANDREA_* --------------------------------------------------------------

def env_name(model, field: str) -> str:
    """The environment variable a Settings field is read from, as this environment spells it
    (pydantic-settings matches ANDREA_* without regard to case)."""
    info = model.model_fields[field]
    alias = info.validation_alias or info.alias
    want = alias if isinstance(alias, str) else model.model_config.get("env_prefix", "") + field
    if want in os.environ:
        return want
    found = [k for k in os.environ if k.upper() == want.upper()]
    return found[0] if found and not model.model_config.get("case_sensitive") else want.upper()


def _shown(value) -> str | None:
    if isinstance(value, (str, int, float, Path)) and not isinstance(value, bool):
        return shlex.quote(str(value))
    return None


def _where(model, field: str, flags: dict[str, str], given: dict) -> str:
    """Which setting gave `field`'s value, with the value: "--port 99999", "ANDREA_PORT='abc'",
    or the default's."""
    if field in given:
        flag = flags.get(field, "--" + field.replace("_", "-"))
        value = _shown(given[field])
        return f"{flag} {value}" if value is not None else flag
    name = env_name(model, field)
    if name in os.environ:
        return f"{name}={os.environ[name]!r}"
    return f"{field.replace('_', ' ')} (its default)"


def settings_error(model, e, flags: dict[str, str], given: dict) -> str:
    """A pydantic ValidationError of Settings in one line: per field (its first error; a field's
    nested errors say the same), the flag or variable, the value and what is allowed."""
    props = model.model_json_schema()["properties"]
    said: dict[str, str] = {}
    for error in e.errors():
        loc = error["loc"]
        field = str(loc[0]) if loc else ""
        if field in said:
            continue
        if not field or field not in model.model_fields:
            said[field] = reason(error, None)
            continue
        why = reason(error, props.get(field))
        if len(loc) > 1 and error["type"] not in ("value_error", "assertion_error"):
            # A nested error (an item of ANDREA_CORPORA) is said as what the field allows.
            words = allowed(props.get(field))
            why = f"must be {words}" if words else why
        said[field] = f"{_where(model, field, flags, given)}: {why}"
    return "; ".join(said.values())


def _not_a_folder(path: Path) -> Path | None:
    """The file that stands where `path`, or a folder above it, should be a folder, if any."""
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    return None if p.is_dir() else p


def check_folders(settings, flags: dict[str, str], given: dict) -> None:
    """Every *_dir setting (data_dir, cache_dir) is a folder, or a path where one can be made:
    a file there is a BadSetting, said before anything is opened in it."""
    model = type(settings)
    for field in model.model_fields:
        path = getattr(settings, field) if field.endswith("_dir") else None
        if not isinstance(path, Path):
            continue
        file = _not_a_folder(path)
        if file is not None:
            where = _where(model, field, flags, given)
            raise BadSetting(f"{where}: must be a folder, not a file" if file == path else
                             f"{where}: must be a folder, and {file} is a file")


def _database_url(url: str) -> None:
    from andrea.store.engine import engine_url
    engine_url(url)


def _broker_url(url: str) -> None:
    from redis.connection import parse_url
    parse_url(url)


# Text settings whose form is checked where they are used (the store, the broker), not by
# Settings: each checked here the same way (nothing is connected to), and what it must be.
URL_SETTINGS = {
    "database_url": (_database_url, "postgresql://user@host:port/database"),
    "broker_url": (_broker_url, "redis://host:port/db (or rediss://, unix://)"),
}


def check_urls(settings, flags: dict[str, str], given: dict) -> None:
    """ANDREA_DATABASE_URL and ANDREA_BROKER_URL parse as their users parse them: a BadSetting
    now rather than a traceback when the server opens them."""
    for field, (check, form) in URL_SETTINGS.items():
        url = getattr(settings, field, None)
        if not url:
            continue
        try:
            check(url)
        except Exception:   # (SQLAlchemy's ArgumentError, ValueError): said as what it must be
            raise BadSetting(f"{_where(type(settings), field, flags, given)}: must be "
                             f"{form}") from None


def load_settings(flags: dict[str, str] | None = None, **given):
    """Settings from `given` (the command's flags; `flags` names each field's flag, default
    --field-name) over ANDREA_*; BadSetting, in one line, for any value refused."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from andrea.config import Settings

    flags = flags or {}
    try:
        settings = Settings(**given)
    except ValidationError as e:
        raise BadSetting(settings_error(Settings, e, flags, given)) from None
    except SettingsError as e:   # an ANDREA_* value that is not the JSON its field needs
        found = re.search(r'field "([^"]+)"', str(e))
        field = found.group(1) if found else None
        if field not in Settings.model_fields:
            raise BadSetting(str(e)) from None
        why = json_error(e.__cause__) if isinstance(e.__cause__, json.JSONDecodeError) else \
            str(e.__cause__ or e)
        words = allowed(Settings.model_json_schema()["properties"].get(field))
        raise BadSetting(f"{_where(Settings, field, flags, given)}: {why}"
                         + (f": must be {words}" if words else "")) from None
    check_folders(settings, flags, given)
    check_urls(settings, flags, given)
    return settings
