"""The label sets every query aggregates by, and the windows rules are recorded over: one
place each."""

ROUTE = ("route", "model_name")
ENGINE = ("model_name", "engine")
RULE_WINDOWS = ("1m", "5m", "1h")
