"""The dashboards' PNG previews, a docs tool (docs/img/*.png, and a reviewer without Grafana):
each panel in its grid box with its live query results from a Prometheus (render.py, drawn by
draw.py in Grafana's dark theme), and a dashboard's queries with its variables substituted
against Prometheus' API (live.py; the integration tests ask it too). Outside the product
package, so the wheel ships no matplotlib code: `python3 -m harness.previews DIR --prometheus
URL` from a checkout, matplotlib installed (the `plot` or `test` extra)."""
