"""One place for the label sets every query aggregates by."""

ROUTE = ("route", "model_name")
ENGINE = ("model_name", "engine")
RULE_WINDOWS = ("1m", "5m", "1h")
