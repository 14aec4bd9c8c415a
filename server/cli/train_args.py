"""`andrea train`'s arguments: one flag per RunConfig field (choices for a Literal, a switch for
a bool, a list for `sources`), built from the model itself so a new field is a new flag, plus
the command's own (--resume, --branch, --server, --gpu, ...); and the config they give, checked
before any browser or server starts. A bad one is a TrainError with the usage exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import types
import typing
from pathlib import Path

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


def _flag_type(annotation):
    """(argparse kwargs) for a RunConfig field's type: choices for a Literal, a switch for bool."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = args[0]
    if typing.get_origin(annotation) is list:          # sources: --sources NAME [NAME ...]
        (item,) = typing.get_args(annotation)
        return {"nargs": "+", "type": item, "metavar": "NAME"}
    if typing.get_origin(annotation) is typing.Literal:   # of strings, or of ints (vocab_size)
        choices = list(typing.get_args(annotation))
        return {"choices": choices, "type": type(choices[0])}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    return {"type": annotation}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    config = parser.add_argument_group("run config (left out: the server's default)")
    for name, field in run_config_model().model_fields.items():
        if name == "parent":   # set through --branch (a run and a step), not as a raw object
            continue
        if name == "room":     # an object: given as JSON
            config.add_argument("--room", dest="room", type=json.loads, default=argparse.SUPPRESS,
                                metavar="JSON", help=(
                                    "a room run (trained by the tabs that join it), e.g. "
                                    "'{\"inner_steps\": 50, \"codec\": \"int8\"}': "
                                    "see RoomConfig").replace("%", "%%"))
            continue
        kwargs = _flag_type(field.annotation)
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
    if getattr(args, "branch", None):
        if config.get("room"):
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
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        raise TrainError(f"{where}: {first['msg']}", EXIT_USAGE) from None
    return config
