"""The Grafana dashboards as grafanalib sources (one module per board, on panels.py's building
blocks and variables.py's template variables), built to JSON by build.py."""
