"""The monitoring mixin, laid out as kubernetes-mixin is: one config (config.py: selectors,
thresholds, `for:` durations, the dashboards' uid, tags and data source), and beside it the
alerts (alerts.py), the recording rules (rules.py) and the Grafana boards (boards/), all built
from one set of PromQL definitions (queries/), which the cookbook shows too. cli.py gives
`specdec rules` and `specdec dashboards`; the generated files are deploy/prometheus/rules/*.yml
and dashboards/*.json."""
