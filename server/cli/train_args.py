"""`andrea train`'s arguments: one flag per RunConfig field (choices for a Literal, a switch for
a bool, a list for `sources`), built from the model itself so a new field is a new flag, plus
the command's own (--resume, --branch, --server, --gpu, ...); and the config they give, checked
before any browser or server starts. A bad one is a TrainError with the usage exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import textwrap
import types
import typing
from pathlib import Path

from andrea.cli.bad_settings import BadSetting, allowed, parse_json, reason, typed
from andrea.cli.chromium import DEFAULT_CHROMIUM, NO_DOWNLOAD

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

# For `andrea train --help`.
BROWSER_HELP = (f"It drives the system's Chromium ({DEFAULT_CHROMIUM}: apt-get install chromium), "
                f"or the Chromium or Chrome executable that ANDREA_CHROMIUM names, through "
                f"Playwright; {NO_DOWNLOAD} (no `playwright install`).")


class TrainError(Exception):
    """Why `andrea train` fails, in one line, and its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def run_config_model():
    """RunConfig, imported when first needed."""
    from andrea.run_config import RunConfig
    return RunConfig


def _flag_type(annotation, prop: dict):
    """(argparse kwargs) for a RunConfig field's type: choices for a Literal, a switch for bool,
    a number whose error says what the field allows (`prop`, its JSON schema)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = args[0]
    kind = next((p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"), {})
    if typing.get_origin(annotation) is list:          # sources: --sources NAME [NAME ...]
        (item,) = typing.get_args(annotation)
        return {"nargs": "+", "type": item, "metavar": "NAME"}
    if typing.get_origin(annotation) is typing.Literal:   # of strings, or of ints (vocab_size)
        choices = list(typing.get_args(annotation))
        number = type(choices[0]) in (int, float)
        return {"choices": choices,
                "type": typed(type(choices[0]), kind, bounds=False) if number
                else type(choices[0])}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float):
        # (Bounds are RunConfig's to check: with --json, a value out of them is a JSON result.)
        return {"type": typed(annotation, kind, bounds=False)}
    return {"type": annotation}


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a description or epilog keeps its lines: each is filled on its own, and
    one that starts with two spaces is an entry ("  NAME  words"), its words hung under it; a
    word is never cut at its hyphen ("pseudo-gradient" stays one)."""
    NAME_WIDTH = 20

    def _fill_text(self, text, width, indent):
        out = []
        for line in text.splitlines():
            if line.startswith("  "):
                name, _, words = line.strip().partition(" ")
                head = f"{indent}  {name:{self.NAME_WIDTH}} "
                out.append(textwrap.fill(" ".join(words.split()), width, initial_indent=head,
                                         subsequent_indent=" " * len(head),
                                         break_on_hyphens=False))
            else:
                out.append(textwrap.fill(" ".join(line.split()), width, initial_indent=indent,
                                         subsequent_indent=indent, break_on_hyphens=False))
        return "\n".join(out)


ROOM_EXAMPLE = '{"inner_steps": 50, "codec": "int8"}'


def room_model():
    from andrea.run_config import RoomConfig
    return RoomConfig


def room_help() -> str:
    """`andrea train --help`'s words on --room: each room option, what it does, what it may be
    and its default, from RoomConfig's fields, their descriptions and JSON schema (the one
    place for them: the new-run form shows the same words)."""
    lines = ["room options: --room takes a JSON object of them, e.g. " + ROOM_EXAMPLE + "; "
             "one left out takes its default. A room run is trained by the tabs that join it "
             "(DiLoCo): each runs inner_steps steps from the same global weights, then sends "
             "its pseudo-gradient; the server clips, averages and applies them as the next "
             "global version."]
    for name, prop in room_model().model_json_schema()["properties"].items():
        words = prop["description"]
        kind = allowed(prop, json_values=True)
        if kind and name.endswith("_s"):
            kind = kind.replace("a number", "a number of seconds", 1)
        facts = "; ".join(filter(None, [kind, "default " + json.dumps(prop["default"])
                                        if "default" in prop else None]))
        lines.append(f"  {name} {words} ({facts})" if facts else f"  {name} {words}")
    return "\n".join(lines)    # (an epilog is %-formatted only where it names %(prog))


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    config = parser.add_argument_group("run config (left out: the server's default)")
    props = run_config_model().model_json_schema()["properties"]
    for name, field in run_config_model().model_fields.items():
        if name == "parent":   # set through --branch (a run and a step), not as a raw object
            continue
        if name == "room":     # an object: given as JSON, read by run_config
            config.add_argument("--room", dest="room", default=argparse.SUPPRESS,
                                metavar="JSON", help=(
                                    f"a room run, trained by the tabs that join it: a JSON "
                                    f"object of the room options below, e.g. '{ROOM_EXAMPLE}' "
                                    f"('{{}}': every default)").replace("%", "%%"))
            continue
        kwargs = _flag_type(field.annotation, props[name])
        default = "tiny" if name == "preset" else field.default
        help_text = "; ".join(filter(None, [
            field.description, None if default is None else f"default: {default}"]))
        config.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                            help=help_text.replace("%", "%%"), **kwargs)
    parser.add_argument("--headless", action="store_true",
                        help="accepted; train is always headless")
    parser.add_argument("--resume", metavar="RUN_ID",
                        help="continue a stopped, interrupted or failed run from its last "
                             "checkpoint (with the run's own config: no config flags)")
    parser.add_argument("--branch", metavar="RUN_ID[@STEP]",
                        help="a NEW run that continues RUN_ID from its checkpoint STEP (default: "
                             "its last), with RUN_ID's config changed by the config flags given "
                             "(e.g. a failed run again with a lower --lr)")
    parser.add_argument("--join", metavar="RUN_ID",
                        help="train in room run RUN_ID as one of its workers (its join token: "
                             "--token; a room's join link ends in #join=...)")
    parser.add_argument("--token", default=os.environ.get("ANDREA_TOKEN") or None,
                        help="the write token of the run to --resume, or of the --branch parent "
                             "(or the operator's): a server other machines reach asks for it "
                             "(default: ANDREA_TOKEN; a run's resume link ends in #token=...)")
    parser.add_argument("--server", help="an Andrea server URL (default: start one for this run)")
    parser.add_argument("--data-dir", type=Path,
                        help="data dir of the server started for this run "
                             "(default: ANDREA_DATA_DIR or the platform's user data folder)")
    parser.add_argument("--gpu", action="store_true",
                        help="use the machine's GPU through Vulkan instead of SwiftShader")
    parser.add_argument("--timeout", type=float, default=24 * 3600,
                        help="seconds before giving up on the run (default: a day)")
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON object on stdout (progress goes to stderr)")


def run_config(args: argparse.Namespace) -> dict:
    """The config flags given, validated here first so a bad one fails before any server starts."""
    from pydantic import ValidationError

    fields = run_config_model().model_fields
    config = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    # One run to train: a flag of another would be dropped without a word.
    modes = [f"--{flag}" for flag in ("resume", "branch", "join") if getattr(args, flag, None)]
    if len(modes) > 1:
        raise TrainError(f"{' and '.join(modes)} exclude each other", EXIT_USAGE)
    if isinstance(config.get("room"), str):
        try:
            config["room"] = parse_json("--room", config["room"])
        except BadSetting as e:
            raise TrainError(str(e), EXIT_USAGE) from None
    if getattr(args, "branch", None):
        if config.get("room") is not None:
            raise TrainError("--branch goes on from one trainer's checkpoint: a room run cannot "
                             "be a branch; drop --room", EXIT_USAGE)
        return config     # validated by the server on top of the parent's config
    for flag in ("resume", "join"):
        if getattr(args, flag, None):
            if config:
                given = ", ".join("--" + k.replace("_", "-") for k in config)
                raise TrainError(f"--{flag} trains the run with its own config; drop {given}",
                                 EXIT_USAGE)
            return config
    config.setdefault("preset", "tiny")
    try:
        run_config_model().model_validate(config)
    except ValidationError as e:
        raise TrainError(config_error(e, config), EXIT_USAGE) from None
    return config


def config_error(e, config: dict) -> str:
    """RunConfig's refusal in one line: per error, the flag (or the --room option) with what was
    given and what is allowed; a rule across fields in its own words."""
    props = run_config_model().model_json_schema()["properties"]
    room_props = room_model().model_json_schema()["properties"]
    said = []
    for error in e.errors():
        loc = [str(x) for x in error["loc"]]
        if not loc:
            said.append(reason(error, None))
        elif loc[0] == "room" and len(loc) > 1:
            option = loc[1]
            if error["type"] == "extra_forbidden":
                said.append(f"--room: no option {json.dumps(option)}: the room options are "
                            + ", ".join(room_props))
            else:
                said.append(f"--room {option} {json.dumps(error['input'])}: "
                            + reason(error, room_props.get(option), json_values=True))
        elif loc[0] == "room":
            if error["type"] in ("value_error", "assertion_error"):
                said.append(f"--room: {reason(error, None)}")
            else:
                said.append(f"--room {shlex.quote(json.dumps(config.get('room')))}: must be a JSON "
                            f"object of room options, e.g. '{ROOM_EXAMPLE}'")
        else:
            name = loc[0]
            value = config.get(name)
            shown = " ".join(map(shlex.quote, map(str, value))) if isinstance(value, list) \
                else "" if isinstance(value, bool) or value is None else shlex.quote(str(value))
            flag = "--" + name.replace("_", "-") + (f" {shown}" if shown else "")
            # An item of a list (a source named twice) is said as the list's.
            words = reason(error, props.get(name)) if len(loc) == 1 else error["msg"]
            said.append(f"{flag}: {words}")
    return "; ".join(dict.fromkeys(said))


def own_server_settings(args: argparse.Namespace):
    """The settings of the server `andrea train` starts (no --server): its --data-dir over
    ANDREA_*, checked before anything starts; a bad one is a TrainError with the usage code."""
    from andrea.cli.bad_settings import load_settings

    given = {"data_dir": args.data_dir} if args.data_dir is not None else {}
    try:
        # (The server is started with --port of a free port: ANDREA_PORT plays no part.)
        return load_settings(port=0, **given)
    except BadSetting as e:
        raise TrainError(str(e), EXIT_USAGE) from None
