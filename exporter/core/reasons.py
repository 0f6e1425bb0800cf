"""Why a 200 completion has no exact counts: the values of the `reason` label of
specdec_route_requests_without_spec_metrics_total. The engines say which apply to them; the
proxy's outcome adds the ones of its own making (unread, implausible)."""

N_ABOVE_1 = "n_above_1"  # vLLM sends no per-request object for n > 1 (or best_of)
NOT_SENT = "not_sent"  # no object: the engine flag is off, or a hop behind the proxy strips it
UNKNOWN_SHAPE = "unknown_shape"  # an object the proxy cannot read: left out, not guessed at
TOKENS_ONLY = "tokens_only"  # llama.cpp's timings: exact draft and accepted tokens, not steps
ENGINE_SENDS_NONE = "engine_sends_none"  # TensorRT-LLM has no per-request data on its API
IMPLAUSIBLE = "implausible"  # counts that contradict themselves or their response: refused
UNREAD = "unread"  # the response was larger than the proxy may hold: relayed unread

# the response carried no per-request object at all (what the proxy learns to estimate from)
NO_OBJECT = frozenset((NOT_SENT, TOKENS_ONLY, ENGINE_SENDS_NONE))
