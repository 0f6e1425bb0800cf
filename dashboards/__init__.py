"""Rules, alerts and dashboards as code: one PromQL definition serves recording rules, panels
and the cookbook alike (queries/), kept apart from layout."""
