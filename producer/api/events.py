"""GET /runs/ID/events: Server-Sent Events of a run, resumable on any replica.

sse-starlette, not a hand-written StreamingResponse: it frames events, sends the heartbeat
comments (`ping`), notices a client that went away and stops the generator, and handles the
server's shutdown; what is left here is what the events are.

Every event's id comes from the database (storage/runs.py): a progress event's is the id of
the call whose batch it reports, the final event's is `<last call id>-<state>`. A client
that reconnects with Last-Event-ID gets the events after that call, from any replica; after
a final event it gets 204, which tells EventSource to stop reconnecting. A stream that
closes cancels nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any, AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from producer.api.context import Context
from producer.api.runs import run_view
from storage.models import FINAL_RUN_STATES, RunState
from storage.runs import RunRow

_ID_RE = re.compile(r"^(\d{1,18})(?:-([a-z]+))?$")


def parse_last_event_id(value: str | None) -> tuple[int, bool]:
    """(call id to resume after, whether the final event was seen); (0, False) for none or
    an id this server never sent (the stream then starts at the run's beginning)."""
    match = _ID_RE.match((value or "").strip())
    if not match:
        return 0, False
    return int(match.group(1)), match.group(2) in FINAL_RUN_STATES


def stream(ctx: Context, run: RunRow, last_event_id: str | None) -> Response:
    cursor, ended = parse_last_event_id(last_event_id)
    if ended:
        return Response(status_code=204)
    return EventSourceResponse(_events(ctx, run, cursor), ping=ctx.settings.api_sse_heartbeat_s,
                               headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _events(ctx: Context, run: RunRow, cursor: int) -> AsyncIterator[ServerSentEvent]:
    store = ctx.store
    settle_by = time.monotonic() + ctx.settings.call_timeout_s + ctx.settings.lease_s
    paused = None  # the pause last announced
    while True:
        # The state first, then the events: a final state read before them means every
        # batch it counts is in the events' later snapshot.
        view: dict[str, Any] = await run_in_threadpool(run_view, ctx, run)
        final = view["state"] in FINAL_RUN_STATES
        if final and view["state"] == RunState.cancelled.value:
            if time.monotonic() < settle_by and \
                    await run_in_threadpool(store.calls_in_flight, run):
                # A cancelled run's calls in flight are let finish (their holders keep their
                # leases until the replies are stored), so the final event waits until they
                # have settled (for as long as a call can take and a crashed holder's lease
                # can last): its cost is then final, and the stream reads the same whenever
                # read.
                final = False
            else:
                # Read again now that nothing is in flight: a call that settled between the
                # first read and the count stored its questions after that read.
                view = await run_in_threadpool(run_view, ctx, run)
        events = await run_in_threadpool(store.run_events, run, cursor, final,
                                         view["questions"]["target"])
        for e in events:
            cursor = e.id
            yield ServerSentEvent(event="progress", id=str(e.id), data=json.dumps(
                {"done": e.done, "target": e.target, "cost_usd": e.cost_usd,
                 "spent_usd": e.spent_usd, "budget_usd": view["budget_usd"],
                 "state": RunState.running.value}))
        if view["state"] == RunState.paused.value and not final:
            if paused != view["pause_reason"]:
                # Said once per pause (the stream stays open: a pause is lifted by a new run
                # or `resume`); its id is the last batch's, so a reconnect misses nothing.
                paused = view["pause_reason"]
                yield ServerSentEvent(event="progress", id=f"{cursor}-paused", data=json.dumps(
                    {**view["questions"], "cost_usd": view["cost_usd"],
                     "spent_usd": view["spent_usd"], "budget_usd": view["budget_usd"],
                     "state": RunState.paused.value, "pause_reason": paused,
                     "pause_code": view.get("pause_code")}))
        else:
            paused = None
        if final:
            last = await run_in_threadpool(store.last_call_id, run)
            # The run's own last call, never the client's Last-Event-ID (which may name a
            # call this run never made): every reader gets the same final id.
            yield ServerSentEvent(event=view["state"], id=f"{last}-{view['state']}",
                                  data=json.dumps(view))
            return
        await asyncio.sleep(ctx.settings.api_sse_poll_s)
