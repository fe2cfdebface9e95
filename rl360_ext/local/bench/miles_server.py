"""Miles' own session server as a process, for `rl360 bench sessions --miles-src`.

Owns the command line that starts `miles.rollout.session.server.SessionServer` (Miles' code,
imported from the checkout, unchanged) under uvicorn in front of a backend, with the arguments
Miles' session routes read: the tokenizer as `hf_checkpoint`, R3 (`use_rollout_routing_replay`)
and the R3 mode (`pause_generation_mode=in_place` is Miles' delta mode, which asks the backend
only for the routing rows a session does not hold yet; otherwise every turn records the full
routing). It serves with access logs off and warnings only, as `rl360 session serve` does, so
neither server pays for per-request logging.

It runs under an interpreter in which Miles' session server imports (Miles needs torch and
sglang for that: integration_tests/miles/setup_venv.sh builds one), as a script: it imports
nothing from rl360, so it needs no rl360 install there.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from types import SimpleNamespace

MODES = ("full", "in_place")


def miles_args(tokenizer: str, r3: bool, mode: str, timeout_s: float) -> SimpleNamespace:
    """The argument namespace Miles' SessionServer and session routes read (Miles' defaults otherwise)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return SimpleNamespace(
        miles_router_timeout=timeout_s,
        hf_checkpoint=tokenizer,
        chat_template_path=None,
        apply_chat_template_kwargs={},
        tito_model="default",
        trajectory_manager="linear_trajectory",
        session_server_instance_id=uuid.uuid4().hex,
        save_debug_trajectory_data=None,
        use_rollout_routing_replay=r3,
        use_rollout_indexer_replay=False,
        pause_generation_mode="in_place" if mode == "in_place" else None,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--miles-src", required=True, help="A radixark/miles checkout.")
    parser.add_argument("--backend", required=True, help="SGLang-protocol base URL.")
    parser.add_argument("--tokenizer", required=True, help="Tokenizer directory (hf_checkpoint).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--r3", action="store_true", help="Record routing replay (use_rollout_routing_replay)."
    )
    parser.add_argument(
        "--mode", choices=MODES, default="full", help="R3 mode: full rows, or in_place deltas."
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="Miles' miles_router_timeout.")
    options = parser.parse_args(argv)
    sys.path.insert(0, options.miles_src)

    import uvicorn
    from miles.rollout.session.server import SessionServer

    logging.basicConfig(level=logging.WARNING)
    server = SessionServer(
        miles_args(options.tokenizer, options.r3, options.mode, options.timeout), options.backend
    )
    uvicorn.run(server.app, host=options.host, port=options.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
