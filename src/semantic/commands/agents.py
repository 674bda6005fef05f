"""`semantic agents`: list, show or delete agents and their caches; `agents_query.py` answers,
through the running server or from the cache folder."""

from __future__ import annotations

import argparse

from semantic.errors import SemanticError
from semantic.settings.flags import Parser, add_settings_flags, settings_from

_ABOUT = """\
list (the default): every agent, its cached tokens in memory and on disk, pinned or not, when
it was last used and how many turns it had; show ID: one agent in full; delete ID: an agent and
the cache no other agent shares.

Asks the running server at --host and --port (or --url), with its admin key, else its API key:
a key sees its own agents, an admin key every key's (--owner names whose). A key goes only to a
loopback host or to --url, and over plain http only to loopback unless --allow-plain-http. When
no server answers, reads the cache folder (--cache-dir) directly, every owner's agents, and
says so."""


def add_parser(verbs: argparse._SubParsersAction[Parser]) -> None:
    agents = verbs.add_parser(
        "agents", help="list, inspect or delete agents and their caches", description=_ABOUT
    )
    agents.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "show", "delete"],
        help="what to do (default: list)",
    )
    agents.add_argument("agent_id", nargs="?", help="the agent, for show and delete")
    agents.add_argument("--json", action="store_true", help="print JSON")
    agents.add_argument(
        "--owner",
        help="whose agents: an owner from the list (the digest of a key), or `none` for "
        "agents of no key; by default, with an admin key every key's to list and its own to "
        "show or delete",
    )
    agents.add_argument(
        "--url",
        help="the server to ask, as http(s)://host:port; without it, the settings' host and "
        "port, where an API key is sent only if the host is loopback",
    )
    agents.add_argument(
        "--allow-plain-http",
        action="store_true",
        help="send the API key over plain http to a --url off this machine",
    )
    add_settings_flags(
        agents,
        ["host", "port", "api_key", "api_key_file", "admin_api_key", "cache_dir", "config"],
        title="the server to ask, else the cache folder to read",
        help_for={
            "host": "Host of the running server to ask.",
            "port": "Port of the running server to ask.",
            "api_key": "API key to send to the server when no admin key is set.",
            "api_key_file": "File of API keys; the first is sent when no admin key is set.",
            "admin_api_key": "Admin key to send (it sees every key's agents).",
        },
    )
    agents.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # The HTTP client loads only for this verb: every start builds this parser.
    from semantic.commands import agents_query

    settings = settings_from(args)
    if args.action != "list" and not args.agent_id:
        raise SemanticError(f"`semantic agents {args.action}` needs an agent id")
    query = agents_query.Query(
        args.action, args.agent_id, args.owner, args.json, args.url, args.allow_plain_http
    )
    return agents_query.run(settings, query)
