"""Parse argument lists with an SGLang release's own server-argument parser.

Runs inside a release's behaviour environment (standard library, torch, sglang and its
neighbour ``standins``). Builds the parser as ``prepare_server_args`` in
``sglang.srt.server_args`` does (0.5.16 to 0.5.23: ``argparse.ArgumentParser`` and
``ServerArgs.add_cli_args``) and calls its ``parse_args`` on each list; nothing is
resolved, so no GPU is needed. An unknown option, a value of the wrong type or outside the
option's choices is the parser's own error; so is an option that ends the parse instead
(``-h``/``--help`` prints the help and exits, as may a release's own action): the list is
refused with what the parser printed, and the other lists are still answered.

Input (standard input, JSON): ``{"argvs": [[...], ...], "standins": {import name:
version}}``. Output: one line ``PARSED {json}`` per list, ``{"ok": true, "values":
{dest: value}}`` or ``{"ok": false, "error": the parser's message}``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import warnings
from typing import Any

import standins


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit 2
        raise _Refused(message)

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        # -h/--help (after printing the help) or a release's own action: the parse ends
        # without a result; it is an answer about this list, not a failure of the script
        raise _Refused(f"the parser exits (status {status}) instead of parsing the list, as "
                       "-h/--help does"
                       + (f": {message.strip()}" if message and message.strip() else ""))


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else \
        [_plain(v) for v in value] if isinstance(value, list | tuple) else str(value)


def main() -> int:
    """Parse every list of the request; one line each."""
    request = json.load(sys.stdin)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    standins.install(dict(request.get("standins") or {}))
    from sglang.srt.server_args import ServerArgs

    for argv in request["argvs"]:
        parser = _Parser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        printed = io.StringIO()  # what the parser prints (the help) never mixes with answers
        try:
            with contextlib.redirect_stdout(printed):
                values = vars(parser.parse_args(argv))
            record: dict[str, Any] = {"ok": True,
                                      "values": {k: _plain(v) for k, v in values.items()}}
        except _Refused as exc:
            shown = printed.getvalue().strip().splitlines()
            record = {"ok": False, "error": str(exc) + (f" (it printed {shown[0]!r} ...)"
                                                        if shown else "")}
        except SystemExit as exc:  # an action that calls sys.exit itself
            record = {"ok": False, "error": f"the parser exits (status {exc.code}) instead "
                                            "of parsing the list"}
        print("PARSED " + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
