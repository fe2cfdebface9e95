"""Miles' `GET /sessions/{id}` view of a session: its records and metadata (pure functions, no I/O).

Owns `Exchange` (the agent's side of one recorded turn: when it came, the messages it appended,
its tools and sampling parameters, the `chat.completion` it got back; kept beside the turn's
`TurnRecord`, so a record's messages and tokens are rebuilt from per-turn deltas, never stored
whole per turn) and `session_view`, which answers Miles' `GetSessionResponse` shape:
`{session_id, records: [...], metadata}`. Each record has Miles' `SessionRecord` fields
(`timestamp`, `request_timestamp`, `method`, `path`, `request`, `response`, `status_code`):
`request` is what the turn sent the engine (the messages so far, `input_ids` = the whole prompt,
`sampling_params`, the routing-replay offset with R3), `response` is the completion the agent
received, its message in SGLang's wire shape (tool calls carry `index`), with
`choices[0].meta_info` (`output_token_logprobs` as `[logprob, token_id]` pairs, token counts,
the engine's finish reason and weight version). As in Miles, the records are the
active trajectory: the last history segment (rl360 forks where Miles rolls back). `metadata`
carries `accumulated_token_ids` (that segment's tokens), Miles' v2 `tree` tables of every turn
(`tree_metadata`) and the session's own facts. Routing rows
are not in the view (they stay in the merged sample). It does not own turns (`core.py`) or the
merge (`merge.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl360_ext.session.samples.merge import TurnRecord

Message = dict[str, Any]
CHAT_PATH = "/v1/chat/completions"  # the route each recorded turn came through


@dataclass
class Exchange:
    """The agent's side of one recorded turn."""

    request_timestamp: float
    timestamp: float
    new_messages: list[Message]  # request messages this turn appended (all of them on a segment's first)
    tools: list[dict[str, Any]] | None
    sampling_params: dict[str, Any]
    completion: dict[str, Any]  # the chat.completion the agent received


def _wire_message(message: Message, tools: list[dict[str, Any]] | None) -> Message:
    """The assistant message in SGLang's non-streaming wire shape: each tool call carries `index`,
    the called tool's position in the request's tools (-1 when it names none of them)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    names = [(tool.get("function") or {}).get("name") for tool in tools or []]
    indexed = [
        {**call, "index": names.index(call["function"]["name"]) if call["function"]["name"] in names else -1}
        for call in calls
    ]
    return {**message, "tool_calls": indexed}


def _meta_info(turn: TurnRecord) -> dict[str, Any]:
    return {
        "output_token_logprobs": [
            [float(lp), int(t)] for lp, t in zip(turn.output_logprobs, turn.output_ids, strict=True)
        ],
        "completion_tokens": len(turn.output_ids),
        "prompt_tokens": turn.prompt_tokens,
        "cached_tokens": turn.cached_tokens,
        "finish_reason": turn.finish_detail or {"type": turn.finish_reason},
        "weight_version": turn.weight_version,
    }


def records(turns: Sequence[TurnRecord], exchanges: Mapping[int, Exchange], r3: bool) -> list[dict[str, Any]]:
    """Miles' `SessionRecord`s of the last segment's turns, in order.

    A turn whose reply never reached the agent (no exchange) has no record; it is always the last of
    its segment, since the agent's next request cannot hold that reply and forks.
    """
    if not turns:
        return []
    segment = turns[-1].segment
    out: list[dict[str, Any]] = []
    messages: list[Message] = []
    tokens: list[int] = []
    for turn in turns:
        exchange = exchanges.get(turn.index)
        if turn.segment != segment or exchange is None:
            continue
        messages = [*messages, *exchange.new_messages]
        tokens = [*tokens, *turn.input_ids.tolist()]
        request: dict[str, Any] = {"messages": messages, "input_ids": tokens}
        if exchange.tools is not None:
            request["tools"] = exchange.tools
        request["sampling_params"] = exchange.sampling_params
        request["return_logprob"] = True
        if r3:
            request["return_routed_experts"] = True
            request["routed_experts_start_len"] = turn.routing_start
        sent = exchange.completion["choices"][0]
        message = _wire_message(sent["message"], exchange.tools)
        choice = {**sent, "message": message, "meta_info": _meta_info(turn)}
        out.append(
            {
                "timestamp": exchange.timestamp,
                "request_timestamp": exchange.request_timestamp,
                "method": "POST",
                "path": CHAT_PATH,
                "request": request,
                "response": {**exchange.completion, "choices": [choice]},
                "status_code": 200,
            }
        )
        messages = [*messages, sent["message"]]
        tokens = [*tokens, *turn.output_ids.tolist()]
    return out


def session_view(
    session_id: str,
    turns: Sequence[TurnRecord],
    exchanges: Mapping[int, Exchange],
    r3: bool,
    facts: dict[str, Any],
    accumulated_token_ids: Sequence[int],
) -> dict[str, Any]:
    """The `GET /sessions/{id}` body: Miles' `GetSessionResponse` shape."""
    metadata = {
        "accumulated_token_ids": list(accumulated_token_ids),
        "tree": tree_metadata(turns, exchanges),
        "session": facts,
    }
    return {"session_id": session_id, "records": records(turns, exchanges, r3), "metadata": metadata}


def tree_metadata(turns: Sequence[TurnRecord], exchanges: Mapping[int, Exchange]) -> dict[str, Any]:
    """Miles' v2 tree tables `{"nodes", "leaves"}` of a session: one node per turn, in commit order.

    rl360 re-renders a forked history into a new token sequence, so each segment is its own root
    chain (a node's `parent` is the turn before it in its segment); `completion_span` and
    `num_tokens` are in that segment's token positions. Leaves are each segment's last turn. A turn
    whose reply never reached the agent has `committed_at` and `response_id` null.
    """
    nodes: list[dict[str, Any]] = []
    last_in_segment: dict[int, dict[str, Any]] = {}
    chains: dict[int, list[int]] = {}
    for turn in turns:
        exchange = exchanges.get(turn.index)
        parent = last_in_segment.get(turn.segment)
        output_start = turn.input_start + len(turn.input_ids)
        node = {
            "id": turn.index,
            "parent": None if parent is None else parent["id"],
            "seq": turn.index,
            "truncated": turn.finish_reason == "length",
            "committed_at": None if exchange is None else exchange.timestamp,
            "completion_span": [output_start, turn.end],
            "num_tokens": turn.end,
            "response_id": None if exchange is None else exchange.completion["id"],
            "segment": turn.segment,
        }
        nodes.append(node)
        last_in_segment[turn.segment] = node
        chains.setdefault(turn.segment, []).append(turn.index)
    leaves = [{"node_id": chain[-1], "path_node_ids": chain} for _, chain in sorted(chains.items())]
    return {"nodes": nodes, "leaves": leaves}
