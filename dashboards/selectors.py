"""One place for the label sets every query aggregates by."""

ROUTE = ("route", "model_name")
ROUTE_POSITION = ("route", "model_name", "position")
ENGINE = ("model_name", "engine")
ENGINE_POSITION = ("model_name", "engine", "position")
RULE_WINDOWS = ("1m", "5m", "1h")
