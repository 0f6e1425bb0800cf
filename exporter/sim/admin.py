"""The simulator's /admin endpoints: restart, change a profile, inject a fault, and the
truth of what it did (the A/B speedup at the load it ran)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from aiohttp import web

from exporter.core.counts import Counts
from exporter.sim.decoder import Payoff
from exporter.sim.profiles import Profile
from exporter.sim.state import FAULTS, json_error, state_of
from exporter.sim.wire import Json


async def restart(request: web.Request) -> web.Response:
    state_of(request).engine.restart()
    return web.json_response({"restarted": True})


async def profile(request: web.Request) -> web.Response:
    """{name, acceptance, decay?, concentration? (a number or "inf"), loop_share?}: the fields
    not given keep the profile's current values."""
    body = await request.json()
    engine = state_of(request).engine
    name = body.get("name") if isinstance(body, dict) else None
    try:
        if not isinstance(name, str) or not isinstance(body.get("acceptance"), int | float):
            raise ValueError("expected {name, acceptance, decay?, concentration?, loop_share?}")
        current = engine.profiles.get(name, Profile(name, 0.0))
        fields = {f: body.get(f, getattr(current, f)) for f in ("decay", "loop_share")}
        concentration = float(body.get("concentration", current.concentration))
        profile = Profile(name, float(body["acceptance"]), concentration=concentration, **fields)
    except (ValueError, TypeError) as exc:
        return json_error(400, str(exc), "BadRequestError")
    engine.profiles[name] = profile
    return web.json_response(profile_json(profile))


def profile_json(profile: Profile) -> Json:
    out: Json = dataclasses.asdict(profile)
    out["concentration"] = "inf" if math.isinf(profile.concentration) else profile.concentration
    return out


async def fault(request: web.Request) -> web.Response:
    """{"name": one of FAULTS, "enabled": bool, "value": seconds (slow_metrics) or chunks}"""
    body = await request.json()
    state = state_of(request)
    name = body.get("name")
    if name not in FAULTS:
        return json_error(400, f"name must be one of {', '.join(FAULTS)}", "BadRequestError")
    if body.get("enabled", True):
        state.faults[name] = float(body.get("value", 2.0 if name == "slow_metrics" else 3))
    else:
        state.faults.pop(name, None)
    if name == "spec_off":
        state.engine.set_spec("spec_off" not in state.faults)
    return web.json_response({"faults": state.faults})


async def received(request: web.Request) -> web.Response:
    """The last completion requests as the engine received them: its id for each and the
    `traceparent` it came with (null: none), oldest first: what a test checks the proxy sent."""
    return web.json_response(
        [{"id": rid, "traceparent": tp} for rid, tp in state_of(request).received]
    )


async def truth(request: web.Request) -> web.Response:
    """What the simulator really did per profile since it started (restarts included): the
    drafts, and the decode steps' tokens and seconds beside a plain step's at the same batch
    (`speedup`: the A/B truth at the load it ran; differences of two reads give a phase's),
    and the decode steps by the draft length they ran with (0: plain)."""
    engine = state_of(request).engine
    return web.json_response(
        {
            name: _truth_json(
                engine.truth.get(name, Counts()),
                engine.payoff.get(name, Payoff()),
                engine.steps.get(name, {}),
            )
            for name in sorted(engine.truth.keys() | engine.payoff.keys() | engine.steps.keys())
        }
    )


def _truth_json(c: Counts, payoff: Payoff, steps: Mapping[int, int]) -> Json:
    return {
        "steps_by_draft_length": {str(k): n for k, n in sorted(steps.items())},
        "drafts": c.drafts or 0,
        "draft_tokens": c.draft_tokens or 0,
        "accepted": c.accepted or 0,
        "per_position": list(c.per_position),
        "decode": {
            "steps": payoff.steps,
            "tokens": payoff.tokens,
            "seconds": payoff.seconds,
            "plain_seconds": payoff.plain_seconds,
            "speedup": payoff.speedup,
        },
    }
