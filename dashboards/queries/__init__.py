"""Named PromQL definitions, shared by recording rules, alerts, panels and the cookbook."""
